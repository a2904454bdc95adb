"""The one conformance suite every ``Executor`` runs (DESIGN section 8).

A substrate plugs in by implementing ``ExecutorSubject``: the executor under test, and how
to build a call of each behaviour the suite needs on that substrate (a tool whose call
answers, one the tool refuses, one whose own machinery fails, one that never ends by
itself), plus the escape attempts its confinement must stop. A pytest fixture named
``subject`` yields it, and a test class inherits the suite::

    from lodger.testing.executor_conformance import ExecutorConformance

    @pytest.fixture
    def subject(tmp_path):
        return MySubject(tmp_path)

    class TestMyExecutor(ExecutorConformance): ...

What every executor must do, whatever runs the work:
- return how a call ended as an ``Execution``, never raise for the tool's faults: a
  refusal (``ToolCallError``) is an error result with its message, an unexpected
  exception of the tool or of the substrate is an error result naming it, and so is a
  ``KeyboardInterrupt``, ``SystemExit`` or ``GeneratorExit`` the tool raises (only a
  signal to lodger stops lodger, and it arrives as a cancellation);
- end a call that overruns its time limit within the limit and a grace, as ``timed_out``;
- when its caller is cancelled, stop the work, settle, and say ``cancelled``, without
  swallowing the cancellation (the pipeline records T2, then lets it go on);
- keep concurrent calls apart;
- be the executor the pipeline selects for the tools it serves (``Executors``);
- stop every escape attempt the subject names (the sandbox's battery, a cell's globals).

Shipped with lodger, like the log and control-plane suites, so a third-party substrate (a
microVM, a remote runner) runs the same checks; lodger's own run it in ``tests/substrates``.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lodger.substrates.select import Executors
from lodger.tools.spec import Execution, Executor, Tool, ToolContext

__all__ = ["EscapeAttempt", "ExecutorConformance", "ExecutorSubject", "SubjectCall"]

#: a hang guard, not a speed bound: an executor that never settles fails instead of hanging
_GUARD_S = 60.0


@dataclass(frozen=True, kw_only=True)
class SubjectCall:
    """A tool on the subject's substrate and the arguments of one call of it."""

    tool: Tool
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class EscapeAttempt:
    """A call that tries to leave the substrate's confinement, and how to tell it did:
    ``escaped`` reads the execution and the host after the call has ended."""

    name: str
    call: SubjectCall
    escaped: Callable[[Execution], bool]


class ExecutorSubject(abc.ABC):
    """One substrate as the suite drives it."""

    #: whether an answering call is handed off (remote work: no T2 now) or ends here
    suspends: bool = False
    #: the time limit the suite gives calls that must stop (seconds)
    time_limit: float = 0.5

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        workspace.mkdir(parents=True, exist_ok=True)

    @property
    @abc.abstractmethod
    def executor(self) -> Executor:
        """The executor under test."""

    @abc.abstractmethod
    def answering(self, text: str) -> SubjectCall:
        """A call that ends well and whose result contains ``text``."""

    @abc.abstractmethod
    def refusing(self, message: str) -> SubjectCall:
        """A call the tool refuses, or fails in a way the model can act on, saying
        ``message`` (a ``ToolCallError``, a cell that throws)."""

    @abc.abstractmethod
    def crashing(self, message: str) -> SubjectCall:
        """A call whose own code or substrate raises unexpectedly with ``message``."""

    @abc.abstractmethod
    def raising(self, error: BaseException) -> SubjectCall:
        """A call whose own code raises ``error`` itself: a ``KeyboardInterrupt``, a
        ``SystemExit`` or a ``GeneratorExit`` (a tool's, or its substrate's, not a signal)."""

    @abc.abstractmethod
    def hanging(self) -> tuple[SubjectCall, Callable[[], Awaitable[None]]]:
        """A call that never ends by itself, and a wait that returns once it runs."""

    def escape_attempts(self) -> Sequence[EscapeAttempt]:
        """What the substrate's confinement must stop (none for work in this process)."""
        return ()

    def context(self, call_id: str = "call-1") -> ToolContext:
        """The context one call runs in: the subject's workspace, its state dir hidden."""
        return ToolContext(
            session_id="conformance",
            turn_id="turn-1",
            run_id="run-1",
            call_id=call_id,
            operation_id=f"op-{call_id}",
            workspace=self.workspace,
            hidden=(self.workspace / ".lodger",),
        )


async def _execute(
    subject: ExecutorSubject,
    call: SubjectCall,
    *,
    time_limit: float = _GUARD_S,
    call_id: str = "call-1",
) -> Execution:
    async with asyncio.timeout(time_limit + _GUARD_S):
        return await subject.executor.execute(
            tool=call.tool,
            arguments=dict(call.arguments),
            context=subject.context(call_id),
            time_limit=time_limit,
        )


#: what a tool may raise that is not an ``Exception``, besides a cancellation of its own
_EXITS: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit, GeneratorExit)


def _on_a_loop_of_its_own(subject: ExecutorSubject, call: SubjectCall) -> Execution | BaseException:
    """Execute ``call`` on a new event loop in this thread: its execution, or what
    stopped the loop."""
    try:
        return asyncio.run(_execute(subject, call))
    except BaseException as exc:  # noqa: BLE001 - what escaped is the finding
        return exc


class ExecutorConformance:
    async def test_a_call_returns_its_result(self, subject: ExecutorSubject) -> None:
        execution = await _execute(subject, subject.answering("conformance answer 42"))
        assert isinstance(execution, Execution)
        assert execution.status == "ok", execution
        assert "conformance answer 42" in execution.content
        assert execution.suspended is subject.suspends

    async def test_a_refusal_is_an_error_result_with_its_message(
        self, subject: ExecutorSubject
    ) -> None:
        execution = await _execute(subject, subject.refusing("refused: the path is outside"))
        assert execution.status == "error", execution
        assert "refused: the path is outside" in execution.content
        assert not execution.suspended

    async def test_an_exception_is_the_tools_error_result_and_never_raises(
        self, subject: ExecutorSubject
    ) -> None:
        execution = await _execute(subject, subject.crashing("conformance crash 7"))
        assert execution.status == "error", execution
        assert "conformance crash 7" in execution.content
        assert not execution.suspended

    @pytest.mark.parametrize("kind", _EXITS, ids=lambda kind: kind.__name__)
    async def test_an_exit_the_tool_raises_is_its_error_result_and_the_loop_goes_on(
        self, subject: ExecutorSubject, kind: type[BaseException]
    ) -> None:
        error = kind(3) if kind is SystemExit else kind()
        # on a loop of its own: an exit that escaped would stop that loop (asyncio
        # re-raises KeyboardInterrupt and SystemExit from a task), not the test session
        call = subject.raising(error)
        outcome = await asyncio.to_thread(_on_a_loop_of_its_own, subject, call)
        assert isinstance(outcome, Execution), f"the loop was stopped by {outcome!r}"
        assert outcome.status == "error", outcome
        assert type(error).__name__ in outcome.content, outcome
        assert not outcome.suspended

    async def test_a_call_past_its_time_limit_settles_timed_out(
        self, subject: ExecutorSubject
    ) -> None:
        call, _ = subject.hanging()
        execution = await _execute(subject, call, time_limit=subject.time_limit)
        assert execution.status == "timed_out", execution
        assert not execution.suspended

    async def test_a_cancelled_call_stops_settles_and_keeps_the_cancellation(
        self, subject: ExecutorSubject
    ) -> None:
        call, started = subject.hanging()
        pending: list[int] = []

        async def caller() -> Execution:
            execution = await _execute(subject, call)
            task = asyncio.current_task()
            assert task is not None
            pending.append(task.cancelling())  # the request is still there, not swallowed
            return execution

        task = asyncio.create_task(caller())
        async with asyncio.timeout(_GUARD_S):
            await started()
        task.cancel()
        await asyncio.wait({task}, timeout=_GUARD_S)
        assert task.done(), "the execution did not settle after its caller was cancelled"
        assert not task.cancelled(), "the execution raised instead of saying how it ended"
        execution = task.result()
        assert execution.status == "cancelled", execution
        assert pending == [1]

    async def test_concurrent_calls_are_kept_apart(self, subject: ExecutorSubject) -> None:
        texts = [f"concurrent answer {i}" for i in range(3)]
        executions = await asyncio.gather(
            *(
                _execute(subject, subject.answering(text), call_id=f"call-{i}")
                for i, text in enumerate(texts)
            )
        )
        for text, execution in zip(texts, executions, strict=True):
            assert execution.status == "ok", execution
            assert text in execution.content
            assert all(other not in execution.content for other in texts if other != text)

    def test_the_pipeline_selects_this_executor_for_its_tools(
        self, subject: ExecutorSubject
    ) -> None:
        for call in (subject.answering("x"), subject.refusing("x"), subject.hanging()[0]):
            assert type(Executors().for_tool(call.tool)) is type(subject.executor)
        mounted = _Recording(subject.executor)
        kind = "in_process" if call.tool.substrate is None else call.tool.substrate.kind
        assert Executors(mounts={kind: mounted}).for_tool(call.tool) is mounted

    async def test_every_escape_attempt_is_stopped(self, subject: ExecutorSubject) -> None:
        escaped: list[tuple[str, str]] = []
        for attempt in subject.escape_attempts():
            execution = await _execute(subject, attempt.call)
            if attempt.escaped(execution):
                escaped.append((attempt.name, execution.content[:500]))
        assert escaped == []


class _Recording:
    """An executor mounted in place of another (what a host does for a microVM)."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner

    async def execute(
        self, *, tool: Tool, arguments: dict[str, Any], context: ToolContext, time_limit: float
    ) -> Execution:
        return await self.inner.execute(
            tool=tool, arguments=arguments, context=context, time_limit=time_limit
        )

"""Every Executor through the one conformance suite (``lodger.testing.executor_conformance``):
in process, a sandboxed process (real bubblewrap; gVisor in the slow lane), a code cell
(real V8 through mini-racer, real Monty) and remote work."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import socket
import types
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from lodger.errors import ToolCallError
from lodger.events import ToolDispatched
from lodger.substrates.codemode import CellLimits, exec_tool
from lodger.substrates.codemode._host import CellHost
from lodger.substrates.codemode.executor import CellExecutor
from lodger.substrates.codemode.substrate import CellOutcome, CellSubstrate
from lodger.substrates.inprocess import InProcessExecutor
from lodger.substrates.remote import RemoteExecutor, RemoteWork
from lodger.substrates.sandbox import (
    BubblewrapSandbox,
    Limits,
    RunscSandbox,
    Sandbox,
    SandboxPolicy,
    SandboxResult,
)
from lodger.substrates.sandboxed import ProcessCommand, SandboxExecutor, sandboxed
from lodger.substrates.shell import _settled
from lodger.testing.executor_conformance import (
    EscapeAttempt,
    ExecutorConformance,
    ExecutorSubject,
    SubjectCall,
)
from lodger.tools import Tool, ToolContext, tool
from lodger.tools.spec import Execution, Executor, NestedResult, ProbeResult, Suspended


async def _until(done: Callable[[], bool]) -> None:
    while not done():  # noqa: ASYNC110 - waiting for a positive sign from a process
        await asyncio.sleep(0.01)


# ---------------------------------------------------------------- in process


class InProcess(ExecutorSubject):
    @property
    def executor(self) -> Executor:
        return InProcessExecutor(grace=0.5)

    def answering(self, text: str) -> SubjectCall:
        @tool
        async def answer() -> str:
            """Answer."""
            await asyncio.sleep(0)
            return text

        return SubjectCall(tool=answer)

    def refusing(self, message: str) -> SubjectCall:
        @tool
        def refuse() -> str:
            """Refuse."""
            raise ToolCallError(message)

        return SubjectCall(tool=refuse)

    def crashing(self, message: str) -> SubjectCall:
        @tool
        async def crash() -> str:
            """Crash."""
            raise RuntimeError(message)

        return SubjectCall(tool=crash)

    def raising(self, error: BaseException) -> SubjectCall:
        @tool
        async def exit_() -> str:
            """Raise after a wait (in the call's task, not its first step)."""
            await asyncio.sleep(0)
            raise error

        return SubjectCall(tool=exit_)

    def hanging(self) -> tuple[SubjectCall, Callable[[], Awaitable[None]]]:
        running = asyncio.Event()

        @tool
        async def hang() -> str:
            """Never end."""
            running.set()
            await asyncio.Event().wait()
            return "never"

        return SubjectCall(tool=hang), running.wait


# ---------------------------------------------------------------- sandboxed process


class _BrokenBackend:
    """A backend whose machinery fails (what a crashed runtime or a bad host does)."""

    name = "broken"

    def __init__(self, message: str) -> None:
        self.message = message

    def unavailable(self) -> str | None:
        return None

    async def run(self, argv: Sequence[str], **kw: Any) -> SandboxResult:
        raise OSError(self.message)


class Sandboxed(ExecutorSubject):
    """Commands in a real sandbox; its escape battery is the cheap part of tests/sandbox's."""

    def __init__(self, workspace: Path, box: Sandbox, *, secret: str, port: int) -> None:
        super().__init__(workspace)
        self.box = box
        self.secret = secret
        self.port = port
        self.policy = SandboxPolicy(
            backend="runsc" if isinstance(box, RunscSandbox) else "bubblewrap",
            limits=Limits(wall_time_s=30, memory_bytes=256 << 20, max_processes=64),
        )

    @property
    def executor(self) -> Executor:
        return SandboxExecutor(grace=1.0)

    def command(
        self,
        script: str,
        *,
        refuse: str | None = None,
        box: Sandbox | None = None,
        raising: BaseException | None = None,
    ) -> SubjectCall:
        @tool(name="sh")
        def describe(ctx: ToolContext) -> ProcessCommand:
            """Run the script."""
            if refuse is not None:
                raise ToolCallError(refuse)
            if raising is not None:
                raise raising  # on the tool's worker thread
            root = ctx.require_workspace()
            return ProcessCommand(argv=("bash", "-c", script), workspace=root, timeout_s=3600)

        t = sandboxed(describe, policy=self.policy, settle=_settled, sandbox=box or self.box)
        return SubjectCall(tool=t)

    def answering(self, text: str) -> SubjectCall:
        return self.command(f"echo '{text}'")

    def refusing(self, message: str) -> SubjectCall:
        return self.command("touch ran", refuse=message)

    def crashing(self, message: str) -> SubjectCall:
        return self.command("true", box=_BrokenBackend(message))  # type: ignore[arg-type]

    def raising(self, error: BaseException) -> SubjectCall:
        return self.command("touch ran", raising=error)

    def hanging(self) -> tuple[SubjectCall, Callable[[], Awaitable[None]]]:
        marker = self.workspace / f"started-{uuid.uuid4().hex}"
        call = self.command(f"touch {marker.name}; exec sleep 600")
        return call, lambda: _until(marker.exists)

    def escape_attempts(self) -> Sequence[EscapeAttempt]:
        state = self.workspace / ".lodger"
        state.mkdir(exist_ok=True)
        (state / "log").write_text(f"{self.secret}\n")
        (self.workspace.parent / "outside.txt").write_text(f"{self.secret}\n")
        system = Path("/usr") / f"lodger-escape-{uuid.uuid4().hex}"
        probe = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {self.port}), timeout=3)\n"
            "    print('CONNECTED')\n"
            "except OSError as e:\n"
            "    print('refused', e)\n"
        )
        return [
            EscapeAttempt(
                name="the state directory",
                call=self.command(f"cat .lodger/log; cat {state}/log; ls -a {state}"),
                escaped=lambda e: self.secret in e.content,
            ),
            EscapeAttempt(
                name="a file outside the workspace, by .. and by its path",
                call=self.command(f"cat ../outside.txt; cat {self.workspace.parent}/outside.txt"),
                escaped=lambda e: self.secret in e.content,
            ),
            EscapeAttempt(
                name="a write to the system",
                call=self.command(f"echo pwned > {system}; echo done"),
                escaped=lambda e: system.exists(),
            ),
            EscapeAttempt(
                name="the host's credentials in the environment",
                call=self.command("env; cat /proc/self/environ"),
                escaped=lambda e: self.secret in e.content,
            ),
            EscapeAttempt(
                name="a repository for the host's git to trust",
                call=self.command("git init -q . && git config core.fsmonitor 'touch ran'"),
                escaped=lambda e: (self.workspace / ".git" / "config").exists(),
            ),
            EscapeAttempt(
                name="a server on the host's loopback",
                call=self.command(f"python3 - <<'EOF'\n{probe}EOF"),
                escaped=lambda e: "CONNECTED" in e.content or "refused" not in e.content,
            ),
        ]


# ---------------------------------------------------------------- code cells


class _Nested:
    """The nested caller a cell runs over, backed by plain functions (no pipeline)."""

    def __init__(self, tools: Mapping[str, Callable[[dict[str, Any]], Awaitable[str]]]) -> None:
        self.functions = dict(tools)

    def _tool(self, name: str) -> Tool:
        async def handler(arguments: dict[str, Any], ctx: ToolContext) -> str:
            return await self.functions[name](arguments)

        return Tool(
            name=name, description=name, parameters={"type": "object"}, handler=handler,
            nestable=True,
        )  # fmt: skip

    def callable_tools(self) -> list[Tool]:
        return [self._tool(name) for name in self.functions]

    def tool(self, name: str) -> Tool | None:
        return self._tool(name) if name in self.functions else None

    def bound_names(self) -> list[str]:
        return list(self.functions)

    async def call(self, name: str, arguments: dict[str, Any]) -> NestedResult:
        content = await self.functions[name](arguments)
        return NestedResult(call_id=f"nested-{name}", status="ok", content=json.dumps(content))


class _BrokenRunner:
    """An interpreter that fails (a crashed worker pool, a broken binding)."""

    language = "javascript"

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def run(self, source: str, host: CellHost, limits: CellLimits) -> CellOutcome:
        await asyncio.sleep(0)
        raise self.error

    async def aclose(self) -> None:
        pass


class Cells(ExecutorSubject):
    def __init__(self, workspace: Path, language: str) -> None:
        super().__init__(workspace)
        self.language = language
        self.running = asyncio.Event()
        self.nested = _Nested({"started": self._started})

    async def _started(self, arguments: dict[str, Any]) -> str:
        self.running.set()
        return "ok"

    @property
    def executor(self) -> Executor:
        return CellExecutor(grace=1.0)

    def context(self, call_id: str = "call-1") -> ToolContext:
        base = super().context(call_id)
        return ToolContext(
            session_id=base.session_id, turn_id=base.turn_id, run_id=base.run_id,
            call_id=call_id, operation_id=base.operation_id, workspace=base.workspace,
            hidden=base.hidden, nested=self.nested,
        )  # fmt: skip

    def cell(self, js: str, py: str, *, runner: CellSubstrate | None = None) -> SubjectCall:
        exec_ = exec_tool(
            [],
            language="javascript" if self.language == "javascript" else "python",
            limits=CellLimits(wall_time=30),
            substrate=runner,
        )
        return SubjectCall(
            tool=exec_, arguments={"code": js if self.language == "javascript" else py}
        )

    def answering(self, text: str) -> SubjectCall:
        return self.cell(f"return {json.dumps(text)};", json.dumps(text))

    def refusing(self, message: str) -> SubjectCall:
        return self.cell(
            f"throw new Error({json.dumps(message)});", f"raise ValueError({message!r})"
        )

    def crashing(self, message: str) -> SubjectCall:
        return self.cell("return 1;", "1", runner=_BrokenRunner(RuntimeError(message)))

    def raising(self, error: BaseException) -> SubjectCall:
        return self.cell("return 1;", "1", runner=_BrokenRunner(error))

    def hanging(self) -> tuple[SubjectCall, Callable[[], Awaitable[None]]]:
        call = self.cell(
            "await tools.started({}); while (true) {}",
            "await started()\nwhile True:\n    pass",
        )
        return call, self.running.wait

    def escape_attempts(self) -> Sequence[EscapeAttempt]:
        if self.language == "javascript":
            names = ["require", "process", "fetch", "XMLHttpRequest", "WebAssembly", "setTimeout"]
            probe = "return [" + ", ".join(f"typeof {n}" for n in names) + "];"
            return [
                EscapeAttempt(
                    name="the host's globals",
                    call=self.cell(probe, ""),
                    escaped=lambda e: json.loads(e.content).get("result") != ["undefined"] * 6,
                )
            ]
        return [
            EscapeAttempt(
                name=f"import {module}",
                call=self.cell("", f"import {module}\n{module}.__name__"),
                escaped=lambda e: e.status == "ok",
            )
            for module in ("os", "subprocess", "socket")
        ]


# ---------------------------------------------------------------- remote work


async def _probe(dispatched: ToolDispatched, ctx: ToolContext) -> ProbeResult:
    return ProbeResult(applied=None, pending=True, observation="still running elsewhere")


class Remote(ExecutorSubject):
    suspends = True

    @property
    def executor(self) -> Executor:
        return RemoteExecutor(grace=0.5)

    def _remote(
        self, handler: Callable[[dict[str, Any], ToolContext], Awaitable[Any]]
    ) -> SubjectCall:
        t = Tool(
            name="job", description="Run a job elsewhere.", parameters={"type": "object"},
            handler=handler, recovery="queryable", probe=_probe, substrate=RemoteWork(),
        )  # fmt: skip
        return SubjectCall(tool=t)

    def answering(self, text: str) -> SubjectCall:
        async def hand_off(arguments: dict[str, Any], ctx: ToolContext) -> Suspended:
            return Suspended(reason=text)

        return self._remote(hand_off)

    def refusing(self, message: str) -> SubjectCall:
        async def hand_off(arguments: dict[str, Any], ctx: ToolContext) -> Suspended:
            raise ToolCallError(message)

        return self._remote(hand_off)

    def crashing(self, message: str) -> SubjectCall:
        async def hand_off(arguments: dict[str, Any], ctx: ToolContext) -> Suspended:
            raise ConnectionResetError(message)

        return self._remote(hand_off)

    def raising(self, error: BaseException) -> SubjectCall:
        async def hand_off(arguments: dict[str, Any], ctx: ToolContext) -> Suspended:
            raise error

        return self._remote(hand_off)

    def hanging(self) -> tuple[SubjectCall, Callable[[], Awaitable[None]]]:
        running = asyncio.Event()

        async def hand_off(arguments: dict[str, Any], ctx: ToolContext) -> Suspended:
            running.set()
            await asyncio.Event().wait()  # the service never answers
            return Suspended(reason="never")

        return self._remote(hand_off), running.wait


# ---------------------------------------------------------------- the wiring


def _backends() -> list[Any]:
    return [
        pytest.param("in_process"),
        pytest.param("bubblewrap"),
        pytest.param("runsc", marks=pytest.mark.slow),
        pytest.param("javascript"),
        pytest.param("python"),
        pytest.param("remote"),
    ]


@pytest.fixture
def loopback() -> Iterator[int]:
    """A TCP server on the host's loopback that accepts connections (unanswered)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


@pytest.fixture(params=_backends())
def subject(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    loopback: int,
    monkeypatch: pytest.MonkeyPatch,
) -> ExecutorSubject:
    name = request.param
    workspace = tmp_path / "ws"
    if name in ("bubblewrap", "runsc"):
        executable = {"bubblewrap": "bwrap", "runsc": "runsc"}[name]
        assert shutil.which(executable), f"{executable} is not installed: run scripts/install.sh"
        secret = f"lodger-secret-{uuid.uuid4().hex}"
        monkeypatch.setenv("LODGER_CONFORMANCE_API_TOKEN", secret)
        box: Sandbox = BubblewrapSandbox() if name == "bubblewrap" else RunscSandbox()
        return Sandboxed(workspace, box, secret=secret, port=loopback)
    if name in ("javascript", "python"):
        return Cells(workspace, name)
    if name == "remote":
        return Remote(workspace)
    return InProcess(workspace)


class TestExecutors(ExecutorConformance):
    pass


# ---------------------------------------------------------------- what the suite cannot say


def test_the_loopback_probe_reaches_the_server_outside_a_sandbox(loopback: int) -> None:
    """The loopback escape attempt is not vacuous: on the host, it connects."""
    socket.create_connection(("127.0.0.1", loopback), timeout=3).close()
    assert os.environ.get("LODGER_CONFORMANCE_API_TOKEN") is None


async def test_a_remote_hand_off_from_inside_a_code_cell_is_an_error(tmp_path: Path) -> None:
    remote = Remote(tmp_path / "ws")
    call = remote.answering("handed off")
    nested = ToolContext(
        session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o",
        parent_call_id="cell-1",
    )  # fmt: skip
    execution = await remote.executor.execute(
        tool=call.tool, arguments={}, context=nested, time_limit=5
    )
    assert execution == Execution(
        "error",
        "job handed its work off from inside a code cell, which cannot wait for it "
        "(handed off); call job as a call of its own",
    )


def test_remote_work_must_be_settled_by_a_probe() -> None:
    from lodger.errors import UsageError

    with pytest.raises(UsageError, match="not queryable"):
        Tool(
            name="job", description="", parameters={"type": "object"},
            handler=_probe,  # type: ignore[arg-type]
            substrate=RemoteWork(),
        )  # fmt: skip


async def test_a_sandboxed_call_stopped_at_its_own_timeout_is_the_tools_result(
    tmp_path: Path,
) -> None:
    """The timeout the call asked for (``timeout_s``) is the tool's own answer, an error
    result naming it; only the call's time limit makes it ``timed_out``."""
    from lodger.substrates.shell import shell_tool

    ws = tmp_path / "ws"
    ws.mkdir()
    ctx = ToolContext(
        session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o", workspace=ws
    )
    shell = shell_tool()
    own = await SandboxExecutor().execute(
        tool=shell, arguments={"command": "exec sleep 600", "timeout_s": 0.3}, context=ctx,
        time_limit=60,
    )  # fmt: skip
    assert own.status == "error" and "[timed out after 0.3 s;" in own.content
    limited = await SandboxExecutor().execute(
        tool=shell, arguments={"command": "exec sleep 600", "timeout_s": 60}, context=ctx,
        time_limit=0.3,
    )  # fmt: skip
    assert limited.status == "timed_out" and "[timed out after 0.3 s;" in limited.content


def _alone(work: Callable[[], Awaitable[Execution]]) -> Execution | BaseException:
    """``work`` on a loop of its own: its execution, or what stopped that loop."""

    async def main() -> Execution:
        return await work()

    try:
        return asyncio.run(main())
    except BaseException as exc:  # noqa: BLE001 - what escaped is the finding
        return exc


async def test_an_exit_in_a_sandboxed_tools_settle_is_its_error_result(tmp_path: Path) -> None:
    """``settle`` is the tool's own code too, run after the sandbox: its exit is its result."""
    subject = Sandboxed(tmp_path / "ws", BubblewrapSandbox(), secret="s", port=1)

    def settle(result: SandboxResult, wall_time_s: float) -> str:
        raise KeyboardInterrupt("from settle")

    t = subject.command("true").tool
    t = t.with_options(substrate=dataclasses.replace(t.substrate, settle=settle))

    async def run() -> Execution:
        return await SandboxExecutor().execute(
            tool=t, arguments={}, context=subject.context(), time_limit=30
        )

    outcome = await asyncio.to_thread(_alone, run)
    assert outcome == Execution("error", _interrupt_text("sh", "from settle")), outcome


def _interrupt_text(name: str, detail: str) -> str:
    return (
        f"{name} failed: KeyboardInterrupt: {detail}; "
        "raised by the tool, it failed the call and the run goes on"
    )


async def test_a_cancellation_the_tool_raises_itself_still_ends_it_cancelled(
    tmp_path: Path,
) -> None:
    """Containing exits leaves cancellation as it was: a ``CancelledError`` passes."""

    @tool
    async def gives_up() -> str:
        """Raises CancelledError itself."""
        await asyncio.sleep(0)
        raise asyncio.CancelledError

    execution = await InProcessExecutor().execute(
        tool=gives_up, arguments={}, context=InProcess(tmp_path).context(), time_limit=30
    )
    assert execution.status == "cancelled", execution


def test_a_contained_coroutine_closed_midway_closes() -> None:
    """``GeneratorExit`` thrown in to close the work is not turned into a result."""
    from lodger.substrates.inprocess import contained

    @types.coroutine
    def suspend() -> Generator[None, None, None]:
        yield

    async def work() -> str:
        await suspend()
        return "never"

    coro = contained(work())
    coro.send(None)  # suspended
    coro.close()  # raises RuntimeError if the GeneratorExit were swallowed or replaced
    assert coro.cr_frame is None

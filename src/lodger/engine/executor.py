"""Execution substrates: where a dispatched call's handler runs.

The pipeline hands a tool, its validated arguments and its context to an ``Executor``
and gets back how it ended, as a value. ``InProcessExecutor`` runs the handler as a task
of this event loop (sync tools are on a worker thread already); a sandboxed process and
a code-cell interpreter implement the same interface.

Every execution has a time limit. At the limit the call is told to stop and gets a short
grace period to settle: an async tool stops at its next await; a sync tool's thread
cannot be stopped, so if it is still running after the grace it is abandoned and the
result says its effect is unknown. A stop from outside (Ctrl-C, SIGTERM) waits for the
call to settle and records what it did; a second stop abandons a worker thread.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Protocol

from lodger.engine.eager import start_eagerly
from lodger.errors import ToolCallError
from lodger.events import ResultStatus
from lodger.tools.spec import Suspended, Tool, ToolContext, ToolOutput, WorkerAbandoned

__all__ = ["DEFAULT_TIMEOUT", "STOP_GRACE", "Execution", "Executor", "InProcessExecutor"]

DEFAULT_TIMEOUT = 600.0
"""Seconds a call may run when neither the tool nor the run sets a limit."""

STOP_GRACE = 2.0
"""Seconds a call that hit its time limit gets to settle before its worker is abandoned."""


@dataclass(frozen=True, slots=True)
class Execution:
    status: ResultStatus
    content: str
    #: the handler handed its work off (``Suspended``): no T2 now, the run ends waiting
    suspended: bool = False


class Executor(Protocol):
    async def execute(
        self, t: Tool, arguments: dict[str, Any], ctx: ToolContext, *, time_limit: float
    ) -> Execution:
        """Run ``t`` to the end and say how it ended; never raises for the tool's faults.

        Cancellation of the caller stops the execution, which then settles and says what
        happened (the pipeline records it in T2 before the cancellation goes on).
        """
        ...


class InProcessExecutor:
    """Runs the handler as a task of this loop, under a time limit."""

    def __init__(self, *, grace: float = STOP_GRACE) -> None:
        self.grace = grace

    async def execute(
        self, t: Tool, arguments: dict[str, Any], ctx: ToolContext, *, time_limit: float
    ) -> Execution:
        # Started at once, in a context of its own: a handler that finishes without
        # waiting (most async tools) needs no task and no trip through the event loop.
        task = start_eagerly(_guarded(t, arguments, ctx))
        stopped_by: str | None = None
        try:
            if not await _done_within(task, time_limit):
                stopped_by = "time_limit"
                task.cancel()
                if not await _done_within(task, self.grace):
                    task.cancel()  # a second stop: a worker thread is abandoned
                    await asyncio.wait({task})
        except asyncio.CancelledError:
            # Stopped from outside: the call settles, and what it did is the result.
            stopped_by = "cancelled"
            task.cancel()
            while not task.done():
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    task.cancel()  # asked again: give up on a worker thread
                except BaseException:  # noqa: BLE001 - read from the task below
                    break
        return _outcome(t, task, stopped_by, time_limit)


async def _done_within(task: asyncio.Future[Any], seconds: float) -> bool:
    """Wait until ``task`` is done or ``seconds`` passed; whether it is done.

    What ``asyncio.wait({task}, timeout=...)`` does for one task, without its sets and
    extra callbacks (this wait is on every call's path)."""
    if task.done():
        return True
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    task.add_done_callback(wake)
    timer = loop.call_later(seconds, wake)
    try:
        await waiter
    finally:
        timer.cancel()
        task.remove_done_callback(wake)
    return task.done()


class _ToolExited(Exception):
    def __init__(self, code: object) -> None:
        super().__init__(code)
        self.code = code


async def _guarded(t: Tool, arguments: dict[str, Any], ctx: ToolContext) -> Any:
    # SystemExit raised in a task would stop the whole event loop: it ends the call only
    try:
        return await t.handler(dict(arguments), ctx)
    except SystemExit as exc:
        raise _ToolExited(exc.code) from None


def _outcome(t: Tool, task: asyncio.Future[Any], stopped_by: str | None, limit: float) -> Execution:
    if task.cancelled():
        if stopped_by == "time_limit":
            return Execution(
                "timed_out",
                f"{t.name} did not finish within {limit:g} s and was stopped; "
                "its effect may be partial",
            )
        return Execution(
            "cancelled", f"{t.name} was cancelled while running; its effect may be partial"
        )
    error = task.exception()
    if isinstance(error, WorkerAbandoned):
        why = f"did not finish within {limit:g} s" if stopped_by == "time_limit" else "was stopped"
        return Execution(
            "timed_out" if stopped_by == "time_limit" else "interrupted",
            f"{t.name} {why}; its worker thread could not be stopped and was left running, "
            "so its effect is unknown",
        )
    if error is not None:
        return _failure(t, error)
    value = task.result()
    execution = _success(t, value)
    if execution.suspended:
        return execution  # handed off even if stopped meanwhile: the probe settles it
    if stopped_by == "time_limit":
        # it finished in the grace period after the limit: the effect happened
        return Execution(
            "timed_out", f"{t.name} finished only after its {limit:g} s limit: " + execution.content
        )
    return execution


def _failure(t: Tool, error: BaseException) -> Execution:
    if isinstance(error, ToolCallError):
        return Execution("error", str(error))  # the message and its hint: for the model
    if isinstance(error, SystemExit | _ToolExited):  # sys.exit() ends the call, not lodger
        return Execution("error", f"{t.name} tried to exit the process (code {error.code})")
    if isinstance(error, KeyboardInterrupt):
        return Execution("interrupted", f"{t.name} was interrupted")
    return Execution("error", f"{t.name} failed: {type(error).__name__}: {error}")


def _success(t: Tool, value: Any) -> Execution:
    if isinstance(value, Suspended):
        return Execution("ok", value.reason, suspended=True)
    if isinstance(value, ToolOutput):
        return Execution("error" if value.is_error else "ok", value.content)
    if isinstance(value, str):
        return Execution("ok", value)
    try:
        return Execution("ok", json.dumps(value, ensure_ascii=False, default=str))
    except (TypeError, ValueError, RecursionError) as exc:
        return Execution("error", f"{t.name} returned a value that is not JSON: {exc}")

"""The in-process substrate: a dispatched call's handler runs as a task of this event loop.

The pipeline hands a tool, its validated arguments and its context to an ``Executor``
(``lodger.tools.spec``) and gets back how it ended, as a value. ``InProcessExecutor`` runs
the handler here (sync tools are on a worker thread already). The other substrates (a
sandboxed process, a code cell, remote work) implement the same interface, and the
pipeline picks one per tool (``lodger.substrates.select``).

Every execution has a time limit. At the limit the call is told to stop and gets a short
grace period to settle: an async tool stops at its next await; a sync tool's thread
cannot be stopped, so if it is still running after the grace it is abandoned and the
result says its effect is unknown. A stop from outside (Ctrl-C, SIGTERM) waits for the
call to settle and records what it did; a second stop abandons a worker thread.

What a tool raises is its result, never a stop of lodger: ``KeyboardInterrupt``,
``SystemExit`` and ``GeneratorExit`` from a tool become an error result naming them, like
any other exception (in a task, the first two would stop the whole event loop). Only a
signal to lodger stops lodger, and it arrives as a cancellation (the CLI's handlers,
``lodger.cli._interrupts``; ``asyncio.run``'s own), which always propagates.

``run_bounded``, ``execution_of`` and ``result_execution`` are that discipline on their
own, for substrates whose work is a coroutine too (a code cell's run, a sandboxed run);
``contained`` keeps a tool's exits inside work a substrate runs as a task of its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

from lodger._core.eager import start_eagerly
from lodger.errors import ToolCallError
from lodger.media import BinaryContent
from lodger.tools.spec import (
    Accepted,
    Execution,
    Executor,
    Suspended,
    Tool,
    ToolContext,
    ToolOutput,
    WorkerAbandoned,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "STOP_GRACE",
    "Execution",
    "Executor",
    "InProcessExecutor",
    "StoppedBy",
    "contained",
    "execution_of",
    "failure_execution",
    "result_execution",
    "result_json",
    "run_bounded",
]

DEFAULT_TIMEOUT = 600.0
"""Seconds a call may run when neither the tool nor the run sets a limit."""

STOP_GRACE = 2.0
"""Seconds a call that hit its time limit gets to settle before its worker is abandoned."""

StoppedBy = Literal["time_limit", "cancelled"] | None

T = TypeVar("T")


class InProcessExecutor:
    """Runs the handler as a task of this loop, under a time limit."""

    def __init__(self, *, grace: float = STOP_GRACE) -> None:
        self.grace = grace

    async def execute(
        self,
        *,
        tool: Tool,
        arguments: dict[str, Any],
        context: ToolContext,
        time_limit: float,
    ) -> Execution:
        done, stopped_by = await run_bounded(
            _handled(tool, arguments, context), time_limit=time_limit, grace=self.grace
        )
        return execution_of(tool.name, done, stopped_by, time_limit)


async def run_bounded(
    work: Coroutine[Any, Any, Any], *, time_limit: float, grace: float
) -> tuple[asyncio.Future[Any], StoppedBy]:
    """Run ``work`` to its end under ``time_limit``: the settled future and what stopped it.

    At the limit it is cancelled and gets ``grace`` seconds to settle, then a second stop
    (a worker thread is abandoned). Cancelled from outside, it is cancelled and waited for
    (asked again: a worker thread is given up on); nothing is raised, the caller reads its
    own cancellation from its task. What ``work`` raises is ``contained``.
    """
    # Started at once, in a context of its own: a handler that finishes without
    # waiting (most async tools) needs no task and no trip through the event loop.
    task = start_eagerly(contained(work))
    stopped_by: StoppedBy = None
    try:
        if not await _done_within(task, time_limit):
            stopped_by = "time_limit"
            task.cancel()
            if not await _done_within(task, grace):
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
    return task, stopped_by


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


class _Raised(Exception):
    """A tool's ``KeyboardInterrupt`` or ``SystemExit``, carried as its outcome."""

    def __init__(self, error: KeyboardInterrupt | SystemExit) -> None:
        super().__init__(error)
        self.error = error


async def contained(work: Coroutine[Any, Any, T]) -> T:
    """Await ``work``; a ``KeyboardInterrupt`` or ``SystemExit`` it raises is its outcome.

    Raised in a task, either would stop the whole event loop (asyncio re-raises them from
    the loop), so the turn would end with the tool's exception. Contained, it is an error
    result of the call (``execution_of``). A sync tool's exception comes back from its
    worker thread the same way. ``CancelledError`` and ``GeneratorExit`` pass through
    unchanged: a cancellation must propagate, and a coroutine being closed must close.
    """
    try:
        return await work
    except (KeyboardInterrupt, SystemExit) as exc:
        raise _Raised(exc) from None


async def _handled(t: Tool, arguments: dict[str, Any], ctx: ToolContext) -> Any:
    # the handler is called inside the work: whatever it raises is the call's outcome
    return await t.handler(dict(arguments), ctx)


def execution_of(
    name: str, task: asyncio.Future[Any], stopped_by: StoppedBy, limit: float
) -> Execution:
    """How a settled run of tool ``name`` ended: its value, its exception (the tool's
    error result), or the stop that ended it."""
    if task.cancelled():
        if stopped_by == "time_limit":
            return Execution(
                "timed_out",
                f"{name} did not finish within {limit:g} s and was stopped; "
                "its effect may be partial",
            )
        return Execution(
            "cancelled", f"{name} was cancelled while running; its effect may be partial"
        )
    error = task.exception()
    if isinstance(error, WorkerAbandoned):
        why = f"did not finish within {limit:g} s" if stopped_by == "time_limit" else "was stopped"
        return Execution(
            "timed_out" if stopped_by == "time_limit" else "interrupted",
            f"{name} {why}; its worker thread could not be stopped and was left running, "
            "so its effect is unknown",
        )
    if error is not None:
        return failure_execution(name, error)
    value = task.result()
    execution = result_execution(name, value)
    if execution.suspended or execution.accepted is not None:
        return execution  # handed off even if stopped meanwhile: the probe settles it
    if stopped_by == "time_limit":
        # it finished in the grace period after the limit: the effect happened
        return Execution(
            "timed_out", f"{name} finished only after its {limit:g} s limit: " + execution.content
        )
    return execution


def failure_execution(name: str, error: BaseException) -> Execution:
    """How a call of tool ``name`` that raised ``error`` ends: an error result naming it
    (a ``ToolCallError`` gives its message and hint, for the model)."""
    if isinstance(error, _Raised):
        error = error.error
    if isinstance(error, ToolCallError):
        return Execution("error", str(error))  # the message and its hint: for the model
    if isinstance(error, SystemExit):  # sys.exit() ends the call, not lodger
        return Execution(
            "error",
            f"{name} failed: SystemExit (exit code {error.code}): the tool tried to exit the "
            "process; the call failed and the run goes on",
        )
    text = f"{name} failed: {type(error).__name__}"
    detail = str(error)
    if detail:
        text += f": {detail}"
    if isinstance(error, KeyboardInterrupt):
        text += "; raised by the tool, it failed the call and the run goes on"
    return Execution("error", text)


def result_execution(name: str, value: Any) -> Execution:
    """How a handler's return value ends its call (a str, ``ToolOutput``, JSON, ``Suspended``)."""
    if isinstance(value, Suspended):
        # A handler that handed its work off itself; tools that do so should declare
        # ``RemoteWork`` (``lodger.substrates.remote``), which is where suspending belongs.
        return Execution("ok", value.reason, suspended=True)
    if isinstance(value, ToolOutput):
        return Execution(
            "error" if value.is_error else "ok",
            value.content,
            parts=tuple(value.parts),
            facts=tuple(value.facts),
        )
    if isinstance(value, Accepted):
        # the remote side runs it: the engine records the handle and polls it
        return Execution("ok", f"{name} was accepted and runs remotely", accepted=value)
    if isinstance(value, BinaryContent):
        label = f" {value.name!r}" if value.name else ""
        return Execution(
            "ok", f"[{value.media_type}{label}: {len(value.data)} bytes]", parts=(value,)
        )
    if isinstance(value, str):
        return Execution("ok", value)
    try:
        return Execution("ok", result_json(value))
    except _NotJson as exc:
        return Execution(
            "error",
            f"{name} returned a value of type {type(value).__name__} that cannot be written "
            f"as JSON: {exc}; return a str, JSON data, or a value pydantic can serialize (a model, "
            "dataclass, TypedDict, enum, datetime, UUID, path, bytes...)",
        )


class _NotJson(Exception):
    pass


def _jsonable(value: Any) -> Any:
    """The JSON form pydantic gives a value ``json.dumps`` does not know (a model, a
    dataclass, an enum, a datetime, a UUID, a path, a set, bytes as base64...)."""
    from pydantic_core import PydanticSerializationError, to_jsonable_python

    try:
        return to_jsonable_python(value, bytes_mode="base64", inf_nan_mode="constants")
    except PydanticSerializationError:
        raise _NotJson(f"a {type(value).__module__}.{type(value).__qualname__} inside it") from None


def result_json(value: Any) -> str:
    """A tool's return value as JSON text: plain JSON as is, anything else the way
    pydantic serializes it (models by their fields, never a Python repr)."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, default=_jsonable)
    except _NotJson:
        raise
    except ValueError as exc:  # NaN or an infinity in plain data
        raise _NotJson(str(exc)) from None
    except (TypeError, RecursionError) as exc:  # a non-str key, a cycle
        raise _NotJson(f"{type(exc).__name__}: {exc}") from None

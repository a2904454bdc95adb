"""Execution substrates: where a dispatched call's handler runs.

The pipeline hands a tool, its validated arguments and its context to an ``Executor``
and gets back how it ended, as a value. ``InProcessExecutor`` awaits the handler in this
process (sync tools are already on a worker thread); a sandboxed process and a code-cell
interpreter implement the same interface. Every execution has a time limit: a call that
outlives it settles as ``timed_out``.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Protocol

from lodger.errors import ToolCallError
from lodger.events import ResultStatus
from lodger.tools.spec import Tool, ToolContext, ToolOutput

__all__ = ["DEFAULT_TIMEOUT", "Execution", "Executor", "InProcessExecutor"]

DEFAULT_TIMEOUT = 600.0
"""Seconds a call may run when neither the tool nor the run sets a limit."""


@dataclass(frozen=True, slots=True)
class Execution:
    status: ResultStatus
    content: str


class Executor(Protocol):
    async def execute(
        self, t: Tool, arguments: dict[str, object], ctx: ToolContext, *, time_limit: float
    ) -> Execution:
        """Run ``t`` to the end and say how it ended; never raises for the tool's faults.

        Cancellation of the caller cancels the execution, which then ends ``cancelled``.
        """
        ...


class InProcessExecutor:
    """Awaits the handler on this event loop, under a time limit."""

    async def execute(
        self, t: Tool, arguments: dict[str, object], ctx: ToolContext, *, time_limit: float
    ) -> Execution:
        try:
            async with asyncio.timeout(time_limit):
                value = await t.handler(dict(arguments), ctx)
        except TimeoutError:
            return Execution(
                "timed_out",
                f"{t.name} did not finish within {time_limit:g} s and was stopped; "
                "its effect may be partial",
            )
        except ToolCallError as exc:
            return Execution("error", str(exc))  # the message and its hint: for the model
        except asyncio.CancelledError:
            return Execution(
                "cancelled", f"{t.name} was cancelled while running; its effect may be partial"
            )
        except SystemExit as exc:  # a tool calling sys.exit() ends its call, not lodger
            return Execution("error", f"{t.name} tried to exit the process (code {exc.code})")
        except Exception as exc:  # noqa: BLE001 - a tool failure is a result, not a crash
            return Execution("error", f"{t.name} failed: {type(exc).__name__}: {exc}")
        if isinstance(value, ToolOutput):
            return Execution("error" if value.is_error else "ok", value.content)
        if isinstance(value, str):
            return Execution("ok", value)
        try:
            return Execution("ok", json.dumps(value, ensure_ascii=False, default=str))
        except (TypeError, ValueError, RecursionError) as exc:
            return Execution("error", f"{t.name} returned a value that is not JSON: {exc}")

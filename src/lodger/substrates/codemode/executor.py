"""The code-cell substrate: one cell's run in a fresh interpreter, as an Executor.

``CodeCell`` is the declaration the ``exec`` tool carries (``Tool.substrate``): which
interpreter runs its cells (``JavaScriptSubstrate`` in V8, ``PythonSubstrate`` in Monty)
and under which ``CellLimits``. ``CellExecutor`` runs a call on it: the cell's source from
the call's ``code``, a ``CellHost`` over the pipeline's nested caller (every nested call
takes the whole path of a top-level call), ``run_cell`` under the cell's wall time, and
the outcome rendered as the call's JSON result. The call's own time limit sits past the
cell's wall time and stops a cell that did not stop itself; a cancellation of the caller
cancels the cell, whose running nested calls settle first.

A failed commit of a nested call is not the cell's fault: it fails the turn (the cell's
T2 cannot commit either).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Literal

from lodger.errors import ToolCallError
from lodger.substrates.codemode._host import CellHost
from lodger.substrates.codemode.limits import CellLimits
from lodger.substrates.codemode.substrate import CellOutcome, CellSubstrate, Diagnostic
from lodger.substrates.inprocess import STOP_GRACE, contained, execution_of, run_bounded
from lodger.tools.spec import Execution, Executor, Tool, ToolContext, ToolOutput

__all__ = ["CellExecutor", "CodeCell", "run_cell"]


class CellExecutor:
    """Runs a ``CodeCell`` tool's call: its cell, under the call's time limit."""

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
        cell = tool.substrate
        if not isinstance(cell, CodeCell):
            return Execution("error", f"{tool.name} does not declare a code cell to run")
        done, stopped_by = await run_bounded(
            cell.run(arguments, context, name=tool.name), time_limit=time_limit, grace=self.grace
        )
        return execution_of(tool.name, done, stopped_by, time_limit)


_EXECUTOR = CellExecutor()


@dataclass(frozen=True, kw_only=True)
class CodeCell:
    """Declares that a tool's calls are cells: ``runner`` interprets ``code`` under ``limits``."""

    runner: CellSubstrate
    limits: CellLimits

    @property
    def kind(self) -> Literal["code_cell"]:
        return "code_cell"

    @property
    def executor(self) -> Executor:
        return _EXECUTOR

    async def run(
        self, arguments: dict[str, Any], context: ToolContext, *, name: str
    ) -> ToolOutput:
        """Run the call's cell to its rendered result (a diagnostic is an error result)."""
        source = str(arguments["code"])
        if context.nested is None:
            raise ToolCallError(f"{name} runs only as a call of a model step")
        limits = self.limits
        if len(source.encode("utf-8", "replace")) > limits.source_bytes:
            return _render(
                CellOutcome(
                    diagnostic=Diagnostic(
                        kind="limit_exceeded",
                        limit="source_bytes",
                        message=f"the cell is larger than {limits.source_bytes} bytes",
                    )
                ),
                limits,
            )
        host = CellHost(context.nested, limits)
        outcome = await run_cell(self.runner, source, host, limits)
        if host.failure is not None:
            raise host.failure  # the cell's T2 cannot commit either: the turn fails
        return _render(outcome, limits)


async def run_cell(
    substrate: CellSubstrate, source: str, host: CellHost, limits: CellLimits
) -> CellOutcome:
    """Run one cell to an outcome under its wall time; stops it when the host says so.

    A failed commit lets running nested calls settle before the cell is torn down; a
    timeout or a cancellation of the caller cancels them (each records what it did).
    """
    # a task of its own: what the interpreter raises (even an exit) is the cell's outcome
    run = asyncio.ensure_future(contained(substrate.run(source, host, limits)))
    stopped = asyncio.ensure_future(host.stopped.wait())
    try:
        try:
            done, _ = await asyncio.wait(
                {run, stopped}, timeout=limits.wall_time, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            run.cancel()
            await _ended(run)
            raise
        if run not in done:
            if host.failure is not None:
                await host.settle(cancel=False)
            run.cancel()
            await _ended(run)
        elif host.stop_reason is None:
            return run.result()
    finally:
        stopped.cancel()
    return CellOutcome(
        diagnostic=_stop_diagnostic(host, limits, timed_out=not host.stopped.is_set())
    )


async def _ended(run: asyncio.Future[CellOutcome]) -> None:
    """Wait for a cancelled run to end; a second cancellation waits all the same."""
    interrupted = False
    while not run.done():
        try:
            await asyncio.wait({run})
        except asyncio.CancelledError:
            interrupted = True
            run.cancel()
    if not run.cancelled():
        run.exception()  # retrieved: the outcome is the diagnostic
    if interrupted:
        raise asyncio.CancelledError


def _stop_diagnostic(host: CellHost, limits: CellLimits, *, timed_out: bool) -> Diagnostic:
    if timed_out or host.stop_reason is None:
        return Diagnostic(
            kind="limit_exceeded",
            limit="wall_time",
            message=f"the cell ran longer than {limits.wall_time:g} s and was stopped; "
            "nested calls it had started settled first",
        )
    code, detail = host.stop_reason
    if code == "limit_exceeded":
        return Diagnostic(kind="limit_exceeded", limit=host.exceeded, message=detail)
    return Diagnostic(kind=code, message=detail, tool=host.stop_tool)


def _render(outcome: CellOutcome, limits: CellLimits) -> ToolOutput:
    if outcome.diagnostic is None:
        try:
            # strict JSON: a Python cell can give NaN, a set, bytes, a huge int, a
            # tuple key or a value nested past what the host's encoder follows
            value_text = json.dumps(outcome.value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            return _render(
                CellOutcome(
                    diagnostic=Diagnostic(
                        kind="result_not_json",
                        message=f"the cell's result is not JSON: {_why_not_json(exc)}",
                    ),
                    logs=outcome.logs,
                    logs_dropped=outcome.logs_dropped,
                ),
                limits,
            )
        if len(value_text.encode("utf-8", "replace")) > limits.result_bytes:
            return _render(
                CellOutcome(
                    diagnostic=Diagnostic(
                        kind="limit_exceeded",
                        limit="result_bytes",
                        message=f"the cell's result is larger than {limits.result_bytes} bytes",
                    ),
                    logs=outcome.logs,
                    logs_dropped=outcome.logs_dropped,
                ),
                limits,
            )
        # the value's own text, spliced: encoding it again inside the body could pass
        # the encoder's depth a second time
        parts = ['"result": ' + value_text]
    else:
        parts = ['"error": ' + json.dumps(outcome.diagnostic.to_json(), ensure_ascii=False)]
    if outcome.logs:
        parts.append('"logs": ' + json.dumps(list(outcome.logs), ensure_ascii=False))
    if outcome.logs_dropped:
        parts.append(f'"logs_dropped": {int(outcome.logs_dropped)}')
    return ToolOutput(content="{" + ", ".join(parts) + "}", is_error=outcome.diagnostic is not None)


def _why_not_json(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    text = str(exc)
    if "integer string conversion" in text:
        return "an integer has too many digits"
    if "Out of range float" in text:
        return "NaN and Infinity have no JSON form"
    return text.split(";")[0]

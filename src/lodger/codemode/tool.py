"""The ``exec`` tool: the model sends a cell, the cell calls tools, one result comes back.

A cell runs in a fresh interpreter (``JavaScriptSubstrate`` or ``PythonSubstrate``) under
one ``CellLimits``. Every nested call takes the whole path of a top-level call with its
own call id, ``parent_call_id`` = the cell's call, ``origin=code_mode`` and
``visibility=hidden``: the log keeps all of them, the model sees only the cell and its
result. The cell claims no resources itself, so it can never wait on a lease one of its
own nested calls holds.

Recovery never runs a cell again (policy ``report``): an interrupted cell is settled by a
``recovery_observed`` fact (reason ``cell_interrupted``) that lists each nested outcome,
after the nested calls have followed their own tools' policies; the model decides what
to do next.

>>> registry = ToolRegistry([read_file, list_files])
>>> registry.bind(exec_tool(registry))  # what ``code_mode=True`` does
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from lodger.codemode._host import CellHost
from lodger.codemode.limits import CellLimits
from lodger.codemode.signatures import tool_lines
from lodger.codemode.substrate import CellOutcome, CellSubstrate, Diagnostic
from lodger.errors import ToolCallError, UsageError
from lodger.tools.spec import Tool, ToolContext, ToolOutput

__all__ = ["EXEC_TOOL", "CodeMode", "Language", "exec_tool", "run_cell"]

EXEC_TOOL = "exec"
Language = Literal["javascript", "python"]


@dataclass(frozen=True, kw_only=True)
class CodeMode:
    """The ``exec`` tool an agent binds: cells in ``language`` under ``limits``.
    ``Agent(code_mode="python")`` is ``Agent(code_mode=CodeMode(language="python"))``."""

    language: Language = "javascript"
    limits: CellLimits = field(default_factory=CellLimits)


_STOP_GRACE = 10.0  # the executor's own limit sits past the cell's, so the cell's trips first


def _substrate(language: Language) -> CellSubstrate:
    try:
        if language == "javascript":
            from lodger.codemode.javascript import JavaScriptSubstrate

            return JavaScriptSubstrate()
        if language == "python":
            from lodger.codemode.python import PythonSubstrate

            return PythonSubstrate()
    except ImportError as exc:
        raise UsageError(
            f"code mode in {language} needs its interpreter package ({exc.name})",
            hint="install lodger with the codemode extra: pip install 'lodger[codemode]'",
            code="codemode_unavailable",
        ) from None
    raise UsageError(
        f"code mode has no language {language!r}",
        hint="choose javascript or python",
        code="codemode_unavailable",
    )


def _description(tools: Iterable[Tool], language: Language, limits: CellLimits) -> str:
    tools = list(tools)
    direct = [t for t in tools if t.nestable and not t.deferred]
    deferred = sorted(t.name for t in tools if t.nestable and t.deferred)
    if language == "javascript":
        head = [
            "Run a JavaScript cell: the body of an async function in a fresh, isolated V8 "
            "interpreter (no filesystem, network, timers, clock, imports, typed arrays or "
            "Intl; nothing survives the cell). Call tools with `await tools.NAME({...})`, "
            "which returns the parsed result or throws a ToolError with a `code`; use "
            "`Promise.all` for independent calls. `return` a JSON value; console.log output "
            "comes back with it.",
            "Callable tools:",
        ]
    else:
        head = [
            "Run a Python cell (a sandboxed Python subset, fresh per cell; no filesystem, "
            "network, clock or state across cells). Call tools as async functions with "
            "keyword arguments, e.g. `x = await read_file(path='a.txt')`; use "
            "`asyncio.gather` for independent calls. The value of the last expression is "
            "the result (JSON); print() output comes back with it.",
            "Callable tools:",
        ]
    lines = [*head, *(f"  {line}" for line in tool_lines(direct, language=language))]
    if deferred:
        lines.append(
            "Callable once tool_search has activated them (in an earlier step): "
            + ", ".join(deferred)
        )
    lines.append(
        f"Limits: {limits.wall_time:g} s, {limits.memory // (1024 * 1024)} MiB, "
        f"{limits.nested_calls} tool calls ({limits.nested_in_flight} at once), "
        f"{limits.result_bytes // 1024} KiB result, "
        f"{limits.argument_bytes // 1024} KiB of arguments per call."
    )
    return "\n".join(lines)


def exec_tool(
    tools: Iterable[Tool],
    *,
    language: Language = "javascript",
    limits: CellLimits | None = None,
    substrate: CellSubstrate | None = None,
    name: str = EXEC_TOOL,
) -> Tool:
    """The ``exec`` tool over ``tools`` (the nestable ones are callable from a cell).

    ``limits`` is one whole policy (default ``CellLimits()``); ``substrate`` overrides the
    interpreter (one per language is built when omitted).
    """
    policy = limits if limits is not None else CellLimits()
    runner = substrate if substrate is not None else _substrate(language)

    async def handler(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        source = str(arguments["code"])
        if ctx.nested is None:
            raise ToolCallError(f"{name} runs only as a call of a model step")
        if len(source.encode("utf-8", "replace")) > policy.source_bytes:
            return _render(
                CellOutcome(
                    diagnostic=Diagnostic(
                        kind="limit_exceeded",
                        limit="source_bytes",
                        message=f"the cell is larger than {policy.source_bytes} bytes",
                    )
                ),
                policy,
            )
        host = CellHost(ctx.nested, policy)
        outcome = await run_cell(runner, source, host, policy)
        if host.failure is not None:
            raise host.failure  # the cell's T2 cannot commit either: the turn fails
        return _render(outcome, policy)

    lang = "JavaScript" if language == "javascript" else "Python"
    return Tool(
        name=name,
        description=_description(tools, language, policy),
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string", "description": f"the {lang} cell"}},
            "required": ["code"],
            "additionalProperties": False,
        },
        handler=handler,
        group="code",
        recovery="report",
        timeout=policy.wall_time + _STOP_GRACE,
    )


async def run_cell(
    substrate: CellSubstrate, source: str, host: CellHost, limits: CellLimits
) -> CellOutcome:
    """Run one cell to an outcome under its wall time; stops it when the host says so.

    A failed commit lets running nested calls settle before the cell is torn down; a
    timeout or a cancellation of the caller cancels them (each records what it did).
    """
    run = asyncio.ensure_future(substrate.run(source, host, limits))
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

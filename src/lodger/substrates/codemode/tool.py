"""The ``exec`` tool: the model sends a cell, the cell calls tools, one result comes back.

A cell runs in a fresh interpreter (``JavaScriptSubstrate`` or ``PythonSubstrate``) under
one ``CellLimits``, on the code-cell substrate (``CodeCell``, run by ``CellExecutor``:
``lodger.substrates.codemode.executor``). Every nested call takes the whole path of a
top-level call with its
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

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from lodger.errors import UsageError
from lodger.substrates.codemode.executor import CodeCell, run_cell
from lodger.substrates.codemode.limits import CellLimits
from lodger.substrates.codemode.signatures import tool_lines
from lodger.substrates.codemode.substrate import CellSubstrate
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


_STOP_GRACE = 10.0  # the call's own limit sits past the cell's, so the cell's trips first


def _substrate(language: Language) -> CellSubstrate:
    # without the codemode extra, these imports raise MissingExtraError (a UsageError)
    if language == "javascript":
        from lodger.substrates.codemode.javascript import JavaScriptSubstrate

        return JavaScriptSubstrate()
    if language == "python":
        from lodger.substrates.codemode.python import PythonSubstrate

        return PythonSubstrate()
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
    cell = CodeCell(runner=runner, limits=policy)

    async def handler(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return await cell.run(arguments, ctx, name=name)

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
        substrate=cell,
    )

"""How much memory lodger's MCP client takes for what a server sends: run as a process.

    python _mcp_peak.py '{"tame": CONFIG, "hostile": CONFIG, "call": TOOL}'

A CONFIG holds ``McpServerConfig`` fields. The process first connects to the tame server
and calls its ``echo`` (everything is imported and warmed: the baseline), then connects
to the hostile one and, when ``call`` names a tool, calls it. It prints one JSON line:
``baseline_kb`` and ``peak_kb`` (the process's peak resident size after each part, as
``getrusage`` reports it), ``tools`` (how many were bound) and ``outcome`` (the call's
result or error, or why the server did not start), cut to 1000 characters.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
from typing import Any

from lodger.errors import ConfigError, ToolCallError
from lodger.tools.mcp import McpServerConfig, McpServers
from lodger.tools.spec import ToolContext, ToolOutput


def _peak_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _config(fields: dict[str, Any]) -> McpServerConfig:
    for key in ("args",):
        if key in fields:
            fields[key] = tuple(fields[key])
    return McpServerConfig(**fields)


async def _use(config: McpServerConfig, tool: str | None) -> tuple[int, str]:
    ctx = ToolContext(session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o")
    try:
        async with McpServers([config]) as mcp:
            tools = {t.name: t for t in mcp.tools()}
            if tool is None:
                return len(tools), "listed"
            try:
                out = await tools[f"{config.name}__{tool}"].handler({"text": "x"}, ctx)
            except ToolCallError as exc:
                return len(tools), f"error: {exc}"
            assert isinstance(out, ToolOutput)
            return len(tools), f"ok: {len(out.content)} characters"
    except ConfigError as exc:
        return 0, f"did not start: {exc}"


async def main(plan: dict[str, Any]) -> None:
    await _use(_config(plan["tame"]), "echo")
    baseline = _peak_kb()
    tools, outcome = await _use(_config(plan["hostile"]), plan.get("call"))
    print(
        json.dumps(
            {
                "baseline_kb": baseline,
                "peak_kb": _peak_kb(),
                "tools": tools,
                "outcome": outcome[:1000],
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))

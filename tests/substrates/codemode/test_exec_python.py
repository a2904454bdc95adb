"""Python cells in the Monty interpreter: the same exec tool and the same nested call path
as JavaScript cells; tools are async functions taking keyword arguments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cell_harness import Cells, cell_result, make_agent

from lodger.events import ToolDispatched
from lodger.substrates.codemode import CellLimits
from lodger.tools import Tool, tool


def counted(counts: dict[str, int]) -> list[Tool]:
    @tool(nestable=True, recovery="idempotent")
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        counts["add"] = counts.get("add", 0) + 1
        return a + b

    @tool
    async def secret() -> str:
        """Not callable from cells."""
        return "s"

    return [add, secret]


async def run_python(
    tmp_path: Path, code: str, **kw: Any
) -> tuple[str, dict[str, Any], dict[str, int], list[Any]]:
    counts: dict[str, int] = {}
    agent = make_agent(tmp_path, Cells(code), counted(counts), language="python", **kw)
    exec_tool = agent.registry.get("exec")
    assert exec_tool is not None
    assert "async def add(*, a: int, b: int) -> Any  # Add two integers." in exec_tool.description
    result = await agent.run("go", session="s")
    assert result.status == "completed"
    events = await agent.session("s").events()
    status, content = cell_result(events)
    return status, content, counts, events


async def test_python_cell_gathers_nested_calls_through_the_call_path(tmp_path: Path) -> None:
    code = (
        "import asyncio\n"
        "x, y = await asyncio.gather(add(a=1, b=2), add(a=3, b=4))\n"
        "print('sum', x + y)\n"
        "{'x': x, 'y': y}"
    )
    status, content, counts, events = await run_python(tmp_path, code)
    assert (status, content) == ("ok", {"result": {"x": 3, "y": 7}, "logs": ["sum 10"]})
    assert counts == {"add": 2}
    nested = [e for e in events if e.parent_call_id == "cell0"]
    assert len([e for e in nested if isinstance(e.body, ToolDispatched)]) == 2
    assert {(e.origin, e.visibility) for e in nested} == {("code_mode", "hidden")}


async def test_python_diagnostics_carry_no_host_detail(tmp_path: Path) -> None:
    cases = {
        "parse_error": "def f(:\n    pass",
        "runtime_error": "x = await add(a=1, b=1)\n1 / 0",
        "not_nestable": "await secret()",
    }
    for index, (kind, code) in enumerate(cases.items()):
        status, content, _, _ = await run_python(tmp_path / str(index), code)
        assert (status, content["error"]["kind"]) == ("error", kind)
        text = json.dumps(content)
        for leak in ("site-packages", "/work", "lodger", "/tmp"):
            assert leak not in text, (leak, text)
    status, content, _, _ = await run_python(
        tmp_path / "tool_error",
        "try:\n    await add(a='x', b=1)\nexcept RuntimeError as e:\n    r = str(e)\nr",
    )
    assert status == "ok" and content["result"].startswith("rejected: invalid arguments for add")


async def test_python_limits_and_isolation(tmp_path: Path) -> None:
    status, content, _, _ = await run_python(
        tmp_path / "m",
        "a = []\nwhile True:\n    a.append('x' * 10000)",
        limits=CellLimits(memory=16 * 1024 * 1024),
    )
    assert (status, content["error"]["kind"], content["error"]["limit"]) == (
        "error",
        "limit_exceeded",
        "memory",
    )
    status, content, _, _ = await run_python(
        tmp_path / "i",
        "import time\ntry:\n    open('/etc/passwd')\n    r = 'read'\n"
        "except OSError:\n    r = 'refused'\n[r, time.time()]",
    )
    assert (status, content["result"]) == ("ok", ["refused", 946684800.0])

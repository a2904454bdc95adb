"""JavaScript cells end to end through an agent: nested calls take the whole call path
(own call id, parent link, code_mode origin, hidden), the model sees only the cell, and
every way a cell can go wrong is a structured diagnostic with no host detail in it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from cell_harness import Cells, cell_result, make_agent

from lodger.authority import ResourceClaim
from lodger.engine.settings import Hooks, Services
from lodger.events import ToolDispatched, ToolResponded
from lodger.storage import Storage
from lodger.substrates.codemode import CellLimits
from lodger.tools import Tool, ToolContext, tool


def counted_tools(counts: dict[str, int]) -> list[Tool]:
    @tool(nestable=True, recovery="idempotent")
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        counts["add"] = counts.get("add", 0) + 1
        return a + b

    @tool(nestable=True)
    async def shout(text: str) -> str:
        """Upper-case a text."""
        counts["shout"] = counts.get("shout", 0) + 1
        return text.upper()

    @tool
    async def secret() -> str:
        """Not callable from cells."""
        counts["secret"] = counts.get("secret", 0) + 1
        return "s"

    return [add, shout, secret]


async def test_nested_calls_are_durable_hidden_and_linked_to_their_cell(tmp_path: Path) -> None:
    counts: dict[str, int] = {}
    model = Cells(
        "const [x, y] = await Promise.all([tools.add({a: 1, b: 2}), tools.add({a: 3, b: 4})]);\n"
        "console.log('sum', x + y);\n"
        "return {x, y, loud: await tools.shout({text: 'hi'})};"
    )
    agent = make_agent(tmp_path, model, counted_tools(counts))
    result = await agent.run("go", session="s")
    assert result.status == "completed"
    events = await agent.session("s").events()
    status, content = cell_result(events)
    assert status == "ok"
    assert content == {"result": {"x": 3, "y": 7, "loud": "HI"}, "logs": ["sum 10"]}
    nested = [e for e in events if e.parent_call_id == "cell0"]
    t1s = [e for e in nested if isinstance(e.body, ToolDispatched)]
    t2s = [e for e in nested if isinstance(e.body, ToolResponded)]
    assert len(t1s) == len(t2s) == 3 == sum(counts.values())
    assert {(e.origin, e.visibility) for e in nested} == {("code_mode", "hidden")}
    assert len({e.call_id for e in t1s}) == 3 and "cell0" not in {e.call_id for e in t1s}
    # the cell claims nothing itself
    cell_t1 = next(e for e in events if e.call_id == "cell0" and isinstance(e.body, ToolDispatched))
    assert cell_t1.body.resources == () and cell_t1.body.recovery == "report"  # type: ignore[union-attr]
    # the model's next request holds the cell and its result, nothing nested
    last = model.requests[-1]
    text = json.dumps(
        [m.model_dump() if hasattr(m, "model_dump") else repr(m) for m in last.messages],
        default=str,
    )
    for e in t1s:
        assert e.call_id is not None and e.call_id not in text
    assert "cell0" in text and "sum 10" in text


async def test_exec_description_lists_nestable_tools_with_signatures(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, Cells(), counted_tools({}))
    exec_tool = agent.registry.get("exec")
    assert exec_tool is not None
    assert "tools.add(args: {a: number; b: number}): Promise<any>  // Add two integers." in (
        exec_tool.description
    )
    assert "tools.shout(args: {text: string})" in exec_tool.description
    assert "secret" not in exec_tool.description


async def run_cell_once(
    tmp_path: Path, code: str, **kw: Any
) -> tuple[str, dict[str, Any], dict[str, int]]:
    counts: dict[str, int] = {}
    agent = make_agent(tmp_path, Cells(code), counted_tools(counts), **kw)
    result = await agent.run("go", session="s")
    assert result.status == "completed"
    status, content = cell_result(await agent.session("s").events())
    return status, content, counts


def assert_no_host_detail(content: dict[str, Any]) -> None:
    text = json.dumps(content)
    for leak in ("Traceback", ".py", "site-packages", "/work", "/tmp", "lodger"):
        assert leak not in text, (leak, text)


async def test_parse_error_names_the_cell_line(tmp_path: Path) -> None:
    status, content, _ = await run_cell_once(tmp_path, "const a = 1;\nlet = = 2;")
    assert status == "error" and content["error"]["kind"] == "parse_error"
    assert content["error"]["message"].startswith("line 2:")
    assert_no_host_detail(content)


async def test_runtime_error_has_a_cell_stack_and_no_host_detail(tmp_path: Path) -> None:
    code = (
        "function f() { throw new TypeError('bad thing'); }\nawait tools.add({a: 1, b: 1});\nf();"
    )
    status, content, counts = await run_cell_once(tmp_path, code)
    assert status == "error" and content["error"]["kind"] == "runtime_error"
    assert content["error"]["message"] == "TypeError: bad thing"
    assert "cell:1:" in content["error"]["stack"]
    assert counts == {"add": 1}
    assert_no_host_detail(content)


async def test_a_failing_tool_throws_a_tool_error_the_cell_can_catch(tmp_path: Path) -> None:
    code = (
        "try { await tools.add({a: 'x', b: 1}); } catch (e) { return [e.name, e.code, e.message]; }"
    )
    status, content, counts = await run_cell_once(tmp_path, code)
    assert status == "ok"
    name, code_, message = content["result"]
    assert (name, code_) == ("ToolError", "rejected") and "invalid arguments for add" in message
    assert counts == {}
    assert_no_host_detail(content)


async def test_unknown_and_non_nestable_tools_end_the_cell(tmp_path: Path) -> None:
    status, content, counts = await run_cell_once(
        tmp_path, "try { await tools.secret({}); } catch (e) {}\nreturn 1;"
    )
    assert status == "error"
    assert content["error"] == {
        "kind": "not_nestable",
        "message": "tool 'secret' cannot be called from a cell",
        "tool": "secret",
    }
    assert counts == {}
    status, content, _ = await run_cell_once(tmp_path / "b", "await tools.nope({});")
    assert (status, content["error"]["kind"], content["error"]["tool"]) == (
        "error",
        "unknown_tool",
        "nope",
    )
    status, content, _ = await run_cell_once(tmp_path / "c", "await tools.exec({code: '1'});")
    assert content["error"]["kind"] == "not_nestable"


@pytest.mark.slow
async def test_each_limit_gives_limit_exceeded_naming_it(tmp_path: Path) -> None:
    small = CellLimits(
        wall_time=2.0, memory=16 * 1024 * 1024, source_bytes=200, result_bytes=1000, nested_calls=3
    )
    cases = {
        "nested_calls": "for (let i = 0; i < 5; i++) await tools.add({a: i, b: 0}); return 1;",
        "memory": "const a = []; while (true) a.push('x'.repeat(1000) + a.length);",
        "wall_time": "await tools.add({a: 1, b: 1}); while (true) {}",
        "result_bytes": "return 'x'.repeat(5000);",
        "source_bytes": "return 1;" + " " * 300,
    }
    for index, (limit, code) in enumerate(cases.items()):
        status, content, counts = await run_cell_once(tmp_path / str(index), code, limits=small)
        assert status == "error", limit
        assert (content["error"]["kind"], content["error"]["limit"]) == ("limit_exceeded", limit)
        if limit == "nested_calls":
            assert counts == {"add": 3}


async def test_no_clock_timers_or_host_objects_inside_a_cell(tmp_path: Path) -> None:
    code = (
        "return [Date.now(), new Date().getTime(), typeof setTimeout, typeof WebAssembly,"
        " typeof SharedArrayBuffer, typeof require, typeof process, typeof fetch];"
    )
    status, content, _ = await run_cell_once(tmp_path, code)
    assert status == "ok"
    assert content["result"] == [0, 0] + ["undefined"] * 6


async def test_console_output_is_bounded(tmp_path: Path) -> None:
    code = "for (let i = 0; i < 100; i++) console.log('line', i); return 'ok';"
    status, content, _ = await run_cell_once(tmp_path, code, limits=CellLimits(log_bytes=100))
    assert status == "ok" and content["result"] == "ok"
    assert content["logs"][0] == "line 0" and content["logs_dropped"] == 100 - len(content["logs"])
    assert sum(len(line) + 1 for line in content["logs"]) <= 100


async def test_a_cell_never_waits_on_a_lease_its_own_nested_call_holds(tmp_path: Path) -> None:
    def claims(arguments: dict[str, Any], ctx: ToolContext) -> list[ResourceClaim]:
        root = ctx.require_workspace()
        return [ResourceClaim.file(root / arguments["path"], mode="write", root=root)]

    written: list[str] = []

    @tool(nestable=True, claims=claims)
    async def write(path: str, text: str) -> str:
        """Write a file (claims it exclusively)."""
        written.append(text)
        for _ in range(5):
            await asyncio.sleep(0)
        return "ok"

    code = (
        "await Promise.all([tools.write({path: 'f', text: 'a'}),"
        " tools.write({path: 'f', text: 'b'})]);"
        "\nreturn 'both';"
    )
    agent = make_agent(tmp_path, Cells(code), [write])
    result = await asyncio.wait_for(agent.run("go", session="s"), timeout=60)
    assert result.status == "completed"
    events = await agent.session("s").events()
    assert cell_result(events)[1] == {"result": "both"}
    assert written == ["a", "b"]  # exclusive leases: in the order the cell asked
    nested_t1 = [e for e in events if e.parent_call_id and isinstance(e.body, ToolDispatched)]
    assert all(e.body.resources for e in nested_t1)  # type: ignore[union-attr]


async def test_an_approval_pauses_the_cell_until_decided(tmp_path: Path) -> None:
    """A nested call that needs approval waits in the cell for the decision: the request
    and the decision are facts of the nested call, T1 comes after the decision, and the
    cell continues with the result."""
    from lodger.events import Event, PermissionDecided, PermissionRequested

    ran: list[str] = []

    @tool(nestable=True, approval=True)
    async def deploy(target: str) -> str:
        """Deploy somewhere (asks first)."""
        ran.append(target)
        return f"deployed {target}"

    asked = asyncio.Event()
    decide = asyncio.Event()

    async def approver(t: Tool, arguments: dict[str, Any]) -> bool:
        asked.set()
        await decide.wait()  # the operator takes their time
        return True

    seen: list[Event] = []
    model = Cells("const r = await tools.deploy({target: 'prod'});\nreturn r;")
    agent = make_agent(
        tmp_path, model, [deploy], hooks=Hooks(approver=approver, on_event=seen.append)
    )
    turn = asyncio.create_task(agent.run("go", session="s"))
    await asyncio.wait_for(asked.wait(), 30)
    assert ran == []  # paused in the cell: nothing dispatched yet
    assert not any(isinstance(e.body, ToolDispatched) and e.parent_call_id for e in seen)
    decide.set()
    result = await asyncio.wait_for(turn, 30)
    assert result.status == "completed" and ran == ["prod"]
    events = await agent.session("s").events()
    assert cell_result(events) == ("ok", {"result": "deployed prod"})
    nested = [e for e in events if e.parent_call_id == "cell0"]
    kinds = [type(e.body) for e in nested]
    assert kinds.index(PermissionRequested) < kinds.index(PermissionDecided)
    assert kinds.index(PermissionDecided) < kinds.index(ToolDispatched)


async def test_code_mode_can_be_enabled_for_one_run(tmp_path: Path) -> None:
    """An agent without code mode binds ``exec`` for one turn when asked, and not after."""
    from lodger import Agent, FunctionModel
    from lodger.ids import ManualClock, SequentialIds
    from lodger.storage import EventLog, MemoryArtifactStore, SqliteLogStore

    counts: dict[str, int] = {}
    model = Cells("return await tools.add({a: 20, b: 22});")
    seen_tools: list[list[str]] = []
    inner = FunctionModel(model)
    original = inner.complete

    async def complete(request: Any, *, on_text: Any = None) -> Any:
        seen_tools.append([t.name for t in request.tools])
        return await original(request, on_text=on_text)

    plain = Agent(
        model=inner,
        tools=counted_tools(counts),
        storage=Storage(
            log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
        ),
        services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds("id")),
    )
    inner.complete = complete  # type: ignore[method-assign]
    assert plain.registry.get("exec") is None
    result = await plain.run("go", session="s", code_mode="javascript")
    assert result.status == "completed"
    assert "exec" in seen_tools[0] and counts == {"add": 1}
    assert plain.registry.get("exec") is None  # the agent's own tools are unchanged
    events = await plain.session("s").events()
    assert cell_result(events) == ("ok", {"result": 42})

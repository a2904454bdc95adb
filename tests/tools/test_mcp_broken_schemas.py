"""MCP tools whose input schema lodger cannot validate against, from a real server process.

``tests/mcp_servers/broken_schemas_server.py`` (official SDK, stdio) advertises a dangling
``$ref``, a ``$ref`` to a URL, a schema that is not a JSON schema, and one good tool. The
server binds; the broken tools stay findable but every call of one is a clear error result
that never reaches the server; the good tool works; the turn completes.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from lodger.engine.settings import Services
from lodger.errors import ToolCallError
from lodger.events import ProposedCall
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import FunctionModel
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.testing import MemoryArtifactStore
from lodger.tools.mcp import McpServerConfig, McpServers, schema_problem
from lodger.tools.spec import ToolContext, ToolOutput

BROKEN = str(Path(__file__).parent.parent / "mcp_servers" / "broken_schemas_server.py")


def broken() -> McpServerConfig:
    return McpServerConfig(name="broken", command=sys.executable, args=(BROKEN,))


def ctx() -> ToolContext:
    return ToolContext(session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o")


USABLE: dict[str, dict[str, Any]] = {
    "local $defs": {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}},
        "$defs": {"A": {"type": "string"}},
    },
    "anchor": {
        "properties": {"a": {"$ref": "#thing"}},
        "$defs": {"A": {"$anchor": "thing", "type": "string"}},
    },
    "nested $id": {
        "$id": "https://example.com/root.json",
        "properties": {"b": {"$ref": "b.json"}, "c": {"$ref": "root.json#/$defs/C"}},
        "$defs": {"B": {"$id": "b.json", "type": "integer"}, "C": {"type": "null"}},
    },
    "the metaschema": {
        "properties": {"s": {"$ref": "https://json-schema.org/draft/2020-12/schema"}}
    },
    "$ref as data": {"properties": {"x": {"const": {"$ref": "#/nowhere"}, "enum": [{"$ref": 1}]}}},
    "a property named $ref": {"properties": {"$ref": {"type": "string"}}},
}


@pytest.mark.parametrize("name", list(USABLE))
def test_usable_schemas_pass_and_validate(name: str) -> None:
    schema = USABLE[name]
    assert schema_problem(schema) is None
    # ...and the validator the call path uses can run them without raising.
    list(Draft202012Validator(schema).iter_errors({"a": "x", "b": 1, "c": None, "s": {}}))


def test_unusable_schemas_say_why() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(500):
        deep = {"type": "object", "properties": {"x": deep}}
    cases: dict[str, object] = {
        "dangling": {"properties": {"a": {"$ref": "#/$defs/Missing"}}},
        "relative file": {"properties": {"a": {"$ref": "other.json"}}},
        "dynamic": {"properties": {"a": {"$dynamicRef": "#/$defs/Missing"}}},
        "remote": {"properties": {"a": {"$ref": "https://schemas.invalid/a.json"}}},
        "not a schema": {"type": "frobnicate"},
        "bad required": {"required": 5},
        "a list": [{"type": "object"}],
        "NaN": {"minimum": float("nan")},
        "deep": deep,
    }
    problems = {name: schema_problem(schema) for name, schema in cases.items()}
    assert problems["dangling"] == "has a $ref '#/$defs/Missing' that resolves to nothing"
    assert problems["relative file"] == "has a $ref 'other.json' that resolves to nothing"
    assert problems["dynamic"] == "has a $dynamicRef '#/$defs/Missing' that resolves to nothing"
    assert problems["remote"] == (
        "has a $ref 'https://schemas.invalid/a.json' that resolves to nothing"
    )
    assert (problems["not a schema"] or "").startswith("is not a valid JSON schema (")
    assert "at 'required'" in (problems["bad required"] or "")
    assert problems["a list"] == "is a JSON list, not an object"
    assert (problems["NaN"] or "").startswith("holds values that are not JSON")
    assert problems["deep"] == "is nested more than 100 levels deep"


@pytest.mark.slow
async def test_a_server_with_broken_schemas_binds_and_refuses_only_those(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="lodger.tools.mcp"):
        async with McpServers([broken()]) as servers:
            tools = {t.name: t for t in servers.tools()}
            unusable = servers.unusable()
            fine = await tools["broken__fine"].handler({"text": "hi"}, ctx())
            refusals = {}
            for name in ("broken__dangling", "broken__remote", "broken__nonsense"):
                with pytest.raises(ToolCallError) as caught:
                    await tools[name].handler({"item": 1}, ctx())
                refusals[name] = caught.value
    assert sorted(tools) == [
        "broken__dangling",
        "broken__fine",
        "broken__nonsense",
        "broken__remote",
    ]
    assert sorted(unusable) == ["broken__dangling", "broken__nonsense", "broken__remote"]
    assert isinstance(fine, ToolOutput) and '"tool": "fine"' in fine.content
    assert tools["broken__fine"].parameters["required"] == ["text"]  # good schemas as given
    for name, error in refusals.items():
        assert error.code == "unusable_tool"
        assert str(error).startswith(f"{name} (of MCP server 'broken') cannot be called: ")
        assert unusable[name] in str(error)
        assert tools[name].parameters == {"type": "object"}
        assert f"[lodger cannot call this tool: {unusable[name]}]" in tools[name].description
    assert "'#/$defs/Missing' that resolves to nothing" in str(refusals["broken__dangling"])
    assert "not a valid JSON schema" in str(refusals["broken__nonsense"])
    # one line for the server, naming each, not a line per tool
    (logged,) = [r.getMessage() for r in caplog.records if r.name == "lodger.tools.mcp"]
    assert logged.startswith("MCP server 'broken': 3 tools are bound but cannot be called (")
    assert all(f"{name}: {unusable[name][:100]}" in logged for name in unusable)


@pytest.mark.slow
async def test_calls_of_broken_tools_through_the_agent_are_error_results(tmp_path: Path) -> None:
    names = ["dangling", "remote", "nonsense", "fine"]
    select = '{"query": "select:' + ",".join(f"broken__{n}" for n in names) + '"}'
    steps = [
        (ProposedCall(call_id="find", name="tool_search", arguments=select),),
        tuple(
            ProposedCall(call_id=n, name=f"broken__{n}", arguments='{"item": 1, "text": "x"}')
            for n in names
        ),
    ]
    requests: list[ModelRequest] = []

    def model(request: ModelRequest) -> ModelResponse:
        requests.append(request)
        index = len(requests) - 1
        return ModelResponse(calls=steps[index]) if index < len(steps) else ModelResponse(text="ok")

    async with McpServers([broken()]) as servers:
        agent = Agent(
            model=FunctionModel(model),
            tools=servers.tools(),
            storage=Storage(
                log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
            ),
            services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds("id")),
        )
        result = await agent.run("use them", session="s")
        await agent.close()
    assert result.status == "completed"
    (found,) = [m for m in requests[1].messages if isinstance(m, ToolResultMessage)]
    assert "[lodger cannot call this tool: its input schema has a $ref" in found.content
    results = {m.call_id: m for m in requests[2].messages if isinstance(m, ToolResultMessage)}
    for name in ("dangling", "remote", "nonsense"):
        assert results[name].is_error
        assert f"broken__{name} (of MCP server 'broken') cannot be called" in results[name].content
    assert not results["fine"].is_error and '"tool": "fine"' in results["fine"].content


def test_result_text_with_a_lone_surrogate_is_shown_escaped() -> None:
    import mcp_types

    from lodger.tools.mcp import result_output

    # A server's JSON may carry "\udce9", which decodes to a lone surrogate.
    block = mcp_types.TextContent(type="text", text="caf\udce9.txt")
    output = result_output(mcp_types.CallToolResult(content=[block]))
    assert output.content == "caf\\xe9.txt"

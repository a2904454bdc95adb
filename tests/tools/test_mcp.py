"""MCP servers as tools, against real servers launched as subprocesses.

Servers: ``tests/mcp_servers/tiny_server.py`` (ours, on the official Python SDK; stdio
and streamable HTTP), ``mcp-server-time`` (the reference Python server, from PyPI) and
``@modelcontextprotocol/server-everything`` (the reference TypeScript server, from npm,
installed into ``tests/mcp_servers/node_modules`` by ``scripts/install.sh``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lodger.engine.settings import Services
from lodger.errors import ConfigError
from lodger.events import CallRejected, ProposedCall, ToolDispatched
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import FunctionModel
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.testing import MemoryArtifactStore
from lodger.tools.mcp import McpServerConfig, McpServers, mcp_tool_name
from lodger.tools.spec import Tool, ToolContext, ToolOutput

SERVERS = Path(__file__).parent.parent / "mcp_servers"
TINY = str(SERVERS / "tiny_server.py")
EVERYTHING = SERVERS / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
TIME_SERVER = Path(sys.executable).parent / "mcp-server-time"


def tiny(name: str = "tiny", **options: object) -> McpServerConfig:
    return McpServerConfig(name=name, command=sys.executable, args=(TINY,), **options)  # type: ignore[arg-type]


def ctx() -> ToolContext:
    return ToolContext(session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o")


async def call(tools: list[Tool], name: str, **arguments: object) -> ToolOutput:
    (t,) = [t for t in tools if t.name == name]
    result = await t.handler(dict(arguments), ctx())
    assert isinstance(result, ToolOutput)
    return result


@pytest.fixture
async def http_url() -> AsyncIterator[str]:
    """The tiny server over streamable HTTP on a free loopback port."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, TINY, "--http", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        yield f"http://127.0.0.1:{int(line.split()[1])}/mcp"
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


def test_tool_names_are_prefixed_safe_and_bounded() -> None:
    assert mcp_tool_name("git", "git_log") == "git__git_log"
    assert mcp_tool_name("everything", "get-sum") == "everything__get-sum"
    assert mcp_tool_name("web", "fetch.page v2") == "web__fetch_page_v2"
    long = mcp_tool_name("srv", "x" * 100)
    assert len(long) == 64 and long != mcp_tool_name("srv", "x" * 101)
    with pytest.raises(ConfigError, match="not usable"):
        McpServerConfig(name="a__b", command="x")
    with pytest.raises(ConfigError, match="exactly one of"):
        McpServerConfig(name="a", command="x", url="http://127.0.0.1:1/mcp")


async def test_stdio_lists_and_calls_and_maps_errors() -> None:
    config = tiny(approval=("fail",))
    async with McpServers([config]) as servers:
        tools = servers.tools()
        by_name = {t.name: t for t in tools}
        assert set(by_name) == {
            "tiny__add", "tiny__echo", "tiny__fail", "tiny__crash", "tiny__hang", "tiny__whoami"
        }  # fmt: skip
        add = by_name["tiny__add"]
        assert (add.group, add.deferred, add.approval) == ("tiny", True, False)
        assert by_name["tiny__fail"].approval  # approval per tool, from the config
        assert add.description == "Add two integers and return the sum."
        assert add.parameters["required"] == ["a", "b"]
        assert (await call(tools, "tiny__add", a=2, b=40)) == ToolOutput(content="42")
        failed = await call(tools, "tiny__fail", message="no such branch")
        assert failed.is_error and "no such branch" in failed.content
        assert servers.failures() == {}


@pytest.mark.slow
async def test_http_lists_and_calls(http_url: str) -> None:
    config = McpServerConfig(name="remote", url=http_url, deferred=False, approval=True)
    async with McpServers([config]) as servers:
        tools = servers.tools()
        assert all(t.group == "remote" and not t.deferred and t.approval for t in tools)
        assert (await call(tools, "remote__echo", text="over http")).content == "over http"
        failed = await call(tools, "remote__fail", message="bad")
        assert failed.is_error


@pytest.mark.slow
async def test_a_hung_call_times_out_and_the_server_stays_usable() -> None:
    async with McpServers([tiny(timeout_s=0.3)]) as servers:
        tools = servers.tools()
        with pytest.raises(Exception, match=r"did not answer within 0.3 s") as info:
            await call(tools, "tiny__hang")
        assert type(info.value).__name__ == "ToolCallError"
        assert (await call(tools, "tiny__echo", text="still here")).content == "still here"


@pytest.mark.slow
async def test_a_crashed_stdio_server_gives_clear_errors_and_others_go_on() -> None:
    async with McpServers([tiny("a"), tiny("b")]) as servers:
        tools = servers.tools()
        with pytest.raises(Exception, match=r"MCP server 'a' is not available: ") as info:
            await call(tools, "a__crash")
        assert "may or may not have taken effect" in str(info.value)
        assert list(servers.failures()) == ["a"]
        assert (await call(tools, "b__echo", text="alive")).content == "alive"
        # The next call of its tools starts it again.
        assert (await call(tools, "a__echo", text="back")).content == "back"
        assert servers.failures() == {} and servers.reconnects() == {"a": 1, "b": 0}


@pytest.mark.slow
async def test_a_killed_stdio_server_is_started_again_by_the_next_call() -> None:
    async with McpServers([tiny("k")]) as servers:
        tools = servers.tools()
        first = int((await call(tools, "k__whoami")).content)
        os.kill(first, signal.SIGKILL)  # between calls: nothing is in flight
        assert "exited or closed its connection" in await servers.wait_down("k")
        second = int((await call(tools, "k__whoami")).content)
        assert second != first  # a new server process answered, not an error
        assert (await call(tools, "k__add", a=1, b=2)).content == "3"
        assert servers.reconnects() == {"k": 1}


@pytest.fixture
def tiny_copy(tmp_path: Path) -> Path:
    script = tmp_path / "tiny_server.py"
    shutil.copyfile(TINY, script)
    return script


@pytest.mark.slow
async def test_a_server_that_cannot_start_again_is_an_error_result(tiny_copy: Path) -> None:
    # The server runs from a copy that the test removes once it is up: a restart fails.
    script = tiny_copy
    config = McpServerConfig(name="gone", command=sys.executable, args=(str(script),))
    async with McpServers([config]) as servers:
        tools = servers.tools()
        os.unlink(script)
        with pytest.raises(Exception, match=r"MCP server 'gone' is not available"):
            await call(tools, "gone__crash")
        with pytest.raises(Exception, match=r"did not start again") as info:
            await call(tools, "gone__echo", text="x")
        assert type(info.value).__name__ == "ToolCallError"
        assert servers.reconnects() == {"gone": 0}


@pytest.mark.slow
async def test_a_killed_http_server_gives_clear_errors(http_url: str) -> None:
    async with McpServers([McpServerConfig(name="web", url=http_url)]) as servers:
        tools = servers.tools()
        pid = int((await call(tools, "web__whoami")).content)
        os.kill(pid, 9)
        with pytest.raises(Exception, match=r"MCP server 'web' is not available"):
            await call(tools, "web__echo", text="x")
        with pytest.raises(Exception, match=r"MCP server 'web' is not available"):
            await call(tools, "web__echo", text="y")


@pytest.mark.slow
async def test_a_server_that_cannot_start_is_a_config_error() -> None:
    broken = McpServerConfig(
        name="broken",
        command=sys.executable,
        args=("-c", "import sys; sys.stderr.write('missing API key\\n'); sys.exit(2)"),
    )
    with pytest.raises(ConfigError, match=r"'broken' did not start: .*missing API key"):
        async with McpServers([tiny(), broken]):
            pass
    with pytest.raises(ConfigError, match="did not start"):
        async with McpServers([McpServerConfig(name="nowhere", command="/nonexistent/mcp")]):
            pass


@pytest.mark.slow
async def test_reference_python_server_mcp_server_time() -> None:
    config = McpServerConfig(
        name="time", command=str(TIME_SERVER), args=("--local-timezone", "UTC")
    )
    async with McpServers([config]) as servers:
        tools = servers.tools()
        assert {t.name for t in tools} >= {"time__get_current_time", "time__convert_time"}
        now = json.loads(
            (await call(tools, "time__get_current_time", timezone="Asia/Tokyo")).content
        )
        assert now["timezone"] == "Asia/Tokyo"
        bad = await call(tools, "time__get_current_time", timezone="Mars/Olympus")
        assert bad.is_error and "Mars/Olympus" in bad.content


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_reference_typescript_server_everything(transport: str) -> None:
    assert EVERYTHING.is_file(), "run scripts/install.sh (npm ci in tests/mcp_servers)"
    node = shutil.which("node")
    assert node is not None
    if transport == "stdio":
        config = McpServerConfig(name="everything", command=node, args=(str(EVERYTHING),))
        async with McpServers([config]) as servers:
            await _check_everything(servers.tools())
        return
    with socket.socket() as probe:  # the server takes its port from PORT only
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        node, str(EVERYTHING), "streamableHttp", env={**os.environ, "PORT": str(port)},
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        while b"listening" not in await asyncio.wait_for(proc.stderr.readline(), 20):
            pass
        config = McpServerConfig(name="everything", url=f"http://127.0.0.1:{port}/mcp")
        async with McpServers([config]) as servers:
            await _check_everything(servers.tools())
    finally:
        proc.kill()
        await proc.wait()


async def _check_everything(tools: list[Tool]) -> None:
    names = {t.name for t in tools}
    assert {"everything__echo", "everything__get-sum"} <= names
    assert "hello" in (await call(tools, "everything__echo", message="hello")).content
    assert "5" in (await call(tools, "everything__get-sum", a=2, b=3)).content


# ---------------------------------------------------------------- through the agent


def _results(request: ModelRequest) -> dict[str, ToolResultMessage]:
    return {m.call_id: m for m in request.messages if isinstance(m, ToolResultMessage)}


@pytest.mark.slow
async def test_mcp_tools_through_the_agent_validate_search_and_survive_a_crash(
    tmp_path: Path,
) -> None:
    requests: list[ModelRequest] = []
    select = '{"query": "select:tiny__add,tiny__crash,tiny__echo"}'
    steps = [
        (ProposedCall(call_id="find", name="tool_search", arguments=select),),
        (
            ProposedCall(call_id="bad", name="tiny__add", arguments='{"a": "one", "b": 2}'),
            ProposedCall(call_id="ok", name="tiny__add", arguments='{"a": 1, "b": 2}'),
        ),
        (ProposedCall(call_id="boom", name="tiny__crash", arguments="{}"),),
        (ProposedCall(call_id="after", name="tiny__echo", arguments='{"text": "x"}'),),
    ]

    def model(request: ModelRequest) -> ModelResponse:
        requests.append(request)
        index = len(requests) - 1
        return ModelResponse(calls=steps[index]) if index < len(steps) else ModelResponse(text="ok")

    async with McpServers([tiny()]) as servers:
        agent = Agent(
            model=FunctionModel(model),
            tools=servers.tools(),
            storage=Storage(
                log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
            ),
            services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds("id")),
        )
        result = await agent.run("add", session="s")
        events = await agent.session("s").events()
        await agent.close()
    assert result.status == "completed"
    assert [t.name for t in requests[0].tools] == ["tool_search"]  # MCP tools are deferred
    assert "- tiny: tiny__add, tiny__crash, tiny__echo, tiny__fail" in requests[0].system
    second = _results(requests[2])
    assert second["bad"].is_error and "invalid arguments for tiny__add" in second["bad"].content
    assert second["ok"].content == "3"
    assert "is not available" in _results(requests[3])["boom"].content
    assert _results(requests[4])["after"].content == "x"  # the server was started again
    rejected = [e.call_id for e in events if isinstance(e.body, CallRejected)]
    dispatched = [e.call_id for e in events if isinstance(e.body, ToolDispatched)]
    assert rejected == ["bad"]  # schema validation stopped it before dispatch
    assert "bad" not in dispatched and "ok" in dispatched
    # Each MCP call takes a unit of its server's capacity (unlimited unless configured).
    resources = {e.body.resources for e in events if isinstance(e.body, ToolDispatched)}
    assert ("capacity:mcp:tiny",) in resources

"""Audit: a hostile MCP server (``tests/mcp_servers/hostile_server.py``, raw JSON-RPC over
stdio, no SDK) against lodger's MCP client. Each test names what the server does; the
client must bind what can be bound, turn every failure into an error result the model
can act on, and never hang, crash the turn or hold unbounded memory."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import TextIO, cast

import pytest

from lodger.errors import ConfigError, ToolCallError
from lodger.runtime.config import load_mcp_servers
from lodger.tools.mcp import (
    MAX_DESCRIPTION,
    MAX_STDERR_BYTES,
    MAX_TOOLS_PER_SERVER,
    McpServerConfig,
    McpServers,
    _Connection,
    tools_from_definitions,
)
from lodger.tools.registry import ToolRegistry
from lodger.tools.spec import Tool, ToolContext, ToolOutput

HOSTILE = str(Path(__file__).parent.parent / "mcp_servers" / "hostile_server.py")


def hostile(*modes: str, name: str = "h", **options: object) -> McpServerConfig:
    return McpServerConfig(
        name=name,
        command=sys.executable,
        args=(HOSTILE, *modes),
        **options,  # type: ignore[arg-type]
    )


def ctx() -> ToolContext:
    return ToolContext(session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o")


async def call(tools: list[Tool], name: str, **arguments: object) -> ToolOutput:
    (t,) = [t for t in tools if t.name == name]
    result = await t.handler(dict(arguments), ctx())
    assert isinstance(result, ToolOutput)
    return result


async def test_names_that_collide_after_mangling_are_bound_apart_and_each_reaches_its_tool() -> (
    None
):
    # "a.b", "a_b" and "a b" all mangle to h__a_b; "dup" is listed twice. A registry
    # refuses two tools of one name, so this used to stop the whole run (duplicate_tool).
    async with McpServers([hostile("collide")]) as mcp:
        tools = mcp.tools()
        names = [t.name for t in tools]
        ToolRegistry(tools)  # raised UsageError(duplicate_tool) before the fix
        assert len(names) == len(set(names))
        assert names.count("h__dup") == 1
        collided = [t for t in tools if t.name.startswith("h__a_b")]
        assert len(collided) == 3 and collided[0].name == "h__a_b"
        reached = set()
        for t in collided:
            out = await t.handler({"text": "x"}, ctx())
            assert isinstance(out, ToolOutput) and not out.is_error
            reached.add(out.content)
        # each bound name calls its own server tool
        assert reached == {
            f'{{"tool": "{raw}", "arguments": {{"text": "x"}}}}' for raw in ("a.b", "a_b", "a b")
        }


async def test_names_of_two_servers_that_collide_after_mangling_are_bound_apart() -> None:
    # h's "_echo" and h_'s "echo" are both h___echo: the run stopped with duplicate_tool.
    async with McpServers([hostile("underscore"), hostile(name="h_")]) as mcp:
        tools = mcp.tools()
        ToolRegistry(tools)  # raised UsageError(duplicate_tool) before the fix
        clashing = [t for t in tools if t.name.startswith("h___echo")]
        assert len(clashing) == 2 and [t.group for t in clashing] == ["h", "h_"]
        for t in clashing:
            out = await t.handler({"text": t.group}, ctx())
            assert isinstance(out, ToolOutput) and f'"text": "{t.group}"' in out.content


def test_a_catalog_with_colliding_names_binds_them_apart() -> None:
    schema = {"type": "object"}
    tools = tools_from_definitions(
        [
            {"name": "x.y", "group": "g", "inputSchema": schema},
            {"name": "x_y", "group": "g", "inputSchema": schema},
            {"name": "x_y", "group": "g", "inputSchema": schema},
        ]
    )
    ToolRegistry(tools)
    assert [t.name for t in tools] == ["g__x_y", f"g__x_y_{tools[1].name[-8:]}"]


async def test_garbage_and_bytes_that_are_not_utf8_on_stdout_before_the_protocol() -> None:
    # Used to fail to start after the whole connect timeout, on a UnicodeDecodeError.
    started = time.monotonic()
    async with McpServers([hostile("garbage", connect_timeout_s=15)]) as mcp:
        assert time.monotonic() - started < 10
        out = await call(mcp.tools(), "h__echo", text="hi")
        assert not out.is_error and '"hi"' in out.content


async def test_a_crash_after_bytes_that_are_not_utf8_on_stderr_still_names_its_last_line() -> None:
    async with McpServers([hostile()]) as mcp:
        with pytest.raises(ToolCallError, match=r"not available.*the server gave up"):
            await call(mcp.tools(), "h__crash")


def test_the_stderr_tail_reads_only_the_end_of_a_huge_stderr() -> None:
    connection = _Connection(McpServerConfig(name="h", command=sys.executable))
    with tempfile.TemporaryFile("w+") as stderr:
        chunk = "e" * 1023 + "\n"
        for _ in range(30 * 1024):  # 30 MB, as a flooding server writes it
            stderr.write(chunk)
        stderr.write("the last line\n")
        stderr.flush()
        connection._stderr = cast(TextIO, stderr)
        tracemalloc.start()
        try:
            tail = connection._stderr_tail()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert tail == "the last line"
        assert peak < 1_000_000, f"read {peak} bytes to find one line"


async def test_an_answer_with_the_wrong_id_is_a_timeout_result_and_the_server_stays() -> None:
    async with McpServers([hostile("wrong-id", timeout_s=1)]) as mcp:
        with pytest.raises(ToolCallError, match="did not answer within 1 s"):
            await call(mcp.tools(), "h__echo", text="x")
        assert mcp.failures() == {}


async def test_a_flood_of_log_notifications_does_not_lose_the_answer() -> None:
    async with McpServers([hostile("notify-flood", timeout_s=30)]) as mcp:
        out = await call(mcp.tools(), "h__echo", text="after the flood")
        assert not out.is_error and "after the flood" in out.content


async def test_a_content_block_of_an_unknown_type_is_an_error_result() -> None:
    async with McpServers([hostile("odd-content")]) as mcp:
        with pytest.raises(ToolCallError, match="invalid result"):
            await call(mcp.tools(), "h__odd")
        out = await call(mcp.tools(), "h__echo", text="still here")
        assert "still here" in out.content


async def test_a_huge_description_is_cut_and_a_huge_schema_makes_the_tool_unusable() -> None:
    # A direct tool's description and schema go into every model request: 10 MB of
    # description (or 5 MB of schema) used to be bound as listed, so every step would
    # carry it (and fail at the provider for its size).
    # (its listing is 15 MB: a server allowed messages that large, the bounds still hold)
    allowed = hostile("huge-description", deferred=False, max_message_bytes=32 << 20)
    async with McpServers([allowed]) as mcp:
        tools = {t.name: t for t in mcp.tools()}
        echo, big = tools["h__echo"], tools["h__big"]
        assert len(echo.description) < MAX_DESCRIPTION + 200
        assert echo.description.startswith("search the web for pages")
        assert "lodger cut this description: it has 10000000 characters" in echo.description
        assert len(json.dumps(big.parameters)) < 100
        assert "bytes of JSON, more than 65536" in mcp.unusable()["h__big"]
        with pytest.raises(ToolCallError, match="cannot be called"):
            await call(mcp.tools(), "h__big", text="x")
        out = await call(mcp.tools(), "h__echo", text="the cut tool still works")
        assert "the cut tool still works" in out.content


async def test_a_tool_the_sdk_would_refuse_is_unusable_and_the_others_still_bind() -> None:
    # The SDK refuses a whole tools/list answer when one tool's schema is not an object
    # (the MCP spec requires it): the server used to fail to start ("2 problems; the
    # first at tools.1.inputSchema.type"), and none of its tools could be used.
    async with McpServers([hostile("not-object")]) as mcp:
        tools = {t.name: t for t in mcp.tools()}
        assert sorted(tools) == ["h__big", "h__crash", "h__echo", "h__odd"]
        unusable = mcp.unusable()
        assert sorted(unusable) == ["h__big", "h__odd"]
        assert unusable["h__big"].startswith("its definition is not valid MCP (at inputSchema")
        assert tools["h__big"].parameters == {"type": "object"}
        with pytest.raises(ToolCallError, match="cannot be called: its definition is not valid"):
            await call(mcp.tools(), "h__big", text="x")
        out = await call(mcp.tools(), "h__echo", text="the others work")
        assert not out.is_error and "the others work" in out.content


async def test_a_server_that_never_answers_initialize_fails_within_its_connect_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(ConfigError, match="did not finish connecting in time"):
        async with McpServers([hostile("mute", connect_timeout_s=1)]):
            pass
    assert time.monotonic() - started < 10


async def test_a_listing_of_20000_tools_binds_the_first_2000_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Binding checks each schema on the event loop (about 0.5 ms each): 20 000 tools
    # took 10 s of a stalled loop, 100 000 would take a minute.
    started = time.monotonic()
    async with McpServers([hostile("many-tools")]) as mcp:
        names = [t.name for t in mcp.tools()]
        assert len(names) == MAX_TOOLS_PER_SERVER == 2000
        assert names[:3] == ["h__echo", "h__big", "h__odd"]
        out = await call(mcp.tools(), "h__tool_100", text="x")
        assert '"tool_100"' in out.content
    assert time.monotonic() - started < 20
    assert "lists more than 2000 tools" in caplog.text


async def test_a_server_asking_for_sampling_roots_or_elicitation_gets_errors_only() -> None:
    # lodger offers no sampling, roots or elicitation: a server that asks anyway must be
    # refused (never a model call on its behalf, never the workspace's paths) and its
    # calls still answered.
    async with McpServers([hostile("asks-client", timeout_s=10)]) as mcp:
        first = await call(mcp.tools(), "h__echo", text="one")
        assert not first.is_error
        for _ in range(100):  # the answers to its requests arrive after its call's answer
            answers = json.loads((await call(mcp.tools(), "h__echo", text="two")).content)
            if len(answers["answers"]) == 3:
                break
        assert sorted(a["id"] for a in answers["answers"]) == ["srv0", "srv1", "srv2"]
        for answer in answers["answers"]:
            assert "result" not in answer and "error" in answer, answer


async def test_an_error_message_of_a_megabyte_at_start_is_cut() -> None:
    # The server's own message used to be copied whole into the ConfigError (printed on
    # the terminal) and into failures().
    with pytest.raises(ConfigError) as caught:
        async with McpServers([hostile("init-error")]):
            pass
    message = str(caught.value)
    assert "MCP server 'h' did not start: <html>the server is sad" in message
    assert len(message) < 1000 and "more characters cut" in message


async def test_an_http_server_answering_what_is_not_json_rpc_fails_on_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The SDK's message quotes pydantic's page of validation errors (11 lines here).
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "providers"))
    from wire_server import Fail, WireServer

    with WireServer() as server:
        server.push(*[Fail(200, {"html": "<html>a proxy's page</html>"})] * 3)
        config = McpServerConfig(name="w", url=f"{server.base_url}/mcp", connect_timeout_s=5)
        with pytest.raises(ConfigError) as caught:
            async with McpServers([config]):
                pass
    message = str(caught.value)
    assert "\n" not in message and "MCP server 'w' did not start" in message
    assert "more lines cut" in message


@pytest.mark.parametrize("key", ["timeout_s", "connect_timeout_s"])
def test_a_timeout_of_nan_is_a_config_error(key: str, tmp_path: Path) -> None:
    # TOML has nan; it passed "timeout <= 0" and then failed every call with a raw
    # "ValueError: deadline must not be NaN" (or failed the start as "not in time").
    with pytest.raises(ConfigError, match="timeouts must be positive"):
        McpServerConfig(name="a", command="x", **{key: float("nan")})  # type: ignore[arg-type]
    (tmp_path / "lodger.toml").write_text(
        f'[mcp.servers.a]\ncommand = "x"\n{key} = nan\n', encoding="utf-8"
    )
    with pytest.raises(ConfigError, match="timeouts must be positive"):
        load_mcp_servers(tmp_path)


async def test_a_server_flooding_its_stderr_keeps_at_most_a_megabyte_on_disk() -> None:
    # 20 MB written to stderr at start (and every byte was kept in the temporary file:
    # a server writing without end filled the disk). The last line stays readable.
    async with McpServers([hostile("stderr-flood")]) as mcp:
        stderr = mcp._connections[0]._stderr
        assert stderr is not None
        size = os.fstat(stderr.fileno()).st_size
        tail = ""
        # trimmed within a second or so of connecting; the server's last line comes after
        # its 20 MB, so wait for it too (on a loaded machine the file can be within the
        # limit while the flood is still being written)
        for _ in range(300):
            size = os.fstat(stderr.fileno()).st_size
            tail = mcp._connections[0]._stderr_tail()
            if size <= MAX_STDERR_BYTES and tail == "the last stderr line":
                break
            await asyncio.sleep(0.1)
        assert size <= MAX_STDERR_BYTES
        assert tail == "the last stderr line"
        with pytest.raises(ToolCallError, match=r"not available.*the server gave up"):
            await call(mcp.tools(), "h__crash")

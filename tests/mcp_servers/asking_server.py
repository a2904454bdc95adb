"""An MCP server that asks its client things while its tools run, for lodger's tests.

    python asking_server.py          # stdio

Built on the official SDK's ``MCPServer``. Its tools ask the user for a name and a
password (the password's field is marked ``format: password``), send the user to a URL,
ask for model completions (``times`` of them: a sampling loop), read the client's roots,
change the tool listing (``notifications/tools/list_changed``, once or in a storm, with a
broken schema), and die in the middle of a call. Each answers with what it got, so a test
can check what reached the server.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

server = MCPServer("asking")
_added: list[str] = []


@server.tool()
async def sign_in(ctx: Context) -> str:
    """Ask the user for a name and a password, and say what came back."""
    schema = {
        "type": "object",
        "properties": {
            "user": {"type": "string", "title": "User name"},
            "password": {"type": "string", "format": "password", "title": "Password"},
        },
        "required": ["user", "password"],
    }
    answer = await ctx.request_context.session.elicit(
        "Sign in to the test service", schema, related_request_id=ctx.request_id
    )
    content = answer.content or {}
    return (
        f"action={answer.action} user={content.get('user')} "
        f"password_length={len(str(content.get('password', '')))}"
    )


@server.tool()
async def open_link(ctx: Context) -> str:
    """Send the user to a URL and say whether they went."""
    answer = await ctx.elicit_url(
        "Authorize the test service", "https://auth.example.test/authorize?code=s3cr3t", "e-1"
    )
    return f"action={answer.action}"


@server.tool()
async def think(ctx: Context, times: int = 1) -> str:
    """Ask the client's model ``times`` times; say how many answered and how many refused."""
    answered, refused, last = 0, 0, ""
    for n in range(times):
        try:
            result = await ctx.request_context.session.create_message(
                [
                    types.SamplingMessage(
                        role="user", content=types.TextContent(type="text", text=f"question {n}")
                    )
                ],
                max_tokens=50,
                system_prompt="answer briefly",
                related_request_id=ctx.request_id,
            )
        except Exception as exc:  # noqa: BLE001 - the client's refusal, as a count
            refused += 1
            last = str(exc)
            continue
        answered += 1
        last = result.content.text if isinstance(result.content, types.TextContent) else ""
    return f"answered={answered} refused={refused} last={last}"


@server.tool()
async def roots(ctx: Context) -> str:
    """The client's roots, one URI a line (or the error)."""
    try:
        listed = await ctx.request_context.session.list_roots()
    except Exception as exc:  # noqa: BLE001 - the client's refusal, as text
        return f"refused: {exc}"
    return "\n".join(str(r.uri) for r in listed.roots) or "none"


@server.tool()
async def grow(ctx: Context, name: str) -> str:
    """Add a tool named ``name`` (it echoes its text), remove the last one added, and
    tell the client its listing changed."""

    def echo(text: str) -> str:
        return text

    if _added:
        server.remove_tool(_added.pop())
    server.add_tool(echo, name=name, description=f"echo, added as {name}")
    _added.append(name)
    await ctx.request_context.session.send_tool_list_changed()
    return f"added {name}"


@server.tool()
async def storm(ctx: Context, times: int = 100) -> str:
    """Add ``broken`` (an input schema that is not a JSON schema) and ``whole`` (a fine
    one), then say the listing changed ``times`` times in a row."""

    def whole(text: str) -> str:
        return text

    server.add_tool(whole, name="whole", description="a fine tool added by a storm")
    server.add_tool(whole, name="broken", description="a tool whose schema is nonsense")
    tool = server._tool_manager.get_tool("broken")
    assert tool is not None
    tool.parameters = {"type": "object", "properties": {"x": {"type": "frobnicate"}}}
    for _ in range(times):
        await ctx.request_context.session.send_tool_list_changed()
    return f"stormed {times}"


@server.tool()
async def die_asking(ctx: Context) -> str:
    """Ask the user a question, and die a moment later, before any answer is read."""

    async def die() -> None:
        await anyio.sleep(0.3)
        sys.stdout.flush()
        os._exit(5)

    async with anyio.create_task_group() as group:
        group.start_soon(die)
        await ctx.request_context.session.elicit(
            "Are you there?",
            {"type": "object", "properties": {"yes": {"type": "boolean"}}},
            related_request_id=ctx.request_id,
        )
    return "unreachable"


class _HandshakeEra:
    """The server's read stream with ``server/discover`` answered "not found" before the
    SDK sees it: a handshake-era server, as the reference TypeScript server and most
    servers in use are (their requests to the client are JSON-RPC requests of their own)."""

    def __init__(self, read: Any, write: Any) -> None:
        self._read, self._write = read, write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._read, name)

    def __aiter__(self) -> _HandshakeEra:
        return self

    async def __anext__(self) -> Any:
        while True:
            item = await self._read.__anext__()
            message = getattr(item, "message", None)
            if isinstance(message, types.JSONRPCRequest) and message.method == "server/discover":
                error = types.ErrorData(code=types.METHOD_NOT_FOUND, message="not found")
                reply = types.JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
                await self._write.send(SessionMessage(reply))
                continue
            return item

    async def receive(self) -> Any:
        return await self.__anext__()


async def _main() -> None:
    low = server._lowlevel_server
    async with stdio_server() as (read, write):
        await low.run(_HandshakeEra(read, write), write, low.create_initialization_options())


if __name__ == "__main__":
    anyio.run(_main)

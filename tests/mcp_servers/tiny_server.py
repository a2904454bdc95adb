"""A tiny MCP server for lodger's tests, built on the official SDK's ``MCPServer``.

    python tiny_server.py            # stdio
    python tiny_server.py --http     # streamable HTTP on 127.0.0.1, a free port

Over HTTP it prints ``PORT <n>`` on stdout once it listens, so a test can connect
without guessing a free port. Tools cover the cases the runtime must handle: a plain
result, a tool error (``isError``), a crash of the whole server, and a hang.
"""

from __future__ import annotations

import os
import sys

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("tiny")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers and return the sum."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def fail(message: str) -> str:
    """Always fail with the given message (an isError result)."""
    raise ToolError(message)


@server.tool()
def crash() -> str:
    """Kill the server process at once, as a crash would."""
    sys.stdout.flush()
    os._exit(3)


@server.tool()
async def hang(seconds: float = 3600) -> str:
    """Sleep for a long time before answering."""
    await anyio.sleep(seconds)
    return "woke up"


@server.tool()
def whoami() -> str:
    """The server's process id (to check that a restarted server is a new process)."""
    return str(os.getpid())


async def _serve_http() -> None:
    import socket

    import uvicorn

    # Bind and listen first, so the port is known and connections queue until served.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    if "--http" in sys.argv[1:]:
        anyio.run(_serve_http)
    else:
        server.run("stdio")

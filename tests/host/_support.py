"""A real host for the tests: uvicorn on a loopback socket, in the test's event loop."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from lodger.client import HostClient
from lodger.host import HookConfig, HostConfig, SqliteHostControl, create_app
from lodger.host.auth import new_token
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage

from . import host_tools

TOOLS = (host_tools.echo, host_tools.deploy, host_tools.gate)


def write_script(path: Path, steps: Sequence[Any]) -> str:
    path.write_text(json.dumps(steps))
    return f"script:{path}"


@dataclass
class Host:
    url: str
    token: str
    app: Any
    control: SqliteHostControl
    state: Path

    def client(self, token: str | None = None) -> HostClient:
        return HostClient(self.url, token=token or self.token)


@asynccontextmanager
async def running_host(
    state: Path,
    *,
    models: tuple[str, ...] = ("test",),
    hooks: dict[str, HookConfig] | None = None,
    observers: tuple[Any, ...] = (),
    workspaces: Path | None = None,
    code_mode: Any = None,
    trust_projects: bool = False,
    budgets: Any = None,
) -> AsyncIterator[Host]:
    storage = Storage.local(state)
    control = SqliteHostControl(state / "host.sqlite3")
    sessions = Sessions(storage)
    token = new_token()
    await control.add_token(token, scope="admin", session_id=None, label="test-admin")
    app = create_app(
        sessions,
        control,
        HostConfig(
            models=models,
            tools=TOOLS,
            workspaces=workspaces,
            code_mode=code_mode,
            trust_projects=trust_projects,
            budgets=budgets,
        ),
        hooks=hooks,
        observers=observers,
        poll_s=0.5,
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield Host(f"http://127.0.0.1:{port}", token, app, control, state)
    finally:
        server.should_exit = True
        await task
        sock.close()
        await sessions.close()
        await control.close()


@dataclass
class Setup:
    """Where a distributed-mode test keeps things: an object store URL, a control-plane
    DSN, and a directory holding the script the host offers as its model."""

    store: str
    dsn: str
    dir: Path

    @property
    def model(self) -> str:
        """The script the host offers as its model; workers run with it."""
        return f"script:{self.dir / 'script.json'}"

    def script(self, steps: list[dict[str, Any]]) -> None:
        (self.dir / "script.json").write_text(json.dumps(steps))

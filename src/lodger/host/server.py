"""Running the host: storage, the control index, an admin token and uvicorn.

With ``control_dsn`` the host is distributed: it opens the control plane workers share
and runs no turns (``lodger.host.distributed``).

``serve(...)`` is what ``lodger serve`` calls. The admin token comes from
``$LODGER_HOST_TOKEN`` (stored hashed) or is made afresh and printed once on stdout,
never to a log. In distributed mode tokens are kept (hashed) in the control plane, so a
token any host made or was started with opens every host in front of it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path

import uvicorn

from lodger.events import Event
from lodger.host.app import create_app
from lodger.host.auth import TOKEN_ENVVAR, new_token
from lodger.host.hub import HostConfig, Hub
from lodger.host.telemetry import tracer_from_env
from lodger.host.webhooks import HookConfig
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage
from lodger.storage.control import ControlPlane, open_control
from lodger.storage.control.host_index import SqliteHostControl
from lodger.storage.control.shared_host_index import SharedHostControl

__all__ = ["serve"]


async def serve(
    *,
    state: str,
    store: str | None,
    control_path: str | None,
    host: str,
    control_dsn: str | None = None,
    poll_s: float | None = None,
    port: int,
    config: HostConfig,
    hooks: dict[str, HookConfig],
    access_log: bool = False,
    say: Callable[[str], None] = print,
) -> None:
    plane: ControlPlane | None = None
    if control_dsn is not None:
        plane = open_control(control_dsn)  # a bad DSN is refused before anything opens
    storage = Storage.open(state, store=store)
    index = Path(control_path) if control_path else Path(state) / "host.sqlite3"
    # distributed: tokens and webhook deliveries live in the control plane, so every host
    # in front of it accepts the same tokens and maps a delivery to one session
    control = SqliteHostControl(index) if plane is None else SharedHostControl(index, plane)
    sessions = Sessions(storage)
    try:
        if plane is not None:
            await plane.start()
        token = os.environ.get(TOKEN_ENVVAR) or None
        if token is None:
            token = new_token()
            await control.add_token(token, scope="admin", session_id=None, label="serve")
            say(f"admin token: {token}")
        else:
            await control.add_token(token, scope="admin", session_id=None, label="env")
            say(f"admin token: from ${TOKEN_ENVVAR}")
        observers: tuple[Callable[[Event], None], ...] = ()
        spans = tracer_from_env()
        if spans is not None:
            observers = (spans.observe,)

        async def started(hub: Hub) -> None:
            say(f"lodger host on http://{host}:{port} (console: /console#token=TOKEN)")
            sys.stdout.flush()

        app = create_app(
            sessions,
            control,
            config,
            hooks=hooks,
            observers=observers,
            on_started=started,
            plane=plane,
            poll_s=poll_s if poll_s is not None else (1.0 if plane is None else 0.25),
        )
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level="warning",
                access_log=access_log,
                lifespan="on",
                timeout_graceful_shutdown=5,
            )
        )
        await server.serve()
        if spans is not None:
            spans.shutdown()
    finally:
        await sessions.close()
        await control.close()
        if plane is not None:
            await plane.close()
        await asyncio.sleep(0)

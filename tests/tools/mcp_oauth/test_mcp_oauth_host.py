"""The host's login routes: an admin starts a login for a session's MCP server, the
authorization server sends the browser to the host's callback (no token), the session's
turns then bind the server's tools, and the token is in no answer and no stored byte."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest
import uvicorn
from tests.tools.mcp_oauth.guarded import Guarded, approve, every_byte

from lodger.client import HostClient
from lodger.host import HostConfig, SqliteHostControl, create_app
from lodger.host.auth import new_token
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage


@asynccontextmanager
async def _host(state: Path, workspaces: Path, model: str) -> AsyncIterator[tuple[str, str]]:
    storage = Storage.local(state)
    control = SqliteHostControl(state / "host.sqlite3")
    sessions = Sessions(storage)
    token = new_token()
    await control.add_token(token, scope="admin", session_id=None, label="admin")
    config = HostConfig(models=(model,), workspaces=workspaces, trust_projects=True)
    app = create_app(sessions, control, config, poll_s=0.2)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", token
    finally:
        server.should_exit = True
        await task
        sock.close()
        await sessions.close()
        await control.close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as page:
            return page.status, page.read().decode()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read().decode()


@pytest.mark.slow
async def test_a_login_through_the_host_then_its_turns_bind_the_tools(
    guarded: Guarded, tmp_path: Path, config_dir: Path
) -> None:
    workspaces = tmp_path / "workspaces"
    (workspaces / "h1").mkdir(parents=True)
    (workspaces / "h1" / "lodger.toml").write_text(
        '[permissions]\nallow = ["guarded__echo"]\n'
        f'[mcp.servers.guarded]\nurl = "{guarded.url}"\ndeferred = false\noauth = true\n'
    )
    script = tmp_path / "script.json"
    calls = [{"name": "guarded__echo", "args": {"text": "through the host"}}]
    script.write_text(json.dumps([{"calls": calls}, {"text": "done"}]))
    state = tmp_path / "state"
    async with _host(state, workspaces, f"script:{script}") as (base, admin):
        client = HostClient(base, token=admin)
        await client.create_session(session_id="h1")
        session_token = await client.make_token(session_id="h1")
        async with httpx2.AsyncClient(base_url=base, timeout=60) as http:
            body = {"session_id": "h1", "server": "guarded"}
            refused = await http.post(
                "/v1/mcp/logins", json=body, headers={"Authorization": f"Bearer {session_token}"}
            )
            assert refused.status_code == 403
            started = await http.post(
                "/v1/mcp/logins", json=body, headers={"Authorization": f"Bearer {admin}"}
            )
            assert started.status_code == 201, started.text
            view = started.json()
            assert view["redirect_uri"] == f"{base}/oauth/mcp/callback"
            before = guarded.state()
            callback = await asyncio.to_thread(approve, view["authorization_url"])
            assert callback.startswith(view["redirect_uri"] + "?")
            status, page = await asyncio.to_thread(_get, callback)  # a browser: no token
            assert status == 200 and "Logged in to MCP server" in page, page
            again, page = await asyncio.to_thread(_get, callback)  # a replay is refused
            assert again == 404 and "matches no login in progress" in page
            after = guarded.state()
            (access,) = set(after["access"]) - set(before["access"])
            (refresh,) = set(after["refresh"]) - set(before["refresh"])

            listed = await http.get(
                "/v1/mcp/logins",
                params={"session_id": "h1"},
                headers={"Authorization": f"Bearer {admin}"},
            )
            assert listed.json()["servers"][0]["logged_in"] is True
            sent = await client.send("h1", "go")
            done = await client.wait_message("h1", sent["message"]["id"], within=60)
            assert done["status"] == "done", done
            events = json.dumps([e.data for e in await client.events("h1")])
            assert "through the host" in events
            out = await http.post(
                "/v1/mcp/logins/guarded/logout",
                json={"session_id": "h1"},
                headers={"Authorization": f"Bearer {admin}"},
            )
            assert out.json()["revoked"] == ["refresh_token", "access_token"]
            answers = started.text + listed.text + out.text + page + events
        await client.aclose()
    written = every_byte(state, workspaces).decode("latin-1") + answers
    for secret in (access, refresh):
        assert secret not in written
    assert "guarded__echo" in written

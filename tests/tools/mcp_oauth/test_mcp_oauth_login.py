"""``lodger mcp login`` against a real local authorization server, then the server's
tools bound with the token (CLI and library), refresh, logout with revocation, and the
token found in none of the bytes the session wrote."""

from __future__ import annotations

import asyncio
import json
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from tests.tools.mcp_oauth.guarded import (
    Guarded,
    approve,
    callback_query,
    cli_env,
    every_byte,
    login,
)

from lodger.tools._mcp_credentials import FileCredentialStore
from lodger.tools._mcp_oauth import McpOAuth
from lodger.tools.mcp import McpServerConfig, McpServers


def _project(tmp_path: Path, url: str) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "lodger.toml").write_text(
        'model = "script:script.json"\n'
        "[permissions]\n"
        'allow = ["guarded__echo"]\n'
        "[mcp.servers.guarded]\n"
        f'url = "{url}"\n'
        "deferred = false\n"
        "oauth = true\n"
    )
    calls = [{"name": "guarded__echo", "args": {"text": "through the login"}}]
    (ws / "script.json").write_text(json.dumps([{"calls": calls}, {"text": "done"}]))
    return ws


def _lodger(cwd: Path, config_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodger", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=cli_env(config_dir),
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_login_through_the_loopback_then_a_run_binds_the_tools_and_never_writes_the_token(
    guarded: Guarded, tmp_path: Path, config_dir: Path
) -> None:
    ws = _project(tmp_path, guarded.url)
    before = guarded.state()
    done = login(ws, config_dir)
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["logged_in"] and view["issuer"] == guarded.base and view["refreshable"]
    # the login: mode 600 in a mode-700 directory of the user's config dir
    saved = config_dir / "mcp-logins" / "guarded.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE(saved.parent.stat().st_mode) == 0o700
    after = guarded.state()
    assert after["issued"] == before["issued"] + 1
    (access,) = set(after["access"]) - set(before["access"])
    (refresh,) = set(after["refresh"]) - set(before["refresh"])
    assert access in saved.read_text()  # it is there, and only there

    state = tmp_path / "state"
    ran = _lodger(ws, config_dir, "run", "go", "--trust", "--session", "s1", "--state",
                  str(state))  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    shown = _lodger(ws, config_dir, "log", "show", "s1", "--state", str(state), "--json")
    assert '"through the login"' in shown.stdout  # the tool ran with the token
    store = tmp_path / "store"  # the object-store layout, through file://
    stored = _lodger(ws, config_dir, "run", "go", "--trust", "--session", "s3", "--store",
                     f"file://{store}")  # fmt: skip
    assert stored.returncode == 0, stored.stderr
    status = _lodger(ws, config_dir, "mcp", "status", "--trust", "--json")
    assert json.loads(status.stdout)["servers"][0]["logged_in"] is True
    untrusted = _lodger(ws, config_dir, "mcp", "status")  # a file nobody trusted starts none
    assert "is not trusted" in untrusted.stderr
    assert "no MCP server with OAuth" in untrusted.stdout

    written = b"".join(
        [
            every_byte(state, ws, store),
            *(
                p.stdout.encode() + p.stderr.encode()
                for p in (done, ran, shown, stored, status, untrusted)
            ),
        ]
    )
    assert b"through the login" in every_byte(store)  # the run there called the tool
    for secret in (access, refresh):
        assert secret.encode() not in written
    assert b"guarded__echo" in written  # the check reads the session's real bytes

    out = _lodger(ws, config_dir, "mcp", "logout", "guarded", "--trust", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "v": 1,
        "server": "guarded",
        "revoked": ["refresh_token", "access_token"],
        "deleted": True,
    }
    gone = guarded.state()
    assert access not in gone["access"] and refresh not in gone["refresh"]
    assert not saved.exists()
    again = _lodger(ws, config_dir, "run", "go", "--trust", "--session", "s2", "--state",
                    str(state))  # fmt: skip
    assert again.returncode != 0
    assert "lodger mcp login guarded" in again.stderr and "Traceback" not in again.stderr
    assert "check its command" not in again.stderr  # the login is the next step, not the url


async def _logged_in(guarded: Guarded, store: FileCredentialStore) -> McpOAuth:
    """Log in through the library's service (the same steps as the CLI's)."""
    from lodger.runtime.mcp_logins import McpLogins

    oauth = McpOAuth(store=store)
    config = McpServerConfig(name="guarded", url=guarded.url, auth=oauth)
    logins = McpLogins([config])
    pending = await logins.begin("guarded", redirect_uri="http://127.0.0.1:9/callback")
    query = callback_query(approve(pending.authorization_url))
    await logins.finish(state=query["state"], code=query["code"], iss=query.get("iss"))
    return oauth


async def _echo(oauth: McpOAuth, url: str, text: str) -> str:
    config = McpServerConfig(name="guarded", url=url, auth=oauth, deferred=False)
    async with McpServers([config]) as servers:
        (tool,) = servers.tools()
        try:
            return (await tool.handler({"text": text}, None)).content  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - the test reads the tool error's text
            return f"ERROR {exc}"


async def test_an_expired_token_is_refreshed_before_use(guarded: Guarded, tmp_path: Path) -> None:
    guarded.mode(access_ttl=1)  # within the refresh margin from the start
    store = FileCredentialStore(tmp_path / "logins")
    oauth = await _logged_in(guarded, store)
    first = await store.load("guarded")
    before = guarded.state()["refreshed"]
    assert await _echo(oauth, guarded.url, "fresh") == "fresh"
    assert guarded.state()["refreshed"] > before
    second = await store.load("guarded")
    assert first is not None and second is not None
    assert second["access_token"] != first["access_token"]
    assert second["refresh_token"] != first["refresh_token"]  # rotated, and kept


async def test_a_refused_token_is_refreshed_once_and_the_call_retried(
    guarded: Guarded, tmp_path: Path
) -> None:
    store = FileCredentialStore(tmp_path / "logins")
    oauth = await _logged_in(guarded, store)
    guarded.expire()  # the server forgets every access token: its next answer is 401
    before = guarded.state()["refreshed"]
    assert await _echo(oauth, guarded.url, "again") == "again"
    assert guarded.state()["refreshed"] == before + 1


async def test_a_refused_token_whose_refresh_fails_is_a_tool_error_naming_the_login(
    guarded: Guarded, tmp_path: Path
) -> None:
    store = FileCredentialStore(tmp_path / "logins")
    oauth = await _logged_in(guarded, store)
    record = await store.load("guarded")
    assert record is not None
    config = McpServerConfig(name="guarded", url=guarded.url, auth=oauth, deferred=False)
    async with McpServers([config]) as servers:
        (tool,) = servers.tools()
        guarded.expire(refresh=True)  # mid-session: the token and its refresh are dead
        from lodger.errors import ToolCallError

        with pytest.raises(ToolCallError) as caught:
            await tool.handler({"text": "x"}, None)  # type: ignore[arg-type]
        with pytest.raises(ToolCallError) as second:  # still dead, for the same reason
            await tool.handler({"text": "x"}, None)  # type: ignore[arg-type]
        assert "refreshing its token failed" in str(second.value)
        await _logged_in(guarded, store)  # the user logs in again (another process)
        fixed = await tool.handler({"text": "back"}, None)  # type: ignore[arg-type]
        assert fixed.content == "back"  # the running session picked the new login up
    message = str(caught.value)
    assert "needs an OAuth login" in message and "`lodger mcp login guarded`" in message
    assert "refreshing its token failed" in message and "invalid_grant" in message
    assert record["access_token"] not in message and record["refresh_token"] not in message


async def test_a_login_file_others_can_read_is_refused(guarded: Guarded, tmp_path: Path) -> None:
    store = FileCredentialStore(tmp_path / "logins")
    oauth = await _logged_in(guarded, store)
    path = tmp_path / "logins" / "guarded.json"
    path.chmod(0o644)
    from lodger.errors import ConfigError

    with pytest.raises(ConfigError, match="can be read by others"):
        await store.load("guarded")
    with pytest.raises(ConfigError) as caught:
        await _echo_strict(oauth, guarded.url)
    assert "can be read by others" in str(caught.value)


async def _echo_strict(oauth: McpOAuth, url: str) -> None:
    async with McpServers([McpServerConfig(name="guarded", url=url, auth=oauth)]):
        pass


async def test_a_pre_registered_client_logs_in_refreshes_and_its_secret_is_not_kept(
    guarded: Guarded, tmp_path: Path
) -> None:
    import socket

    import httpx2

    from lodger.runtime.mcp_logins import McpLogins

    with socket.socket() as probe:  # a port for the client's registered redirect URI
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    asked = {
        "redirect_uris": [f"http://127.0.0.1:{port}/callback"],
        "token_endpoint_auth_method": "client_secret_post",
        "grant_types": ["authorization_code", "refresh_token"],
        "client_name": "registered by hand",
    }
    async with httpx2.AsyncClient() as http:  # what an operator does once, by hand
        client = (await http.post(f"{guarded.base}/register", json=asked)).json()
    store = FileCredentialStore(tmp_path / "logins")
    oauth = McpOAuth(
        client_id=client["client_id"],
        client_secret=client["client_secret"],
        redirect_port=port,
        store=store,
    )
    logins = McpLogins([McpServerConfig(name="guarded", url=guarded.url, auth=oauth)])
    shown: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(logins.login_loopback("guarded", show=shown.set_result))
    callback = await asyncio.to_thread(approve, await shown)
    assert callback.startswith(f"http://127.0.0.1:{port}/callback?")
    await asyncio.to_thread(_visit, callback)
    login = await task
    assert login.client_id == client["client_id"]
    kept = (tmp_path / "logins" / "guarded.json").read_text()
    assert client["client_secret"] not in kept  # it stays in the configuration
    guarded.expire()
    before = guarded.state()["refreshed"]
    assert await _echo(oauth, guarded.url, "confidential") == "confidential"
    assert guarded.state()["refreshed"] == before + 1  # refreshed with the configured secret
    out = await logins.logout("guarded")
    assert out["revoked"] == ["refresh_token", "access_token"]


def _visit(url: str) -> None:
    with urllib.request.urlopen(url, timeout=10) as page:
        page.read()


async def test_a_damaged_login_file_is_a_clear_refusal(guarded: Guarded, tmp_path: Path) -> None:
    store = FileCredentialStore(tmp_path / "logins")
    oauth = await _logged_in(guarded, store)
    path = tmp_path / "logins" / "guarded.json"
    path.write_bytes(path.read_bytes()[:40])  # cut short, as a full disk might leave it
    from lodger.errors import ConfigError
    from lodger.runtime.mcp_logins import McpLogins

    with pytest.raises(ConfigError, match="is not valid JSON"):
        await _echo_strict(oauth, guarded.url)
    logins = McpLogins([McpServerConfig(name="guarded", url=guarded.url, auth=oauth)])
    (row,) = await logins.status()
    assert row["logged_in"] is False and "is not valid JSON" in row["problem"]


async def test_two_processes_sharing_a_login_survive_each_others_refresh(
    guarded: Guarded, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server rotates refresh tokens: when one process refreshes, the refresh token
    the other holds is spent. The other finds the stored login instead of failing (not
    even once: no refusal is logged)."""
    guarded.mode(access_ttl=1)  # every call refreshes first
    store = FileCredentialStore(tmp_path / "logins")
    oauth = await _logged_in(guarded, store)
    one = McpServerConfig(name="guarded", url=guarded.url, auth=oauth, deferred=False)
    two = McpServerConfig(name="guarded", url=guarded.url, auth=oauth, deferred=False)
    async with McpServers([one]) as first, McpServers([two]) as second:
        (a,), (b,) = first.tools(), second.tools()  # both started: each refreshed once
        for tool, text in ((a, "a1"), (b, "b1"), (a, "a2"), (b, "b2")):
            out = await tool.handler({"text": text}, None)  # type: ignore[arg-type]
            assert out.content == text
    assert guarded.state()["refreshed"] >= 4
    assert "refreshing its token failed" not in caplog.text

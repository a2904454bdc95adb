"""Logins lodger must refuse: metadata that sends credentials elsewhere, a registration or
an authorization endpoint that plays with the redirect, a forged or mismatched callback,
token answers that are huge, cut or not bearer tokens, and a sealed login opened with
the wrong key or under another name."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from tests.tools.mcp_oauth.guarded import Guarded, approve, callback_query

from lodger.errors import ConfigError, McpAuthError
from lodger.runtime.config import server_from_table
from lodger.runtime.mcp_logins import McpLogins
from lodger.storage.control import SqliteControlPlane
from lodger.tools._mcp_credentials import FileCredentialStore, SealedCredentialStore, load_key
from lodger.tools._mcp_oauth import McpOAuth
from lodger.tools.mcp import McpServerConfig

REDIRECT = "http://127.0.0.1:9/callback"


def _logins(guarded: Guarded, tmp_path: Path, **oauth: object) -> tuple[McpLogins, Path]:
    store = FileCredentialStore(tmp_path / "logins")
    auth = McpOAuth(store=store, **oauth)  # type: ignore[arg-type]
    return McpLogins([McpServerConfig(name="guarded", url=guarded.url, auth=auth)]), store.directory


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ("other-origin", "on another origin"),
        ("http", "is not https"),
        ("no-pkce", "does not offer S256 PKCE"),
        ("wrong-issuer", "names the issuer"),
        ("preset-redirect", "carries its own redirect_uri"),
    ],
)
async def test_authorization_server_metadata_that_misleads_is_refused(
    guarded: Guarded, tmp_path: Path, metadata: str, says: str
) -> None:
    guarded.mode(metadata=metadata)
    logins, directory = _logins(guarded, tmp_path)
    before = guarded.state()["issued"]
    with pytest.raises(McpAuthError, match=says):
        await logins.begin("guarded", redirect_uri=REDIRECT)
    assert guarded.state()["issued"] == before and not directory.exists()


async def test_another_origin_is_accepted_only_when_the_config_names_it(
    guarded: Guarded, tmp_path: Path
) -> None:
    guarded.mode(metadata="other-origin")  # its token endpoint is on http://127.0.0.2:9
    logins, _ = _logins(guarded, tmp_path, allowed_origins=("http://127.0.0.2:9",))
    pending = await logins.begin("guarded", redirect_uri=REDIRECT)
    assert pending.token_endpoint == "http://127.0.0.2:9/token"


async def test_a_registration_with_other_redirect_uris_is_refused(
    guarded: Guarded, tmp_path: Path
) -> None:
    guarded.mode(register="other-redirect")
    logins, _ = _logins(guarded, tmp_path)
    with pytest.raises(McpAuthError, match="other redirect URIs"):
        await logins.begin("guarded", redirect_uri=REDIRECT)


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("huge", "more than 65536 bytes"),
        ("malformed", "not a JSON object"),
        ("not-bearer", "not a bearer token"),
    ],
)
async def test_token_answers_lodger_cannot_use_are_refused_and_nothing_is_kept(
    guarded: Guarded, tmp_path: Path, token: str, says: str
) -> None:
    logins, directory = _logins(guarded, tmp_path)
    pending = await logins.begin("guarded", redirect_uri=REDIRECT)
    query = callback_query(approve(pending.authorization_url))
    guarded.mode(token=token)
    with pytest.raises(McpAuthError, match=says) as caught:
        await logins.finish(state=query["state"], code=query["code"], iss=query.get("iss"))
    assert query["code"] not in str(caught.value)
    assert not directory.exists() or list(directory.iterdir()) == []


async def test_a_callback_with_another_state_is_refused_and_the_login_is_spent(
    guarded: Guarded, tmp_path: Path
) -> None:
    logins, _ = _logins(guarded, tmp_path)
    pending = await logins.begin("guarded", redirect_uri=REDIRECT)
    query = callback_query(approve(pending.authorization_url))
    with pytest.raises(McpAuthError, match="matches no login in progress"):
        await logins.finish(state="forged", code=query["code"], iss=None)
    with pytest.raises(McpAuthError, match="matches no login in progress"):
        await logins.finish(state=None, code=query["code"], iss=None)
    # the real state still finishes (the forgery named no login, so it spent none)
    login = await logins.finish(state=query["state"], code=query["code"], iss=query.get("iss"))
    assert login.server == "guarded"
    with pytest.raises(McpAuthError, match="matches no login in progress"):  # used once
        await logins.finish(state=query["state"], code=query["code"], iss=None)


async def test_the_loopback_refuses_a_server_that_sends_back_another_state(
    guarded: Guarded, tmp_path: Path
) -> None:
    guarded.mode(authorize="wrong-state")
    logins, directory = _logins(guarded, tmp_path)
    task, url = await _started(logins)
    callback = await asyncio.to_thread(approve, url)
    await asyncio.to_thread(_visit, callback)
    with pytest.raises(McpAuthError, match="matches no login in progress"):
        await task
    assert not directory.exists() or list(directory.iterdir()) == []


async def test_the_loopback_ignores_other_paths_and_takes_the_callback(
    guarded: Guarded, tmp_path: Path
) -> None:
    logins, _ = _logins(guarded, tmp_path)
    task, url = await _started(logins)
    callback = await asyncio.to_thread(approve, url)
    base = callback.split("/callback")[0]
    # a page elsewhere on the listener (a redirect_uri trick) finishes nothing
    with pytest.raises(urllib.error.HTTPError) as refused:
        await asyncio.to_thread(_visit, base + "/elsewhere?code=x&state=y")
    refused.value.close()
    assert refused.value.code == 404
    assert not task.done()
    await asyncio.to_thread(_visit, callback)
    login = await task
    assert login.server == "guarded"


async def _started(logins: McpLogins) -> tuple[asyncio.Task[object], str]:
    """A loopback login under way, and the authorization URL it showed."""
    shown: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    login = logins.login_loopback("guarded", show=shown.set_result, timeout_s=30)
    task: asyncio.Task[object] = asyncio.create_task(login)  # type: ignore[arg-type]
    return task, await shown


def _visit(url: str) -> None:
    with urllib.request.urlopen(url, timeout=10) as page:
        page.read()


def test_a_client_secret_written_in_lodger_toml_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = {
        "url": "https://mcp.example.com/mcp",
        "oauth": {"client_id": "c", "client_secret": "s3cr3t"},
    }
    with pytest.raises(ConfigError, match="only from the environment") as caught:
        server_from_table("x", table, where="[mcp.servers.x]")
    assert "s3cr3t" not in str(caught.value)
    monkeypatch.setenv("X_SECRET", "from-env")
    table["oauth"] = {"client_id": "c", "client_secret": "${X_SECRET}", "redirect_port": 8765}
    config = server_from_table("x", table, where="[mcp.servers.x]")
    assert config.auth is not None and config.auth.client_secret == "from-env"
    assert "from-env" not in repr(config)
    with pytest.raises(ConfigError, match="OAuth is for HTTP servers"):
        server_from_table("y", {"command": "x", "oauth": True}, where="[mcp.servers.y]")


async def test_a_sealed_login_opens_only_with_its_key_and_under_its_name(tmp_path: Path) -> None:
    control = SqliteControlPlane(tmp_path / "control.sqlite3")
    await control.start()
    try:
        key = load_key(environ={"LODGER_MCP_KEY": "ab" * 32})
        store = SealedCredentialStore(control, key)
        await store.save("docs", {"access_token": "at-very-secret"})
        assert await store.load("docs") == {"access_token": "at-very-secret"}
        assert await store.names() == ["docs"]
        raw = (tmp_path / "control.sqlite3").read_bytes()
        assert b"at-very-secret" not in raw
        with pytest.raises(ConfigError, match="does not open with this key"):
            await SealedCredentialStore(control, b"\x01" * 32).load("docs")
        sealed = await control.get_secret(name="mcp-login:docs")
        assert sealed is not None
        await control.put_secret(name="mcp-login:other", value=sealed)  # copied across
        with pytest.raises(ConfigError, match="does not open"):
            await store.load("other")
    finally:
        await control.close()


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("cd" * 32)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="mode 600"):
        load_key(key_file=path, environ={})
    path.chmod(0o600)
    assert load_key(key_file=path, environ={}) == bytes.fromhex("cd" * 32)


_WRITER = """
import asyncio, sys
from lodger.tools._mcp_credentials import FileCredentialStore

async def main():
    store = FileCredentialStore(sys.argv[1])
    for n in range(1_000_000):
        await store.save("docs", {"access_token": f"token-{n}", "pad": "x" * 50_000})
        if n == 0:
            print("saved", flush=True)

asyncio.run(main())
"""


def test_a_login_written_when_the_process_is_killed_is_whole_or_the_one_before(
    tmp_path: Path,
) -> None:
    import json
    import os
    import signal
    import subprocess
    import sys

    directory = tmp_path / "logins"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3] / "src")}
    for _ in range(3):
        writer = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(directory)], stdout=subprocess.PIPE, env=env
        )
        assert writer.stdout is not None
        assert writer.stdout.readline() == b"saved\n"
        os.kill(writer.pid, signal.SIGKILL)  # mid-write, most likely: it writes without pause
        writer.wait()
        writer.stdout.close()
        record = asyncio.run(FileCredentialStore(directory).load("docs"))
        assert record is not None and record["access_token"].startswith("token-")
        assert json.loads((directory / "docs.json").read_text()) == record
        assert asyncio.run(FileCredentialStore(directory).names()) == ["docs"]  # no temp
    left = [p for p in directory.iterdir() if p.name.endswith(".tmp")]
    for path in left:  # what killed writes left: a later save sweeps them once stale
        os.utime(path, (0, 0))
    asyncio.run(FileCredentialStore(directory).save("docs", {"access_token": "last"}))
    assert [p.name for p in directory.iterdir()] == ["docs.json"]


async def test_a_refusal_sent_back_to_the_loopback_fails_the_login_with_its_word(
    guarded: Guarded, tmp_path: Path
) -> None:
    from urllib.parse import parse_qs, urlsplit

    logins, directory = _logins(guarded, tmp_path)
    task, url = await _started(logins)
    (redirect,) = parse_qs(urlsplit(url).query)["redirect_uri"]
    await asyncio.to_thread(_visit, redirect + "?error=access_denied&error_description=no")
    with pytest.raises(McpAuthError, match="refused the login \\('access_denied'\\)"):
        await task
    assert not directory.exists() or list(directory.iterdir()) == []

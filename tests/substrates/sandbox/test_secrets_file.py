"""The secrets file: credentials for the egress proxy, read from a private file outside the
workspace, injected into requests, and never seen by the sandbox or written to the log."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from lodger.engine.settings import Services
from lodger.errors import ConfigError
from lodger.events import ToolResponded
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.agent import Agent
from lodger.runtime.builtin import workspace_tools
from lodger.runtime.config import load_sandbox_policy
from lodger.substrates.sandbox import policy_from_config

SECRET = "sk-from-the-file-71c2aa"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


def secrets_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


GOOD = f'["localhost"]\nAuthorization = "Bearer {SECRET}"\n'


async def test_file_credentials_reach_the_upstream_but_not_the_sandbox_or_the_log(
    ws: Path, tmp_path: Path
) -> None:
    path = secrets_file(tmp_path / "private" / "secrets.toml", GOOD)
    (ws / "lodger.toml").write_text(
        f'[sandbox]\nsecrets_file = "{path}"\n[sandbox.network]\nallow = ["localhost"]\n'
    )
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    policy = load_sandbox_policy(ws)
    assert policy is not None
    assert SECRET not in policy.describe()
    command = (
        f"curl -sS -v http://localhost:{port}/api 2>&1; echo; env; cat /proc/self/environ;"
        f" cat {path}; ls {path.parent}; grep -rl sk- /run /tmp . 2>/dev/null; echo END"
    )
    state = tmp_path / "state"
    script = [{"calls": [{"name": "shell", "args": {"command": command}}]}, {"text": "done"}]
    agent = Agent(
        model=ScriptedModel(script),
        tools=workspace_tools(sandbox=policy),
        storage=state,
        workspace=ws,
        services=Services(clock=ManualClock(tick_us=5), ids=SequentialIds("s")),
    )
    async with server:
        assert (await agent.run("call the api", session="s1")).status == "completed"
    events = await agent.session("s1").events()
    await agent.close()
    [result] = [e.body for e in events if isinstance(e.body, ToolResponded)]
    # The command ran, reached the host server through the proxy, and saw nothing secret.
    assert "< HTTP/1.1 200 OK" in result.content and "END" in result.content
    assert "(credentials added)" in result.content
    assert "No such file or directory" in result.content  # the file is not in the sandbox
    assert SECRET not in result.content
    assert len(heads) == 1 and f"Authorization: Bearer {SECRET}\r\n".encode() in heads[0]
    # Nothing lodger stored holds the value: every event, every byte under the state dir.
    assert all(SECRET not in e.model_dump_json() for e in events)
    stored = [p for p in state.rglob("*") if p.is_file()]
    assert stored and not [p for p in stored if SECRET.encode() in p.read_bytes()]


def test_the_secrets_file_variable_is_read_and_merged(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = secrets_file(tmp_path / "secrets.toml", GOOD + '["*.example.com"]\nX-Api-Key = "k-2"\n')
    monkeypatch.setenv("LODGER_SECRETS_FILE", str(path))
    policy = policy_from_config(
        {
            "network": {
                "allow": ["localhost", "api.example.com"],
                "credentials": {"localhost": {"X-Team": "blue"}},
            }
        },
        workspace=ws,
    )
    assert policy.network.headers_for("localhost") == {
        "X-Team": "blue",
        "Authorization": f"Bearer {SECRET}",
    }
    assert policy.network.headers_for("api.example.com") == {"X-Api-Key": "k-2"}
    with pytest.raises(ConfigError, match="set authorization both in") as caught:
        policy_from_config(
            {"network": {"credentials": {"localhost": {"authorization": "Bearer x"}}}},
            workspace=ws,
        )
    assert SECRET not in str(caught.value)


def unsafe(tmp_path: Path, ws: Path, given: str | Path) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        policy_from_config({"secrets_file": str(given)}, workspace=ws)
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value.to_dict())
    return caught.value


def test_an_unsafe_secrets_file_is_refused_naming_why(ws: Path, tmp_path: Path) -> None:
    inside = secrets_file(ws / "config" / "secrets.toml", GOOD)
    error = unsafe(tmp_path, ws, inside)
    assert error.code == "secrets_file_unsafe" and "inside the workspace" in error.message
    # A link from a private place into the workspace is the same file.
    (tmp_path / "link.toml").symlink_to(inside)
    assert "inside the workspace" in unsafe(tmp_path, ws, tmp_path / "link.toml").message
    # ... and a link to a file under a directory every sandbox mounts.
    (tmp_path / "etc-link.toml").symlink_to("/etc/hostname")
    assert "which every sandbox mounts" in unsafe(tmp_path, ws, tmp_path / "etc-link.toml").message
    for mode in (0o640, 0o604, 0o644, 0o660):
        loose = secrets_file(tmp_path / f"loose-{mode:o}.toml", GOOD, mode)
        error = unsafe(tmp_path, ws, loose)
        assert error.code == "secrets_file_unsafe" and "read by others" in error.message
        assert error.hint == f"chmod 600 {loose}"
    theirs = secrets_file(tmp_path / "theirs.toml", GOOD)
    os.chown(theirs, 65534, 65534)
    assert "not to this user" in unsafe(tmp_path, ws, theirs).message
    assert "relative path" in unsafe(tmp_path, ws, "secrets.toml").message
    directory = tmp_path / "private-dir"
    directory.mkdir(mode=0o700)
    assert "not a regular file" in unsafe(tmp_path, ws, directory).message
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo, 0o600)
    assert "not a regular file" in unsafe(tmp_path, ws, fifo).message  # and no hang
    assert "cannot read" in unsafe(tmp_path, ws, tmp_path / "missing.toml").message


def test_a_broken_secrets_file_is_refused_without_echoing_it(ws: Path, tmp_path: Path) -> None:
    cut = secrets_file(tmp_path / "cut.toml", f'["localhost"]\nAuthorization = "Bearer {SECRET}\n')
    assert "not valid TOML" in unsafe(tmp_path, ws, cut).message
    split = secrets_file(
        tmp_path / "split.toml", f'["localhost"]\nAuthorization = "Bearer {SECRET}\\r\\nX: y"\n'
    )
    assert "line break" in unsafe(tmp_path, ws, split).message
    flat = secrets_file(tmp_path / "flat.toml", f'token = "{SECRET}"\n')
    assert "must be a table of headers" in unsafe(tmp_path, ws, flat).message


def test_a_credential_from_the_environment_with_a_line_break_is_refused(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broke: a header value expanded from an environment variable was not checked (only
    the secrets file's were): ``TOKEN=$'abc\\r\\nHost: evil'`` wrote a second header, or a
    body, into every request the proxy sent for that domain."""
    monkeypatch.setenv("LODGER_TEST_TOKEN", f"{SECRET}\r\nHost: evil.example")
    table = {
        "network": {
            "allow": ["localhost"],
            "credentials": {"localhost": {"Authorization": "Bearer ${LODGER_TEST_TOKEN}"}},
        }
    }
    with pytest.raises(ConfigError) as caught:
        policy_from_config(table, workspace=ws)
    message = caught.value.message
    assert "line break" in message and "'Authorization'" in message and "localhost" in message
    assert SECRET not in message and SECRET not in (caught.value.hint or "")
    monkeypatch.setenv("LODGER_TEST_TOKEN", SECRET)
    policy = policy_from_config(table, workspace=ws)
    assert policy.network.headers_for("localhost") == {"Authorization": f"Bearer {SECRET}"}


def test_credential_headers_built_in_code_are_checked_too() -> None:
    from lodger.substrates.sandbox import NetworkPolicy

    for headers in ({"X-Key": "a\nb"}, {"X-Key": "a\x00b"}, {"X Key": "v"}, {"X-Key:": "v"}):
        with pytest.raises(ConfigError):
            NetworkPolicy(allow=("localhost",), credentials={"localhost": headers})
    NetworkPolicy(allow=("localhost",), credentials={"localhost": {"X-Api-Key": "k 1"}})

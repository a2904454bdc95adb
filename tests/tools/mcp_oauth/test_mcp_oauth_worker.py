"""Workers: ``lodger mcp login --control`` seals the login in the control plane's secret
table; a ``lodger worker`` given the key binds the server's tools with it, and the token
is in none of the bytes the control plane, the state directory or the worker wrote (its
log and its trace spans, exported to its output)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.tools.mcp_oauth.guarded import Guarded, cli_env, every_byte, login

from lodger.storage.control import SqliteControlPlane

KEY = "5e" * 32


def _session_status(dsn: Path, session_id: str) -> str | None:
    async def read() -> str | None:
        control = SqliteControlPlane(dsn)
        await control.start()
        try:
            row = await control.get_session(session_id=session_id)
            return row.status if row is not None else None
        finally:
            await control.close()

    return asyncio.run(read())


@pytest.mark.slow
def test_a_worker_binds_the_tools_with_a_login_sealed_in_the_control_plane(
    guarded: Guarded, tmp_path: Path, config_dir: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = tmp_path / "script.json"
    calls = [{"name": "guarded__echo", "args": {"text": "from a worker"}}]
    script.write_text(json.dumps([{"calls": calls}, {"text": "done"}]))
    (ws / "lodger.toml").write_text(
        f'model = "script:{script}"\n[permissions]\nallow = ["guarded__echo"]\n'
        f'[mcp.servers.guarded]\nurl = "{guarded.url}"\ndeferred = false\noauth = true\n'
    )
    dsn = tmp_path / "control.sqlite3"
    # the worker's spans go to its output too, so the check reads the trace as well
    env = {**cli_env(config_dir), "LODGER_MCP_KEY": KEY, "OTEL_TRACES_EXPORTER": "console"}
    before = guarded.state()
    done = login(ws, config_dir, "--control", str(dsn), env=env)
    assert done.returncode == 0, done.stderr
    after = guarded.state()
    (access,) = set(after["access"]) - set(before["access"])
    (refresh,) = set(after["refresh"]) - set(before["refresh"])
    assert not (config_dir / "mcp-logins").exists()  # sealed in the control plane only

    state = tmp_path / "state"
    common = ["--state", str(state), "--control", str(dsn)]
    sent = subprocess.run(
        [sys.executable, "-m", "lodger", "send", "w1", "go", "--workspace", str(ws), *common],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    (tmp_path / "workdir").mkdir()
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "lodger", "worker", *common, "--trust-projects", "--poll",
             "0.05", "--workdir", str(tmp_path / "workdir")],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            while _session_status(dsn, "w1") != "completed":
                assert worker.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        finally:
            worker.terminate()
            worker.wait(timeout=30)
    shown = subprocess.run(
        [sys.executable, "-m", "lodger", "log", "show", "w1", "--state", str(state), "--json"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert '"from a worker"' in shown.stdout, shown.stdout[-2000:]
    assert "guarded__echo" in log.read_text()  # the trace names the call
    written = every_byte(state, dsn, log, tmp_path / "workdir") + shown.stdout.encode()
    written += done.stdout.encode() + done.stderr.encode()
    for secret in (access, refresh):
        assert secret.encode() not in written
    assert os.environ.get("LODGER_MCP_KEY") is None  # the key stayed in the children's env

"""``lodger serve --store URL --control DSN`` as real processes: the host and a worker
share moto's S3 server (loopback) and a SQLite control plane given as a path, the way
``lodger worker`` takes it; a bad DSN is refused with one line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lodger.client import HostClient, StreamedFact
from lodger.storage.control import open_control

from . import host_tools

SRC = Path(__file__).resolve().parents[2] / "src"
TOKEN = "lgr_distributed-cli-admin-token-0123456789abcdef"


def _env() -> dict[str, str]:
    env = {**os.environ, "LODGER_HOST_TOKEN": TOKEN}
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.pop("LODGER_STORE", None)
    env.pop("LODGER_CONTROL", None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    from storage._s3server import running_s3_server  # tests/storage's moto server

    with running_s3_server() as server:
        yield server.url()


def _spawn(args: list[str], out: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with out.open("ab") as sink:
        return subprocess.Popen([sys.executable, "-m", "lodger", *args], stdout=sink,
                                stderr=subprocess.STDOUT, env=env)  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.slow
async def test_serve_and_a_worker_over_s3(tmp_path: Path, s3: str) -> None:
    from storage._s3server import set_credentials

    env = _env()
    set_credentials(env)
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"calls": [{"name": "echo", "args": {"text": "s3"}}]},
                                  {"text": "stored"}]))  # fmt: skip
    control = str(tmp_path / "control.sqlite3")
    port = _free_port()
    common = ["--store", s3, "--control", control, "--tools", str(Path(host_tools.__file__))]
    host_out = tmp_path / "host.out"
    host = _spawn(["serve", "--state", str(tmp_path / "host-state"), "--port", str(port),
                   "--model", f"script:{script}", *common], host_out, env)  # fmt: skip
    worker = None
    try:
        async with asyncio.timeout(60):
            while "lodger host on" not in (text := host_out.read_text()):
                assert host.poll() is None, text
                await asyncio.sleep(0.05)
        async with HostClient(f"http://127.0.0.1:{port}", token=TOKEN) as client:
            sid = await client.create_session(session_id="s3-1")
            sent = await client.send(sid, "go", key="once")
            assert (await client.send(sid, "go", key="once"))["created"] is False
            assert (await client.message(sid, sent["message"]["id"]))["status"] == "queued"
            # the host enqueued a wake in the control plane the worker will share
            plane = open_control(control)
            await plane.start()
            try:
                (wake,) = await plane.pending_wakes(session_id=sid)
            finally:
                await plane.close()
            assert (wake.id, wake.message) == (sent["message"]["id"], "go")
            worker = _spawn(["worker", *common, "--poll", "0.05", "--lease-ttl", "5",
                             "--workdir", str(tmp_path)], tmp_path / "worker.out", env)  # fmt: skip
            seen: list[StreamedFact] = []
            async with asyncio.timeout(60):
                async for fact in client.stream(sid):
                    seen.append(fact)
                    if fact.kind == "turn_ended":
                        break
            done = await client.wait_message(sid, sent["message"]["id"], within=30)
            assert done["status"] == "done"
            assert [f.offset for f in seen] == list(range(len(seen)))
            assert [f.data["body"]["content"] for f in seen if f.kind == "tool_responded"] == ["s3"]
            assert [f.data["body"]["input"] for f in seen if f.kind == "turn_started"] == ["go"]
        assert TOKEN not in host_out.read_text()
    finally:
        _stop(host)
        if worker is not None:
            _stop(worker)


def test_a_bad_control_dsn_is_refused(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lodger", "serve", "--state", str(tmp_path / "st"),
         "--control", "mysql://nobody@nowhere/db", "--port", str(_free_port())],
        env=_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "invalid_control_dsn" in out.stderr or "invalid control plane DSN" in out.stderr
    assert not (tmp_path / "st").exists()  # refused before anything was opened

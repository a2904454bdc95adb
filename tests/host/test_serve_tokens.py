"""The admin token ``lodger serve`` makes and prints when ``$LODGER_HOST_TOKEN`` is unset,
as real processes: embedded, it opens its host and only its hash is in the host's index;
distributed, two hosts on one control plane (a SQLite file, the way ``lodger worker``
takes it) and one ``file://`` store each print their own, and each opens both hosts.
Only hashes reach the control plane and the indexes; the plain token is printed once."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx2
import pytest

from lodger.storage.control.host_index import hash_token

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[2] / "src"
_TOKEN = re.compile(r"admin token: (lgr_[A-Za-z0-9_-]{43})\s")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    for name in ("LODGER_HOST_TOKEN", "LODGER_STORE", "LODGER_CONTROL"):
        env.pop(name, None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _serve(args: list[str], out: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = _free_port()
    with out.open("ab") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lodger", "serve", "--port", str(port), *args],
            stdout=sink, stderr=subprocess.STDOUT, env=_env(),
        )  # fmt: skip
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


async def _printed_token(proc: subprocess.Popen[bytes], out: Path) -> str:
    async with asyncio.timeout(60):
        while "lodger host on" not in (text := await asyncio.to_thread(out.read_text)):
            assert proc.poll() is None, text
            await asyncio.sleep(0.05)
    (token,) = _TOKEN.findall(text)
    assert text.count(token) == 1  # printed once, on its line
    return token


async def _status(port: int, token: str) -> int:
    async with httpx2.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}
    ) as client:
        return (await client.get("/v1/sessions")).status_code


def _files_holding(root: Path, needle: bytes) -> list[str]:
    return [
        str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()
    ]  # fmt: skip


async def test_embedded_serve_prints_a_token_that_opens_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with _serve(["--state", str(state), "--model", "test"], tmp_path / "out") as (proc, port):
        token = await _printed_token(proc, tmp_path / "out")
        assert await _status(port, token) == 200
        assert await _status(port, token + "x") == 401
    assert _files_holding(state, token.encode()) == []
    assert _files_holding(state, hash_token(token).encode())  # the index holds its hash


async def test_distributed_hosts_each_print_a_token_that_opens_both(tmp_path: Path) -> None:
    control = tmp_path / "control.sqlite3"
    common = ["--store", f"file://{tmp_path / 'objects'}", "--control", str(control),
              "--model", "test"]  # fmt: skip
    with ExitStack() as stack:
        hosts = [
            stack.enter_context(
                _serve([*common, "--state", str(tmp_path / name)], tmp_path / f"{name}.out")
            )
            for name in ("a", "b")
        ]
        tokens = [await _printed_token(proc, tmp_path / f"{n}.out")
                  for (proc, _), n in zip(hosts, ("a", "b"), strict=True)]  # fmt: skip
        assert tokens[0] != tokens[1]
        for _, port in hosts:
            for token in tokens:
                assert await _status(port, token) == 200
            assert await _status(port, "lgr_" + "x" * 43) == 401
    for token in tokens:
        # the plain token is in no file but the output it was printed to
        held = _files_holding(tmp_path, token.encode())
        assert len(held) == 1 and held[0].endswith(".out"), held
        # its hash is in the control plane's file, not in a host's own index
        holders = {Path(p).name for p in _files_holding(tmp_path, hash_token(token).encode())}
        assert holders and holders <= {control.name, control.name + "-wal"}, holders


async def test_a_revoked_token_in_the_environment_is_refused_at_start(tmp_path: Path) -> None:
    from lodger.storage.control import open_control

    control = tmp_path / "control.sqlite3"
    common = ["--store", f"file://{tmp_path / 'objects'}", "--control", str(control),
              "--model", "test"]  # fmt: skip
    with _serve([*common, "--state", str(tmp_path / "a")], tmp_path / "a.out") as (proc, port):
        token = await _printed_token(proc, tmp_path / "a.out")
        plane = open_control(str(control))
        await plane.start()
        try:
            assert await plane.revoke_token(token_hash=hash_token(token))
        finally:
            await plane.close()
        async with asyncio.timeout(30):  # the host's grant cache forgets it within 5 s
            while await _status(port, token) != 401:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
    env = {**_env(), "LODGER_HOST_TOKEN": token}
    started = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "lodger", "serve", "--port", str(_free_port()), *common,
         "--state", str(tmp_path / "b")],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert started.returncode != 0, started.stdout + started.stderr
    assert "revoked" in started.stderr and "lodger host on" not in started.stdout
    assert token not in started.stdout + started.stderr

"""A PostgreSQL control plane with no connection slot left (issue 27, section 9).

Broke: with the server's ``max_connections`` reached, ``lodger send`` waited out the pool's
30 s and failed with a hint about the DSN, while psycopg's pool printed raw log lines on
stderr, breaking ``--json``. Now each process's pool is bounded (``LODGER_CONTROL_POOL_MAX``)
and a full server fails the command at once, naming too many connections, in one JSON
line under ``--json``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from lodger.errors import ControlPlaneError, UsageError
from lodger.storage.control.postgres import POOL_MAX_ENVVAR, PostgresControlPlane, pool_max
from lodger.testing.postgres import PostgresServer

from ._workers import SRC


@pytest.fixture
def full_server() -> Iterator[tuple[PostgresServer, list[psycopg.Connection[tuple[object, ...]]]]]:
    """A server of 4 connections, all held by raw connections (a list the test may pop)."""
    server = PostgresServer(max_connections=4)
    held: list[psycopg.Connection[tuple[object, ...]]] = []
    try:
        server.init()
        refused = ""
        while not refused and len(held) < 50:
            try:
                held.append(psycopg.connect(server.dsn(), autocommit=True))
            except psycopg.OperationalError as exc:
                refused = str(exc)
        assert "too many clients" in refused and len(held) == 4
        yield server, held
    finally:
        for conn in held:
            conn.close()
        server.destroy()


def _send(dsn: str, state: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    command = [sys.executable, "-m", "lodger", "send", "s1", "hello", "--control", dsn]
    command += ["--state", str(state), "--json"]
    environ = {**os.environ, "PYTHONPATH": str(SRC), **env}
    started = time.monotonic()
    ran = subprocess.run(command, capture_output=True, text=True, env=environ, timeout=90)
    return ran, time.monotonic() - started


@pytest.mark.slow  # a server of its own (initdb) and two CLI processes
def test_a_full_server_is_named_at_once_in_one_json_line(
    full_server: tuple[PostgresServer, list[psycopg.Connection[tuple[object, ...]]]],
    tmp_path: Path,
) -> None:
    server, held = full_server
    ran, took = _send(server.dsn(), tmp_path)
    assert ran.returncode == 1, ran.stderr
    lines = ran.stderr.splitlines()
    assert len(lines) == 1, ran.stderr  # nothing but the error, no pool log lines
    error = json.loads(lines[0])["error"]
    assert error["code"] == "too_many_connections"
    assert "too many connections" in error["message"]
    assert POOL_MAX_ENVVAR in error["hint"]
    assert took < 20, took  # not the pool's 30 s wait (a process start is slow here)
    # one slot free: the same command goes through, the pool bounded to it
    held.pop().close()
    ran, _ = _send(server.dsn(), tmp_path, **{POOL_MAX_ENVVAR: "1"})
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["session_id"] == "s1"


def test_the_pool_bound_is_configurable_and_checked() -> None:
    assert pool_max({}) == 4
    assert pool_max({POOL_MAX_ENVVAR: "2"}) == 2
    for bad in ("0", "many", "-1", "5000"):
        with pytest.raises(UsageError, match=POOL_MAX_ENVVAR):
            pool_max({POOL_MAX_ENVVAR: bad})


def test_the_plane_uses_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOL_MAX_ENVVAR, "2")
    plane = PostgresControlPlane("postgresql://lodger@127.0.0.1:1/none")
    assert plane._pool.max_size == 2 and plane._pool.min_size == 1
    monkeypatch.setenv(POOL_MAX_ENVVAR, "nope")
    with pytest.raises(UsageError):
        PostgresControlPlane("postgresql://lodger@127.0.0.1:1/none")


def test_pool_log_lines_are_json_under_json(capsys: pytest.CaptureFixture[str]) -> None:
    """psycopg's pool logs each failed connection (a server restarting, say): under
    ``--json`` that is one JSON notice per line, not raw text."""
    from lodger.cli._warnings import warnings_on_stderr

    with warnings_on_stderr(as_json=True, debug=False):
        logging.getLogger("psycopg.pool").warning(
            "error connecting in %r: %s", "pool-1", "connection refused\nsecond line"
        )
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    notice = json.loads(lines[0])
    assert notice["level"] == "warning" and "error connecting in 'pool-1'" in notice["notice"]


@pytest.mark.slow  # a server of its own (initdb)
async def test_a_pool_that_cannot_grow_names_too_many_connections(
    full_server: tuple[PostgresServer, list[psycopg.Connection[tuple[object, ...]]]],
) -> None:
    """Mid-run, the pool needs a second connection and the server has no slot: its
    timeout names too many connections, not an unreachable server."""
    server, held = full_server
    held.pop().close()  # one slot: the plane's pool takes it
    plane = PostgresControlPlane(server.dsn(), timeout_s=2.0)
    await plane.start()
    try:

        async def hold() -> None:
            async with plane._tx() as tx:
                await tx.rows("SELECT pg_sleep(4)")

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0.5)
        with pytest.raises(ControlPlaneError) as info:
            await plane.now()
        assert info.value.code == "too_many_connections", info.value.message
        assert "too many connections" in info.value.message
        await holder
    finally:
        await plane.close()

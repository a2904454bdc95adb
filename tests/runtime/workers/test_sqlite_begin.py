"""The SQLite control plane waits out a write lock that SQLite reports at once ("database
is locked" without its busy handler waiting, seen in CI while a worker wrote) instead of
failing the caller's transaction."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from lodger.errors import ControlPlaneError
from lodger.storage.control import sqlite as control_sqlite
from lodger.storage.control.sqlite import SqliteControlPlane


async def _held_for(path: Path, seconds: float) -> None:
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another process writing
    await asyncio.sleep(seconds)
    holder.execute("COMMIT")
    holder.close()


async def test_a_lock_reported_at_once_is_waited_out(tmp_path: Path) -> None:
    plane = SqliteControlPlane(tmp_path / "control.sqlite3")
    await plane.start()
    try:
        assert plane._conn is not None
        plane._conn.execute("PRAGMA busy_timeout=0")  # SQLite answers "locked" at once
        holding = asyncio.create_task(_held_for(plane.path, 0.3))
        await asyncio.sleep(0.05)
        assert await plane.get_session(session_id="s1") is None  # waited, then read
        await holding
    finally:
        await plane.close()


async def test_a_lock_held_past_the_retries_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control_sqlite, "_BEGIN_RETRY_S", 0.1)
    plane = SqliteControlPlane(tmp_path / "control.sqlite3")
    await plane.start()
    try:
        assert plane._conn is not None
        plane._conn.execute("PRAGMA busy_timeout=0")
        holding = asyncio.create_task(_held_for(plane.path, 0.5))
        await asyncio.sleep(0.05)
        with pytest.raises(ControlPlaneError) as caught:
            await plane.get_session(session_id="s1")
        assert "locked" in caught.value.message
        await holding
    finally:
        await plane.close()


async def test_a_commit_that_fails_ends_its_transaction_and_frees_the_file(
    tmp_path: Path,
) -> None:
    """A COMMIT SQLite refuses leaves the transaction open, and with it the file's write
    lock (every other worker's BEGIN would wait on it): the plane ends it, and a
    transaction left open is ended before the next one begins."""
    path = tmp_path / "control.sqlite3"
    plane = SqliteControlPlane(path)
    await plane.start()
    try:
        conn = plane._conn
        assert conn is not None
        # a commit-time failure: a deferred foreign key left violated
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE child (parent INTEGER REFERENCES parent (id) "
            "DEFERRABLE INITIALLY DEFERRED)"
        )
        with pytest.raises(ControlPlaneError, match="commit failed"):
            async with plane._tx() as tx:
                await tx.change("INSERT INTO child VALUES (%s)", (7,))
        assert not conn.in_transaction
        other = sqlite3.connect(path, isolation_level=None, timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")  # at once: nobody holds the write lock
            other.execute("ROLLBACK")
        finally:
            other.close()
        assert conn.execute("SELECT count(*) FROM child").fetchone() == (0,)
        conn.execute("BEGIN")  # left open by something else on this connection
        assert await plane.send(session_id="s1", message="goes through") is not None
        assert not conn.in_transaction
    finally:
        await plane.close()

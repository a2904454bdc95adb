"""``lodger._core.sqlite.use_wal``: a database that another process holds for a moment is put
in WAL mode once it is free, instead of failing the open with "database is locked"."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path

import pytest

from lodger._core.sqlite import use_wal


def test_a_locked_new_database_is_switched_once_it_is_free(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")  # another process opening the same new file
    released = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    # no busy handler of its own: SQLite answers "locked" at once, as it may while
    # another process switches the same file
    with contextlib.closing(sqlite3.connect(path, isolation_level=None, timeout=0)) as conn:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            conn.execute("PRAGMA journal_mode=WAL")
        released.start()
        use_wal(conn)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    released.join()
    holder.close()


def test_a_lock_that_is_never_released_still_fails(tmp_path: Path) -> None:
    path = tmp_path / "held.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    with (
        contextlib.closing(sqlite3.connect(path, isolation_level=None, timeout=0)) as conn,
        pytest.raises(sqlite3.OperationalError, match="locked"),
    ):
        use_wal(conn, within_s=0.2)
    holder.execute("COMMIT")
    holder.close()

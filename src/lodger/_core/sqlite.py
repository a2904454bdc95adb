"""What every SQLite file of lodger's does when it is opened."""

from __future__ import annotations

import sqlite3
import time

__all__ = ["is_lock_error", "use_wal"]


def use_wal(conn: sqlite3.Connection, *, within_s: float = 30.0) -> None:
    """Put ``conn``'s database in WAL mode with full syncs.

    Switching a database to WAL needs it to itself for a moment, and SQLite may answer
    "database is locked" at once rather than wait while another process opens the same
    new file (seen: two ``lodger serve`` started together on one control plane, once in a
    full test run). That answer is retried for up to ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as exc:
            if not is_lock_error(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
    conn.execute("PRAGMA synchronous=FULL")


def is_lock_error(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused because another connection holds the file ("database is
    locked" or "busy"): worth trying again, unlike any other error."""
    text = str(exc)
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)

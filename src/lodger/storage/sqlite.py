"""The embedded ``LogStore``: one SQLite file in the state directory.

WAL journal, ``synchronous=FULL`` (the WAL is fsynced on every commit), one transaction
per append. All SQLite work runs on one dedicated thread so the event loop never blocks
and the connection never crosses threads. One writer per session is enforced with an
``flock`` on ``locks/<session>.lock``; the kernel drops it when the process dies, so a
SIGKILLed writer never leaves a stale lock, and the file names the current holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from lodger.errors import AppendConflictError, CommitFailedError, SessionLockedError, StorageError
from lodger.storage._worker import IoThread
from lodger.storage.logstore import Record

__all__ = ["SqliteLogStore"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    "offset" INTEGER NOT NULL,
    data BLOB NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (session_id, "offset")
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS heads (
    session_id TEXT PRIMARY KEY,
    high_water INTEGER NOT NULL,
    digest TEXT NOT NULL
);
"""


def _stored_bytes(value: object) -> bytes:
    # a row edited with SQL text functions comes back as TEXT: pass its bytes on to the
    # digest check (which then fails closed) instead of crashing with a TypeError here
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


class _FileLease:
    def __init__(self, store: SqliteLogStore, session_id: str, fd: int) -> None:
        self._store = store
        self.session_id = session_id
        self._fd: int | None = fd

    async def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            # closing drops the flock; done inline (it does not block) so a lease can still be
            # released after its store was closed, instead of holding the lock until exit
            os.close(fd)


class SqliteLogStore:
    """Events of every session in ``<state_dir>/log.sqlite3``."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / "log.sqlite3"
        self._io = IoThread("lodger-sqlite")
        self._conn: sqlite3.Connection | None = None

    # -- plumbing -------------------------------------------------------------

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self._io.run(fn)

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                self.state_dir.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.executescript(_SCHEMA)
            except (sqlite3.Error, OSError) as exc:
                raise StorageError(
                    f"cannot open the event log at {self.path}: {exc}",
                    hint="check the --state directory exists, is writable and is not corrupt",
                    code="storage_open",
                ) from exc
            self._conn = conn
        return self._conn

    # -- LogStore -------------------------------------------------------------

    async def append_records(
        self, *, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        def work() -> None:
            conn = self._connect()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    row = conn.execute(
                        'SELECT MAX("offset") FROM events WHERE session_id = ?', (session_id,)
                    ).fetchone()
                    high_water = 0 if row[0] is None else int(row[0]) + 1
                    if high_water != expected_offset:
                        raise AppendConflictError(
                            f"append to session {session_id!r} expected offset "
                            f"{expected_offset} but the stored high-water mark is {high_water}",
                            hint="another writer appended first; re-read the log",
                            session_id=session_id,
                            offset=expected_offset,
                        )
                    conn.executemany(
                        'INSERT INTO events (session_id, "offset", data, digest) '
                        "VALUES (?, ?, ?, ?)",
                        [(session_id, r.offset, r.data, r.digest) for r in records],
                    )
                    if records:
                        conn.execute(
                            "INSERT INTO heads (session_id, high_water, digest) VALUES (?, ?, ?) "
                            "ON CONFLICT (session_id) DO UPDATE SET "
                            "high_water = excluded.high_water, digest = excluded.digest",
                            (session_id, records[-1].offset + 1, records[-1].digest),
                        )
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise CommitFailedError(
                    f"append to session {session_id!r} at offset {expected_offset} failed: {exc}",
                    hint="nothing from this append was committed; check disk space and "
                    "permissions of the state directory",
                    session_id=session_id,
                    offset=expected_offset,
                ) from exc

        await self._run(work)

    async def read_records(self, *, session_id: str, start: int, end: int | None) -> list[Record]:
        def work() -> list[Record]:
            conn = self._connect()
            try:
                rows = conn.execute(
                    'SELECT "offset", data, digest FROM events WHERE session_id = ? '
                    'AND "offset" >= ? AND "offset" < ? ORDER BY "offset"',
                    (session_id, start, end if end is not None else 2**62),
                ).fetchall()
            except sqlite3.Error as exc:
                raise StorageError(
                    f"cannot read session {session_id!r}: {exc}",
                    hint="the database file may be damaged; run `lodger log verify`",
                    session_id=session_id,
                ) from exc
            return [Record(int(o), _stored_bytes(d), str(g)) for o, d, g in rows]

        return await self._run(work)

    async def last_record(self, *, session_id: str) -> Record | None:
        def work() -> Record | None:
            row = (
                self._connect()
                .execute(
                    'SELECT "offset", data, digest FROM events WHERE session_id = ? '
                    'ORDER BY "offset" DESC LIMIT 1',
                    (session_id,),
                )
                .fetchone()
            )
            return None if row is None else Record(int(row[0]), _stored_bytes(row[1]), str(row[2]))

        return await self._run(work)

    async def stored_head(self, *, session_id: str) -> tuple[int, str] | None:
        def work() -> tuple[int, str] | None:
            row = (
                self._connect()
                .execute("SELECT high_water, digest FROM heads WHERE session_id = ?", (session_id,))
                .fetchone()
            )
            return None if row is None else (int(row[0]), str(row[1]))

        return await self._run(work)

    async def list_sessions(self) -> list[str]:
        def work() -> list[str]:
            if not self.path.exists():
                return []
            rows = self._connect().execute(
                "SELECT DISTINCT session_id FROM events ORDER BY session_id"
            )
            return [str(r[0]) for r in rows]

        return await self._run(work)

    async def acquire_writer(self, *, session_id: str) -> _FileLease:
        lock_dir = self.state_dir / "locks"

        def work() -> int:
            lock_dir.mkdir(parents=True, exist_ok=True)
            path = lock_dir / f"{session_id}.lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = "an unknown process"
                with contextlib.suppress(OSError, ValueError):
                    info = json.loads(path.read_text() or "{}")
                    holder = f"pid {info.get('pid')} on {info.get('host')}"
                raise SessionLockedError(
                    f"session {session_id!r} is being written by {holder}",
                    hint="wait for that run to finish or stop it; one writer per session",
                    session_id=session_id,
                ) from None
            info = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
            os.ftruncate(fd, 0)
            os.pwrite(fd, info.encode(), 0)
            return fd

        fd = await self._run(work)
        return _FileLease(self, session_id, fd)

    async def close(self) -> None:
        def work() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await self._run(work)
        await self._io.close()

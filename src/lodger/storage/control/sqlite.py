"""The embedded control plane: one SQLite file, shared by the processes of one machine.

Each transaction is ``BEGIN IMMEDIATE`` (the write lock is taken first, so two workers
never interleave a claim), runs on a worker thread, and reads the clock once. WAL mode
and a busy timeout let several worker processes share the file.

>>> control = SqliteControlPlane(".lodger/storage/control.sqlite3")
>>> await control.start()
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from lodger._core.sqlite import is_lock_error, use_wal
from lodger.errors import ControlPlaneError
from lodger.storage.control._sql import LATEST_VERSION, SqlControlPlane

__all__ = ["SqliteControlPlane"]

#: how long a ``BEGIN IMMEDIATE`` that SQLite refuses at once is tried again
_BEGIN_RETRY_S = 10.0


class _SqliteTx:
    def __init__(self, conn: sqlite3.Connection, now: float) -> None:
        self._conn = conn
        self.now = now

    async def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await asyncio.to_thread(self._rows, sql, params)

    def _rows(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return list(self._conn.execute(sql.replace("%s", "?"), tuple(params)).fetchall())

    async def change(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await asyncio.to_thread(self._change, sql, params)

    def _change(self, sql: str, params: Sequence[Any]) -> int:
        return self._conn.execute(sql.replace("%s", "?"), tuple(params)).rowcount


class SqliteControlPlane(SqlControlPlane):
    """The control plane in the SQLite file ``path`` (created with its directory).

    ``clock`` (seconds since the epoch) is injectable for tests; every process sharing
    the file must use the same clock, which the machine's wall clock is.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()  # one transaction at a time on the connection

    async def start(self, *, version: int = LATEST_VERSION) -> None:
        if self._conn is None:
            self._conn = await asyncio.to_thread(self._connect)
        await self.migrate(to=version)

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
            use_wal(conn)
            conn.execute("PRAGMA busy_timeout=30000")
        except (OSError, sqlite3.Error) as exc:
            raise ControlPlaneError(
                f"cannot open the control plane at {self.path}: {exc}",
                hint="check that the directory exists and is writable",
            ) from exc
        return conn

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await asyncio.to_thread(conn.close)

    async def _begin(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE``, waiting for another process's write. SQLite's busy handler
        waits for most of them, but some answers come at once (seen in CI: a reader's
        BEGIN while a worker wrote, "database is locked" with a 30 s busy timeout set):
        those are retried for up to ``_BEGIN_RETRY_S`` seconds too."""
        deadline = time.monotonic() + _BEGIN_RETRY_S
        if conn.in_transaction:
            # one left open (a COMMIT that failed and could not be rolled back): it holds
            # the file's write lock from every other process until it ends
            await asyncio.to_thread(_rollback_quietly, conn)
        while True:
            try:
                await asyncio.to_thread(conn.execute, "BEGIN IMMEDIATE")
                return
            except sqlite3.Error as exc:
                if is_lock_error(exc) and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                    continue
                raise ControlPlaneError(
                    f"control plane {self.path}: {exc}", hint="is another process stuck?"
                ) from exc

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[_SqliteTx]:
        conn = self._conn
        if conn is None:
            raise ControlPlaneError(
                "the control plane is not started", hint="await control.start() first"
            )
        async with self._lock:
            await self._begin(conn)
            tx = _SqliteTx(conn, self._clock())
            try:
                yield tx
            except BaseException as exc:
                await asyncio.shield(asyncio.to_thread(conn.execute, "ROLLBACK"))
                if isinstance(exc, sqlite3.Error):
                    raise ControlPlaneError(
                        f"control plane {self.path}: {exc}",
                        hint="the transaction was rolled back; nothing changed",
                    ) from exc
                raise
            try:
                await asyncio.shield(asyncio.to_thread(conn.execute, "COMMIT"))
            except sqlite3.Error as exc:
                # a COMMIT refused as busy leaves the transaction open, holding the
                # write lock; end it, so nothing is applied and other processes go on
                await asyncio.shield(asyncio.to_thread(_rollback_quietly, conn))
                raise ControlPlaneError(
                    f"control plane {self.path}: commit failed: {exc}",
                    hint="the transaction was not applied",
                ) from exc

    @asynccontextmanager
    async def _read_tx(self) -> AsyncIterator[_SqliteTx]:
        """A read-only transaction: a deferred ``BEGIN`` reads a snapshot in WAL mode and
        takes no write lock (the statements run in it must only read)."""
        conn = self._conn
        if conn is None:
            raise ControlPlaneError(
                "the control plane is not started", hint="await control.start() first"
            )
        async with self._lock:
            if conn.in_transaction:
                await asyncio.to_thread(_rollback_quietly, conn)
            try:
                await asyncio.to_thread(conn.execute, "BEGIN")
                yield _SqliteTx(conn, self._clock())
            except sqlite3.Error as exc:
                raise ControlPlaneError(
                    f"control plane {self.path}: {exc}", hint="nothing was changed"
                ) from exc
            finally:
                await asyncio.shield(asyncio.to_thread(_rollback_quietly, conn))


def _rollback_quietly(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")

"""The distributed control plane: PostgreSQL through psycopg 3 (async) and a pool.

Workers on any number of machines share it. Claims use ``FOR UPDATE SKIP LOCKED`` so
concurrent workers never wait on each other's rows; every expiry is judged by the
server's clock (``clock_timestamp()``). Pooled connections are checked before use, so a
restarted server costs the transactions that were in flight, not the worker: the pool
reconnects.

>>> control = PostgresControlPlane("postgresql://lodger@127.0.0.1:5432/lodger")
>>> await control.start()
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Self

from lodger._core.extras import require
from lodger.errors import ControlPlaneError, UsageError
from lodger.storage.control._sql import LATEST_VERSION, SqlControlPlane
from lodger.storage.control.interface import WakeBell

with require("postgres", "the PostgreSQL control plane"):
    import psycopg
    from psycopg_pool import AsyncConnectionPool, PoolTimeout

__all__ = ["POOL_MAX_ENVVAR", "WAKE_CHANNEL", "PostgresControlPlane", "pool_max"]

log = logging.getLogger("lodger.control")

#: the ``NOTIFY`` channel told when wakes become due (in the transaction that made them so)
WAKE_CHANNEL = "lodger_wakes"
#: how long a listener whose connection dropped waits before connecting again
_RELISTEN_S = 1.0

#: the most connections one process's control plane holds (its pool's ``max_size``)
POOL_MAX_ENVVAR = "LODGER_CONTROL_POOL_MAX"
_POOL_MAX_DEFAULT = 4
_TOO_MANY = "53300"  # too_many_connections: the server's max_connections is reached


def pool_max(environ: dict[str, str] | None = None) -> int:
    """The pool bound ``LODGER_CONTROL_POOL_MAX`` sets (4 when unset)."""
    text = (os.environ if environ is None else environ).get(POOL_MAX_ENVVAR, "").strip()
    if not text:
        return _POOL_MAX_DEFAULT
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise UsageError(
            f"invalid {POOL_MAX_ENVVAR} {text!r}: not a number of connections from 1 to 1000",
            hint=f"set {POOL_MAX_ENVVAR} to the most connections one lodger process may "
            f"hold (default {_POOL_MAX_DEFAULT})",
            code="usage",
        )
    return int(text)


def _too_many_connections(dsn: str, exc: BaseException) -> ControlPlaneError:
    return ControlPlaneError(
        f"the control plane at {_safe(dsn)} refused the connection: too many connections "
        "(PostgreSQL's max_connections is reached)",
        hint=f"each lodger process holds up to {POOL_MAX_ENVVAR} connections (default "
        f"{_POOL_MAX_DEFAULT}); lower it, stop idle clients, or raise max_connections on "
        "the server",
        code="too_many_connections",
    )


def _is_too_many(exc: BaseException) -> bool:
    sqlstate = getattr(exc, "sqlstate", None)
    text = str(exc)
    return (
        sqlstate == _TOO_MANY or "too many clients" in text or "remaining connection slots" in text
    )


_MIGRATION_LOCK = 7_246_601  # pg_advisory_xact_lock key: one migrating process at a time


class _PgTx:
    def __init__(self, cursor: psycopg.AsyncCursor[tuple[Any, ...]], now: float) -> None:
        self._cursor = cursor
        self.now = now

    async def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        await self._cursor.execute(sql.encode(), tuple(params))
        if self._cursor.description is None:
            return []
        return list(await self._cursor.fetchall())

    async def change(self, sql: str, params: Sequence[Any] = ()) -> int:
        await self._cursor.execute(sql.encode(), tuple(params))
        return self._cursor.rowcount


def _recording(failures: list[BaseException]) -> type[psycopg.AsyncConnection[Any]]:
    """A connection class whose failed connects are kept in ``failures`` (the newest
    only): what the pool's timeout says was wrong, instead of only that it timed out."""

    class Recorded(psycopg.AsyncConnection[Any]):
        @classmethod
        async def connect(cls, *args: Any, **kwargs: Any) -> Self:
            try:
                conn = await super().connect(*args, **kwargs)
            except psycopg.Error as exc:
                failures[:] = [exc]
                raise
            failures.clear()
            return conn

    return Recorded


class PostgresControlPlane(SqlControlPlane):
    """The control plane in the PostgreSQL database ``dsn`` names."""

    _skip_locked = " FOR UPDATE SKIP LOCKED"
    _for_update = " FOR UPDATE"
    _types = {"serial": "BIGSERIAL PRIMARY KEY", "real": "DOUBLE PRECISION"}

    def __init__(
        self, dsn: str, *, min_size: int = 1, max_size: int | None = None, timeout_s: float = 30.0
    ) -> None:
        self.dsn = dsn
        self._timeout_s = timeout_s
        max_size = pool_max() if max_size is None else max_size
        min_size = min(min_size, max_size)
        self._failures: list[BaseException] = []
        self._pool = AsyncConnectionPool(
            dsn,
            connection_class=_recording(self._failures),
            min_size=min_size,
            max_size=max_size,
            open=False,
            timeout=timeout_s,
            check=AsyncConnectionPool.check_connection,
            reconnect_timeout=timeout_s * 10,
            kwargs={"connect_timeout": max(1, int(timeout_s))},
        )
        self._opened = False

    async def start(self, *, version: int = LATEST_VERSION) -> None:
        if not self._opened:
            await self._probe()
            try:
                await self._pool.open(wait=True, timeout=self._timeout_s)
            except PoolTimeout as exc:
                self._raise_if_full(exc)
                raise ControlPlaneError(
                    f"cannot connect to the control plane at {_safe(self.dsn)}",
                    hint="check that PostgreSQL is running and the DSN (host, port, "
                    "database, user) is right",
                ) from exc
            self._opened = True
        await self.migrate(to=version)

    def _raise_if_full(self, exc: PoolTimeout) -> None:
        """The pool timed out: when its newest connect was refused for want of a slot,
        say that rather than that the server is unreachable."""
        if self._failures and _is_too_many(self._failures[-1]):
            raise _too_many_connections(self.dsn, self._failures[-1]) from exc

    async def _probe(self) -> None:
        """One connection before the pool opens: a server with no connection slot left
        fails the start at once, naming it, where the pool would retry until its
        timeout. Any other failure is left to the pool (a server starting up)."""
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.dsn, connect_timeout=max(1, int(self._timeout_s))
            )
        except psycopg.Error as exc:
            if _is_too_many(exc):
                raise _too_many_connections(self.dsn, exc) from exc
            return
        await conn.close()

    async def close(self) -> None:
        if self._opened:
            self._opened = False
            await self._pool.close()

    async def _migration_lock(self, tx: Any) -> None:
        await tx.rows("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))

    async def _notify_wakes(self, tx: Any) -> None:
        await tx.rows("SELECT pg_notify(%s, '')", (WAKE_CHANNEL,))

    async def _notify_if_due(self, tx: Any, session_id: str) -> None:
        await tx.rows(
            "SELECT pg_notify(%s, '') FROM (SELECT 1 FROM wakes WHERE session_id = %s "
            "AND done_at IS NULL AND due_at <= %s AND held = 0 LIMIT 1) AS due",
            (WAKE_CHANNEL, session_id, tx.now),
        )

    async def listen_wakes(self, bell: WakeBell) -> None:
        """``LISTEN`` on a connection of its own (not the pool's) until cancelled: every
        notification rings ``bell``; so does each (re)connection, for what was sent while
        nobody listened. ``bell.live`` is false while the connection is down."""
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=max(1, int(self._timeout_s))
                )
            except psycopg.Error as exc:
                log.warning("listening for wakes: %s", str(exc).strip().splitlines()[:1])
                await asyncio.sleep(_RELISTEN_S)
                continue
            try:
                async with conn:
                    await conn.execute(f"LISTEN {WAKE_CHANNEL}".encode())
                    bell.live = True
                    bell.ring()
                    async for _ in conn.notifies():
                        bell.ring()
            except psycopg.Error as exc:
                log.warning("listening for wakes: %s", str(exc).strip().splitlines()[:1])
            finally:
                bell.live = False
            await asyncio.sleep(_RELISTEN_S)

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[_PgTx]:
        try:
            async with (
                self._pool.connection() as conn,
                conn.transaction(),
                conn.cursor() as cursor,
            ):
                await cursor.execute(b"SELECT extract(epoch from clock_timestamp())::float8")
                row = await cursor.fetchone()
                assert row is not None
                yield _PgTx(cursor, float(row[0]))
        except PoolTimeout as exc:  # (an OperationalError too: first)
            self._raise_if_full(exc)
            raise ControlPlaneError(
                f"no connection to the control plane at {_safe(self.dsn)} in time",
                hint="check that PostgreSQL is running and reachable",
            ) from exc
        except psycopg.Error as exc:
            if _is_too_many(exc):
                raise _too_many_connections(self.dsn, exc) from exc
            raise ControlPlaneError(
                f"control plane {_safe(self.dsn)}: {type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else 'failed'}",
                hint="the transaction was rolled back; retry when the database is back",
            ) from exc


def _safe(dsn: str) -> str:
    """The DSN without a password, for messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(unparsable DSN)"
    info.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in sorted(info.items()))

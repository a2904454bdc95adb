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
import contextlib
import json
import logging
import os
import select
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Self

from lodger._core.extras import require
from lodger.errors import ControlPlaneError, UsageError
from lodger.storage.control._sql import LATEST_VERSION, SqlControlPlane, lease_lost
from lodger.storage.control.interface import (
    SessionClaim,
    SessionLease,
    SessionRow,
    SteerRow,
    TextPiece,
    Wake,
    WakeBell,
    WakeEnd,
)

with require("postgres", "the PostgreSQL control plane"):
    import psycopg
    from psycopg_pool import AsyncConnectionPool, PoolTimeout

__all__ = ["POOL_MAX_ENVVAR", "TEXT_CHANNEL", "WAKE_CHANNEL", "PostgresControlPlane", "pool_max"]

log = logging.getLogger("lodger.control")

#: the ``NOTIFY`` channel told when wakes become due (in the transaction that made them so)
WAKE_CHANNEL = "lodger_wakes"
#: the ``NOTIFY`` channel text deltas travel on from workers to hosts (never stored)
TEXT_CHANNEL = "lodger_text"
#: characters of text per notification: a payload is at most 8000 bytes, and a character
#: of UTF-8 four (the rest is the piece's ids)
_TEXT_PER_NOTICE = 1500
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
            check=_check_connection,
            reconnect_timeout=timeout_s * 10,
            # transactions are opened by hand (``_tx``: BEGIN and the clock in one round
            # trip); a single read (the commit guard) needs none
            kwargs={"connect_timeout": max(1, int(timeout_s)), "autocommit": True},
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

    async def _release(self, tx: Any, lease: SessionLease) -> None:
        # the release and the look for a wake that waited for it, in one statement
        await tx.rows(
            "WITH released AS (UPDATE session_leases SET expires_at = 0 WHERE session_id = %s "
            "AND holder = %s AND epoch = %s RETURNING session_id) "
            "SELECT pg_notify(%s, '') FROM (SELECT 1 FROM wakes WHERE session_id IN "
            "(SELECT session_id FROM released) AND done_at IS NULL AND due_at <= %s "
            "AND held = 0 LIMIT 1) AS due",
            (lease.session_id, lease.holder, lease.epoch, WAKE_CHANNEL, tx.now),
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

    async def notify_text(self, *, pieces: Sequence[TextPiece]) -> None:
        """Every piece (split to fit a notification) in one statement."""
        # numbered: PostgreSQL delivers one of equal payloads sent in one transaction
        texts = [(p, text) for p in pieces for text in _split(p.text, _TEXT_PER_NOTICE)]
        payloads = [
            json.dumps(
                {
                    "n": n,
                    "s": p.session_id,
                    "t": p.turn_id,
                    "p": p.step_id,
                    "a": p.after,
                    "x": text,
                },
                ensure_ascii=False,
            )
            for n, (p, text) in enumerate(texts)
        ]
        if not payloads:
            return
        async with self._errors(), self._pool.connection() as conn:
            await conn.execute(
                "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) "
                "WITH ORDINALITY AS t(payload, n) ORDER BY n",
                (TEXT_CHANNEL, payloads),
            )

    async def listen_text(self, sink: Callable[[TextPiece], None]) -> None:
        """``LISTEN`` on a connection of its own until cancelled; each notification
        that is a piece goes to ``sink`` (anything else on the channel is ignored)."""
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=max(1, int(self._timeout_s))
                )
            except psycopg.Error as exc:
                log.warning("listening for text: %s", str(exc).strip().splitlines()[:1])
                await asyncio.sleep(_RELISTEN_S)
                continue
            try:
                async with conn:
                    await conn.execute(f"LISTEN {TEXT_CHANNEL}".encode())
                    async for notice in conn.notifies():
                        piece = _piece(notice.payload)
                        if piece is not None:
                            sink(piece)
            except psycopg.Error as exc:
                log.warning("listening for text: %s", str(exc).strip().splitlines()[:1])
            await asyncio.sleep(_RELISTEN_S)

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[_PgTx]:
        async with self._errors(), self._pool.connection() as conn, conn.cursor() as cursor:
            # one round trip opens the transaction and reads the clock it is judged by
            await cursor.execute(_BEGIN)
            if cursor.description is None:  # on BEGIN's result: the clock's is next
                cursor.nextset()
            row = await cursor.fetchone()
            assert row is not None
            try:
                yield _PgTx(cursor, float(row[0]))
            except BaseException:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute(b"ROLLBACK")
                raise
            await conn.execute(b"COMMIT")

    async def check_session(
        self, *, lease: SessionLease, wake_started: tuple[int, int] | None = None
    ) -> None:
        # the commit guard runs before every append: one statement, no transaction, on
        # the server's clock (what the shared logic does in four round trips); the mark
        # of a delivered message rides in the first one
        check = (lease.session_id, lease.holder, lease.epoch)
        async with self._errors(), self._pool.connection() as conn:
            if wake_started is None:
                cursor = await conn.execute(_CHECK_SESSION, check)
            else:
                wake_id, offset = wake_started
                cursor = await conn.execute(_CHECK_STARTED, (offset, wake_id, *check))
            found = await cursor.fetchall()
        if not found:
            raise lease_lost(lease)

    async def mark_wake_started(self, *, wake_id: int, offset: int) -> None:
        # before every delivered message: one statement, needing no clock
        async with self._errors(), self._pool.connection() as conn:
            await conn.execute(
                b"UPDATE wakes SET started_offset = %s WHERE id = %s", (offset, wake_id)
            )

    async def take_steers(self, *, session_id: str, holder: str) -> list[SteerRow]:
        # the shared logic's six round trips as one: its statements sent together (a
        # pipeline), run one after another in one transaction; the steers are read by
        # a statement that starts once the lock is held, so a steer whose sender held
        # the lock first (it saw the lease held) is among them
        name = f"steers:{session_id}"
        async with self._errors(), self._pool.connection() as conn:
            async with conn.pipeline():
                await conn.execute(b"BEGIN")
                await conn.execute(_LOCK_NAME_ROW, (name,))
                await conn.execute(_LOCK_NAME, (name,))
                cursor = await conn.execute(_TAKE_STEERS, (holder, session_id, holder))
                await conn.execute(b"COMMIT")
            rows = await cursor.fetchall()
        return sorted(
            (
                SteerRow(steer_id=str(r[0]), session_id=str(r[1]), text=str(r[2]),
                         who=None if r[3] is None else str(r[3]), created_at=float(r[4]))
                for r in rows
            ),
            key=lambda r: (r.created_at, r.steer_id),
        )  # fmt: skip

    async def claim_sessions(self, *, holder: str, limit: int, ttl_s: float) -> list[SessionClaim]:
        # the shared logic's five statements as one (a round trip, not six)
        async with self._errors(), self._pool.connection() as conn:
            cursor = await conn.execute(_CLAIM_SESSIONS, (limit, holder, ttl_s, holder))
            rows = await cursor.fetchall()
        claims = []
        for row in rows:
            wake = Wake(id=int(row[0]), session_id=row[1], message=row[2],
                        due_at=float(row[3]), attempts=int(row[4]),
                        started_offset=None if row[5] is None else int(row[5]))  # fmt: skip
            lease = SessionLease(session_id=wake.session_id, holder=holder,
                                 epoch=int(row[6]), expires_at=float(row[7]))  # fmt: skip
            indexed = None
            if row[8] is not None:
                indexed = SessionRow(session_id=wake.session_id, status=row[8],
                                     last_activity=float(row[9]), events=int(row[10]),
                                     snapshot=row[11], model=row[12])  # fmt: skip
            claims.append(SessionClaim(wake=wake, lease=lease, row=indexed))
        return claims

    async def end_wake(
        self, *, wake_id: int, lease: SessionLease, end: WakeEnd | None = None
    ) -> None:
        end = end or WakeEnd()
        if end.parked:  # calls to index beside the row: the shared logic's transaction
            await super().end_wake(wake_id=wake_id, lease=lease, end=end)
            return
        # the index, the wake's end, the release and the notice: one statement (a round
        # trip, where the shared logic's transaction takes seven to nine)
        row = end.row
        indexed = row or SessionRow(session_id=lease.session_id, status="", last_activity=0.0)
        params = {
            "index": row is not None, "sid": indexed.session_id, "status": indexed.status,
            "events": indexed.events, "snapshot": indexed.snapshot, "model": indexed.model,
            "release_held": row is not None and end.release_held, "wake": wake_id,
            "finish": end.delay_s is None, "error": end.error, "delay": end.delay_s or 0.0,
            "held": 1 if end.held else 0, "leased": lease.session_id, "holder": lease.holder,
            "epoch": lease.epoch, "channel": WAKE_CHANNEL,
        }  # fmt: skip
        async with self._errors(), self._pool.connection() as conn:
            await conn.execute(_END_WAKE, params)

    @asynccontextmanager
    async def _errors(self) -> AsyncIterator[None]:
        """psycopg's and the pool's failures as ``ControlPlaneError``s."""
        try:
            yield
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


_BEGIN = b"BEGIN; SELECT extract(epoch from clock_timestamp())::float8"
_CHECK_SESSION = (
    b"SELECT 1 FROM session_leases WHERE session_id = %s AND holder = %s "
    b"AND epoch = %s AND expires_at > extract(epoch from clock_timestamp())"
)
#: ``mark_wake_started`` and the commit guard in one statement (its own transaction)
_CHECK_STARTED = (
    b"WITH started AS (UPDATE wakes SET started_offset = %s WHERE id = %s RETURNING 1) "
    + _CHECK_SESSION
)

#: ``take_steers``' statements: the lock of the session's steers (``_lock_name``'s), and
#: the steers not taken by the holder yet, marked taken by it
_LOCK_NAME_ROW = b"INSERT INTO semaphores (name) VALUES (%s) ON CONFLICT (name) DO NOTHING"
_LOCK_NAME = b"SELECT name FROM semaphores WHERE name = %s FOR UPDATE"
_TAKE_STEERS = (
    b"UPDATE session_steers SET taken_by = %s WHERE session_id = %s "
    b"AND (taken_by IS NULL OR taken_by <> %s) "
    b"RETURNING steer_id, session_id, text, who, created_at"
)

# ``claim_sessions`` in one statement (parameters: the limit, the holder, the ttl, the
# holder): the due wakes (``DUE_WAKES``, locked, skipping what others lock; the clock
# read as a scalar, so the scan of ``wakes_pending`` stops at it, as a parameter's
# would: joined as a row, it read every pending wake, timers far ahead among them), their
# sessions' leases granted in session order unless another holder's is current, the
# wakes of the granted ones claimed, with their sessions' index rows.
_CLAIM_SESSIONS = b"""
WITH clock AS (SELECT extract(epoch from clock_timestamp())::float8 AS t),
due AS (
  SELECT w.id, w.session_id FROM wakes w
  WHERE w.done_at IS NULL AND w.due_at <= (SELECT t FROM clock)
    AND (w.claimed_by IS NULL OR w.claim_expires_at <= (SELECT t FROM clock))
    AND NOT EXISTS (SELECT 1 FROM session_leases l WHERE l.session_id = w.session_id
                    AND l.expires_at > (SELECT t FROM clock))
    AND NOT EXISTS (SELECT 1 FROM wakes o WHERE o.session_id = w.session_id
                    AND o.done_at IS NULL AND o.due_at <= (SELECT t FROM clock)
                    AND (o.urgent > w.urgent OR (o.urgent = w.urgent AND o.id < w.id)))
  ORDER BY w.due_at, w.id LIMIT %s
  FOR UPDATE OF w SKIP LOCKED
),
leased AS (
  INSERT INTO session_leases (session_id, holder, epoch, expires_at)
  SELECT DISTINCT due.session_id, %s, 1, clock.t + %s FROM due, clock ORDER BY 1
  ON CONFLICT (session_id) DO UPDATE SET holder = excluded.holder,
    epoch = session_leases.epoch + 1, expires_at = excluded.expires_at
  WHERE session_leases.expires_at <= (SELECT t FROM clock)
  RETURNING session_id, epoch, expires_at
),
claimed AS (
  UPDATE wakes SET claimed_by = %s, claim_expires_at = leased.expires_at,
    attempts = wakes.attempts + 1
  FROM due JOIN leased ON leased.session_id = due.session_id
  WHERE wakes.id = due.id
  RETURNING wakes.id, wakes.session_id, wakes.message, wakes.due_at, wakes.attempts,
    wakes.started_offset, leased.epoch, leased.expires_at
)
SELECT c.id, c.session_id, c.message, c.due_at, c.attempts, c.started_offset, c.epoch,
  c.expires_at, s.status, s.last_activity, s.events, s.snapshot, s.model
FROM claimed c LEFT JOIN sessions s ON s.session_id = c.session_id
ORDER BY c.due_at, c.id
"""

# ``end_wake`` with no parked calls, in one statement (its own transaction): the index
# row (when ``index``), the parked calls cleared, the session's held wakes released (when
# ``release_held``; not this wake, which the next two end as asked), this wake finished
# or handed back, a cancel request of the grant no turn took settled (``not_running``),
# the lease released, and one notice when a wake became claimable.
_END_WAKE = b"""
WITH clock AS (SELECT extract(epoch from clock_timestamp())::float8 AS t),
indexed AS (
  INSERT INTO sessions (session_id, status, last_activity, events, snapshot, model)
  SELECT %(sid)s::text, %(status)s::text, clock.t, %(events)s::bigint, %(snapshot)s::text,
    %(model)s::text FROM clock WHERE %(index)s
  ON CONFLICT (session_id) DO UPDATE SET status = excluded.status,
    last_activity = excluded.last_activity, events = excluded.events,
    snapshot = COALESCE(excluded.snapshot, sessions.snapshot),
    model = COALESCE(excluded.model, sessions.model)
  RETURNING 1
),
unparked AS (DELETE FROM parked WHERE session_id = %(sid)s AND %(index)s RETURNING 1),
unheld AS (
  UPDATE wakes SET held = 0, due_at = LEAST(due_at, (SELECT t FROM clock))
  WHERE session_id = %(sid)s AND held = 1 AND done_at IS NULL AND id <> %(wake)s
    AND %(release_held)s
  RETURNING 1
),
finished AS (
  UPDATE wakes SET done_at = (SELECT t FROM clock), error = %(error)s::text
  WHERE id = %(wake)s AND %(finish)s
  RETURNING 1
),
handed AS (
  UPDATE wakes SET claimed_by = NULL, claim_expires_at = NULL,
    due_at = GREATEST(due_at, (SELECT t FROM clock) + %(delay)s::float8), held = %(held)s
  WHERE id = %(wake)s AND done_at IS NULL AND NOT %(finish)s
  RETURNING (%(delay)s::float8 <= 0 AND %(held)s = 0) AS due
),
unasked AS (
  UPDATE session_cancels SET status = 'not_running', settled_at = (SELECT t FROM clock)
  WHERE session_id = %(leased)s AND epoch = %(epoch)s AND status = 'pending'
  RETURNING 1
),
released AS (
  UPDATE session_leases SET expires_at = 0 WHERE session_id = %(leased)s
    AND holder = %(holder)s AND epoch = %(epoch)s
  RETURNING 1
)
SELECT pg_notify(%(channel)s, '') WHERE EXISTS (SELECT 1 FROM unheld)
  OR EXISTS (SELECT 1 FROM handed WHERE due)
  OR (EXISTS (SELECT 1 FROM released) AND EXISTS (SELECT 1 FROM wakes, clock
      WHERE wakes.session_id = %(leased)s AND wakes.done_at IS NULL AND wakes.id <> %(wake)s
        AND wakes.due_at <= clock.t AND wakes.held = 0))
"""


async def _check_connection(conn: psycopg.AsyncConnection[Any]) -> None:
    """The pool's check before lending a connection, without a round trip for a healthy
    one: an idle connection has nothing to read, while one the server closed (a restart,
    a terminated backend) reads as ready (its error and end of stream); only that one is
    checked by a query, which fails, and the pool connects anew."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    if readable:
        await AsyncConnectionPool.check_connection(conn)


def _safe(dsn: str) -> str:
    """The DSN without a password, for messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(unparsable DSN)"
    info.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in sorted(info.items()))


def _split(text: str, size: int) -> list[str]:
    return [text[n : n + size] for n in range(0, len(text), size)]


def _piece(payload: str) -> TextPiece | None:
    """A notification's piece, or None when it is not one (the channel is open to any
    client of the database: a malformed payload is dropped, never raised)."""
    try:
        found = json.loads(payload)
        piece = TextPiece(
            session_id=found["s"],
            turn_id=found["t"],
            step_id=found["p"],
            after=found["a"],
            text=found["x"],
        )
    except (ValueError, KeyError, TypeError):
        return None
    fields = (piece.session_id, piece.turn_id, piece.step_id, piece.text)
    if not all(isinstance(f, str) for f in fields) or type(piece.after) is not int:
        return None
    return piece

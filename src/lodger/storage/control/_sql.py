"""The control plane's logic in portable SQL, shared by the SQLite and PostgreSQL
implementations: they supply a transaction (``_Tx``) and a few dialect words.

Statements use ``%s`` placeholders (SQLite's transaction turns them into ``?``). Every
method is one transaction that reads the control plane's clock once at its start, so
expiry is always judged by one clock, never by a worker's.
"""

from __future__ import annotations

import base64
import dataclasses
import secrets
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from lodger.errors import ControlPlaneError, LeaseLostError, StaleTokenError, UsageError
from lodger.storage.control.interface import (
    ApprovalRequest,
    HostToken,
    ModeRequest,
    NamedLease,
    ParkedCall,
    QueuedRow,
    Schedule,
    SessionCancel,
    SessionClaim,
    SessionLease,
    SessionRow,
    SteerRow,
    Wake,
    WakeEnd,
    WakeInfo,
)
from lodger.storage.control.schedule import next_fire

__all__ = [
    "DUE_SCHEDULES",
    "DUE_WAKES",
    "LATEST_VERSION",
    "MIGRATIONS",
    "SqlControlPlane",
    "approval_key",
    "lease_lost",
]

# Versioned schema. Version 1: what one session needs (leases, wakes, idempotency keys,
# the session and parked indexes). Version 2: what spans sessions (cron schedules and the
# global authorities). Version 3: approvals asked by worker-run calls and answered from
# any host. Version 4: what the HTTP hosts in front of one control plane share (their
# bearer tokens, as SHA-256 hashes only, and the webhook deliveries that made a session).
# Version 5: why a wake failed for good (a worker gave up on it), so it does not read done.
# Version 6: approvals that park (``mode`` 'park': live until their own expiry, without a
# lease, and answering one wakes the session). Version 7: a wake held until its session's
# open turn settles (a message for a session that waits for an approval), made due the
# moment a worker sees the turn settle rather than at its next look. Version 8: the due
# schedules found by an index (a worker looks every second), as the due wakes already are.
# Version 9: steers for sessions that run on workers, taken by the worker holding the
# session. Version 10: cancel requests for a session's running turn, one per lease grant
# (epoch), for the worker that holds that lease to deliver. Version 11: the follow-up
# queue of sessions that run on workers (``session_queue``: each message with its author,
# position and policy, and who changed it last); urgent wakes (a message sent with policy
# interrupt or rollback runs before the session's other waiting messages); a cancel
# request's policy (``cancel``, or the ``interrupt``/``rollback`` of such a message);
# permission-mode switches for a turn a worker runs (``session_modes``).
# A database at an older version is brought to the newest at start; nothing is lost.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, status TEXT NOT NULL, "
        "last_activity {real} NOT NULL, events BIGINT NOT NULL DEFAULT 0, snapshot TEXT, "
        "model TEXT)",
        "CREATE TABLE session_leases (session_id TEXT PRIMARY KEY, holder TEXT NOT NULL, "
        "epoch BIGINT NOT NULL, expires_at {real} NOT NULL)",
        "CREATE TABLE wakes (id {serial}, session_id TEXT NOT NULL, message TEXT, "
        "due_at {real} NOT NULL, claimed_by TEXT, claim_expires_at {real}, "
        "attempts INTEGER NOT NULL DEFAULT 0, started_offset BIGINT, done_at {real})",
        "CREATE INDEX wakes_pending ON wakes (due_at, id) WHERE done_at IS NULL",
        "CREATE INDEX wakes_session ON wakes (session_id, id) WHERE done_at IS NULL",
        "CREATE TABLE idempotency_keys (key TEXT PRIMARY KEY, wake_id BIGINT, "
        "created_at {real} NOT NULL)",
        "CREATE TABLE parked (session_id TEXT NOT NULL, call_id TEXT NOT NULL, "
        "tool TEXT NOT NULL, reason TEXT NOT NULL, since {real} NOT NULL, "
        "PRIMARY KEY (session_id, call_id))",
    ),
    2: (
        "CREATE TABLE schedules (id {serial}, session_id TEXT NOT NULL, cron TEXT NOT NULL, "
        "message TEXT NOT NULL, next_at {real} NOT NULL)",
        "CREATE TABLE named_leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, "
        "token BIGINT NOT NULL, expires_at {real} NOT NULL)",
        "CREATE TABLE semaphores (name TEXT PRIMARY KEY)",
        "CREATE TABLE permits (id TEXT PRIMARY KEY, name TEXT NOT NULL, holder TEXT NOT NULL, "
        "expires_at {real} NOT NULL)",
        "CREATE INDEX permits_name ON permits (name, expires_at)",
        "CREATE TABLE quota_events (name TEXT NOT NULL, at {real} NOT NULL)",
        "CREATE INDEX quota_events_name ON quota_events (name, at)",
    ),
    3: (
        "CREATE TABLE approvals (session_id TEXT NOT NULL, call_id TEXT NOT NULL, "
        "tool TEXT NOT NULL, summary TEXT NOT NULL, status TEXT NOT NULL, "
        "asked_by TEXT NOT NULL, answered_by TEXT, asked_at {real} NOT NULL, "
        "expires_at {real} NOT NULL, answered_at {real}, PRIMARY KEY (session_id, call_id))",
        "CREATE INDEX approvals_status ON approvals (status, asked_at)",
        # a host shows a message (a wake) with the key it was sent with
        "CREATE INDEX idempotency_keys_wake ON idempotency_keys (wake_id)",
    ),
    4: (
        "CREATE TABLE host_tokens (token_hash TEXT PRIMARY KEY, scope TEXT NOT NULL "
        "CHECK (scope IN ('admin', 'session')), session_id TEXT, label TEXT NOT NULL, "
        "created_at {real} NOT NULL, revoked_at {real}, "
        "CHECK ((scope = 'admin') = (session_id IS NULL)))",
        "CREATE TABLE webhook_deliveries (hook TEXT NOT NULL, delivery TEXT NOT NULL, "
        "session_id TEXT NOT NULL, received_at {real} NOT NULL, PRIMARY KEY (hook, delivery))",
    ),
    5: (
        # a wake a worker gave up on (``max_attempts``) ends with why, not as done
        "ALTER TABLE wakes ADD COLUMN error TEXT",
    ),
    6: (
        # 'wait': a worker holds the session and waits; 'park': the session is dormant
        "ALTER TABLE approvals ADD COLUMN mode TEXT NOT NULL DEFAULT 'wait'",
    ),
    7: (
        # 1: handed back until the session's open turn settles (``release_held_wakes``)
        "ALTER TABLE wakes ADD COLUMN held INTEGER NOT NULL DEFAULT 0",
    ),
    8: (
        # finding the due schedules walks the due ones, not every schedule stored
        "CREATE INDEX schedules_due ON schedules (next_at)",
    ),
    # steers for sessions that run on workers (``Steers``): taken by the worker holding
    # the session, sent as wakes once none does
    9: (
        "CREATE TABLE session_steers (steer_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, "
        "text TEXT NOT NULL, who TEXT, created_at {real} NOT NULL, taken_by TEXT)",
        "CREATE INDEX session_steers_session ON session_steers (session_id, created_at)",
    ),
    10: (
        # a cancel is for the turn the lease grant ``epoch`` runs: a later grant (another
        # run) never reads it, and a second request for the same grant is the same row
        "CREATE TABLE session_cancels (id {serial}, session_id TEXT NOT NULL, "
        "epoch BIGINT NOT NULL, who TEXT, reason TEXT NOT NULL, requested_at {real} NOT NULL, "
        "status TEXT NOT NULL DEFAULT 'pending', settled_at {real}, UNIQUE (session_id, epoch))",
    ),
    11: (
        # ``position`` orders a session's queue (renumbered 0.. at each change);
        # ``taken_by``: the worker committing it to the session's log right now
        "CREATE TABLE session_queue (message_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, "
        "text TEXT NOT NULL, policy TEXT NOT NULL, who TEXT, position BIGINT NOT NULL, "
        "created_at {real} NOT NULL, changed_by TEXT, changed_at {real}, taken_by TEXT)",
        "CREATE INDEX session_queue_session ON session_queue (session_id, position)",
        "ALTER TABLE wakes ADD COLUMN urgent INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE session_cancels ADD COLUMN policy TEXT NOT NULL DEFAULT 'cancel'",
        # permission-mode switches for the turn a lease grant runs, delivered by its holder
        "CREATE TABLE session_modes (id {serial}, session_id TEXT NOT NULL, "
        "epoch BIGINT NOT NULL, mode TEXT NOT NULL, who TEXT, requested_at {real} NOT NULL, "
        "status TEXT NOT NULL DEFAULT 'pending', previous TEXT, settled_at {real})",
        "CREATE INDEX session_modes_lease ON session_modes (session_id, epoch, status)",
    ),
    # sealed secrets by name (MCP OAuth logins for workers): values are sealed by the
    # caller with a key the store never holds (``lodger.tools._mcp_credentials``)
    12: (
        "CREATE TABLE secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL, "
        "updated_at {real} NOT NULL)",
    ),
}
LATEST_VERSION = max(MIGRATIONS)

_WAKE_COLUMNS = "id, session_id, message, due_at, attempts, started_offset"
#: the claimable wakes (parameters: now four times, then the limit): due, unclaimed or
#: abandoned by a dead worker, of a session nobody holds, each its session's first due
#: one (an urgent wake before the others, else the oldest). ``wakes_pending`` orders
#: them by due time, so the scan stops after what is due.
DUE_WAKES = (
    f"SELECT {_WAKE_COLUMNS} FROM wakes WHERE done_at IS NULL AND due_at <= %s "
    "AND (claimed_by IS NULL OR claim_expires_at <= %s) "
    "AND NOT EXISTS (SELECT 1 FROM session_leases l WHERE "
    "l.session_id = wakes.session_id AND l.expires_at > %s) "
    "AND NOT EXISTS (SELECT 1 FROM wakes w WHERE w.session_id = wakes.session_id "
    "AND w.done_at IS NULL AND w.due_at <= %s "
    "AND (w.urgent > wakes.urgent OR (w.urgent = wakes.urgent AND w.id < wakes.id))) "
    "ORDER BY due_at, id LIMIT %s"
)
#: the schedules due (parameter: now), found through ``schedules_due``
DUE_SCHEDULES = "SELECT id, session_id, cron, message FROM schedules WHERE next_at <= %s"
# A waiting approval is live while the worker that asked still holds the session's lease
# (its heartbeat renews it while it waits): a dead worker's question is answered by
# nobody. A parked one is live until its own expiry: nobody holds the dormant session.
_ASKER_HOLDS = (
    "(approvals.mode = 'park' OR EXISTS (SELECT 1 FROM session_leases l WHERE "
    "l.session_id = approvals.session_id AND l.holder = approvals.asked_by "
    "AND l.expires_at > %s))"
)
_APPROVAL_COLUMNS = (
    "session_id, call_id, tool, summary, status, asked_by, answered_by, asked_at, expires_at, mode"
)
_TOKEN_COLUMNS = "token_hash, scope, session_id, label, created_at, revoked_at"
_HEX = frozenset("0123456789abcdef")


class _Tx(Protocol):
    now: float

    async def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    async def change(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a statement; the number of rows it changed."""
        ...


def _wake(row: tuple[Any, ...]) -> Wake:
    return Wake(
        id=int(row[0]),
        session_id=row[1],
        message=row[2],
        due_at=float(row[3]),
        attempts=int(row[4]),
        started_offset=None if row[5] is None else int(row[5]),
    )


def _session_row(row: tuple[Any, ...]) -> SessionRow:
    return SessionRow(
        session_id=row[0],
        status=row[1],
        last_activity=float(row[2]),
        events=int(row[3]),
        snapshot=row[4],
        model=row[5],
    )


def _host_token(row: tuple[Any, ...]) -> HostToken:
    return HostToken(
        token_hash=row[0],
        scope=row[1],
        session_id=row[2],
        label=row[3],
        created_at=float(row[4]),
        revoked_at=None if row[5] is None else float(row[5]),
    )


def _check_hash(token_hash: str) -> None:
    """Only a SHA-256 hex digest is kept: anything else may be a plain token passed by
    mistake, which must never reach the database (or its logs)."""
    if len(token_hash) != 64 or not set(token_hash) <= _HEX:
        raise UsageError(
            "a host token is kept as its SHA-256 (64 lowercase hex digits), never as itself",
            hint="pass lodger.storage.control.host_index.hash_token(token)",
            code="invalid_token_hash",
        )


def _approval(row: tuple[Any, ...]) -> ApprovalRequest:
    return ApprovalRequest(
        session_id=row[0],
        call_id=row[1],
        tool=row[2],
        summary=row[3],
        status=row[4],
        asked_by=row[5],
        answered_by=row[6],
        asked_at=float(row[7]),
        expires_at=float(row[8]),
        mode=row[9],
    )


def approval_key(session_id: str, call_id: str) -> str:
    """The idempotency key of the wake that a parked approval's answer (or expiry) sends."""
    return f"approval:{session_id}:{call_id}"


class SqlControlPlane:
    """The shared logic; subclasses provide ``_tx`` and the dialect words."""

    #: appended to a SELECT that claims rows other transactions may be claiming too
    _skip_locked = ""
    #: appended to a SELECT whose rows this transaction will update
    _for_update = ""
    _types = {"serial": "INTEGER PRIMARY KEY AUTOINCREMENT", "real": "REAL"}

    def _tx(self) -> AbstractAsyncContextManager[_Tx]:
        raise NotImplementedError

    async def start(self, *, version: int = LATEST_VERSION) -> None:
        """Connect and migrate to ``version`` (the newest by default)."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def _migration_lock(self, tx: _Tx) -> None:
        """Serialize concurrent migrations (PostgreSQL takes an advisory lock)."""

    # ----------------------------------------------------------- schema

    async def migrate(self, *, to: int = LATEST_VERSION) -> int:
        """Apply every migration after the database's version up to ``to``; the version."""
        async with self._tx() as tx:
            await self._migration_lock(tx)
            await tx.change("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            rows = await tx.rows("SELECT max(version) FROM schema_version")
            current = int(rows[0][0]) if rows and rows[0][0] is not None else 0
            if current > LATEST_VERSION:
                raise ControlPlaneError(
                    f"the control plane's schema is at version {current}, newer than this "
                    f"lodger knows ({LATEST_VERSION})",
                    hint="upgrade lodger on this machine; never run an older worker on it",
                    code="schema_too_new",
                )
            # numbers are taken per change, so one may be missing (another branch's)
            for version in sorted(v for v in MIGRATIONS if current < v <= to):
                for statement in MIGRATIONS[version]:
                    await tx.change(statement.format(**self._types))
                await tx.change("INSERT INTO schema_version (version) VALUES (%s)", (version,))
            return max(current, to)

    async def schema_version(self) -> int:
        async with self._tx() as tx:
            rows = await tx.rows("SELECT max(version) FROM schema_version")
            return int(rows[0][0]) if rows[0][0] is not None else 0

    async def now(self) -> float:
        async with self._tx() as tx:
            return tx.now

    # ----------------------------------------------------------- session leases

    async def acquire_session(
        self, *, session_id: str, holder: str, ttl_s: float
    ) -> SessionLease | None:
        async with self._tx() as tx:
            expires = tx.now + ttl_s
            inserted = await tx.change(
                "INSERT INTO session_leases (session_id, holder, epoch, expires_at) "
                "VALUES (%s, %s, 1, %s) ON CONFLICT (session_id) DO NOTHING",
                (session_id, holder, expires),
            )
            if inserted:
                return SessionLease(
                    session_id=session_id, holder=holder, epoch=1, expires_at=expires
                )
            rows = await tx.rows(
                "SELECT epoch, expires_at FROM session_leases WHERE session_id = %s"
                + self._for_update,
                (session_id,),
            )
            epoch, current_expiry = int(rows[0][0]), float(rows[0][1])
            if current_expiry > tx.now:
                return None
            await tx.change(
                "UPDATE session_leases SET holder = %s, epoch = %s, expires_at = %s "
                "WHERE session_id = %s",
                (holder, epoch + 1, expires, session_id),
            )
            return SessionLease(
                session_id=session_id, holder=holder, epoch=epoch + 1, expires_at=expires
            )

    async def renew_session(self, *, lease: SessionLease, ttl_s: float) -> SessionLease:
        async with self._tx() as tx:
            expires = tx.now + ttl_s
            changed = await tx.change(
                "UPDATE session_leases SET expires_at = %s WHERE session_id = %s "
                "AND holder = %s AND epoch = %s AND expires_at > %s",
                (expires, lease.session_id, lease.holder, lease.epoch, tx.now),
            )
            if not changed:
                raise lease_lost(lease)
            return SessionLease(
                session_id=lease.session_id,
                holder=lease.holder,
                epoch=lease.epoch,
                expires_at=expires,
            )

    async def check_session(
        self, *, lease: SessionLease, wake_started: tuple[int, int] | None = None
    ) -> None:
        async with self._tx() as tx:
            if wake_started is not None:
                wake_id, offset = wake_started
                await tx.change(
                    "UPDATE wakes SET started_offset = %s WHERE id = %s", (offset, wake_id)
                )
            rows = await tx.rows(
                "SELECT 1 FROM session_leases WHERE session_id = %s AND holder = %s "
                "AND epoch = %s AND expires_at > %s",
                (lease.session_id, lease.holder, lease.epoch, tx.now),
            )
            if not rows:
                raise lease_lost(lease)

    async def release_session(self, *, lease: SessionLease) -> None:
        async with self._tx() as tx:
            await self._release(tx, lease)

    async def _release(self, tx: _Tx, lease: SessionLease) -> None:
        # The row stays (expired) so the next grant's epoch is higher than every earlier one.
        released = await tx.change(
            "UPDATE session_leases SET expires_at = 0 WHERE session_id = %s "
            "AND holder = %s AND epoch = %s",
            (lease.session_id, lease.holder, lease.epoch),
        )
        if released:
            await self._notify_if_due(tx, lease.session_id)

    # ----------------------------------------------------------- the wake queue

    async def send(
        self,
        *,
        session_id: str,
        message: str | None,
        due_at: float | None = None,
        idempotency_key: str | None = None,
        urgent: bool = False,
    ) -> int | None:
        async with self._tx() as tx:
            return await self._send(tx, session_id, message, due_at, idempotency_key, urgent)

    async def _send(
        self,
        tx: _Tx,
        session_id: str,
        message: str | None,
        due_at: float | None,
        idempotency_key: str | None,
        urgent: bool = False,
    ) -> int | None:
        if idempotency_key is not None:
            fresh = await tx.change(
                "INSERT INTO idempotency_keys (key, created_at) VALUES (%s, %s) "
                "ON CONFLICT (key) DO NOTHING",
                (idempotency_key, tx.now),
            )
            if not fresh:
                return None
        rows = await tx.rows(
            # ``urgent`` only when it is (a database before version 11 has no such column)
            "INSERT INTO wakes (session_id, message, due_at"
            + (", urgent) VALUES (%s, %s, %s, 1)" if urgent else ") VALUES (%s, %s, %s)")
            + " RETURNING id",
            (session_id, message, tx.now if due_at is None else due_at),
        )
        wake_id = int(rows[0][0])
        if idempotency_key is not None:
            await tx.change(
                "UPDATE idempotency_keys SET wake_id = %s WHERE key = %s",
                (wake_id, idempotency_key),
            )
        if due_at is None or due_at <= tx.now:
            await self._notify_wakes(tx)
        return wake_id

    async def _due_wakes(self, tx: _Tx, limit: int) -> list[Wake]:
        """Due, unclaimed (or abandoned by a dead worker) wakes of sessions nobody holds,
        each its session's oldest due wake (so a session's messages keep their order),
        one per session, oldest first. The scan walks ``wakes_pending`` from the oldest
        due time and stops at ``limit``: it costs what is due, not what is stored."""
        rows = await tx.rows(DUE_WAKES + self._skip_locked, (tx.now, tx.now, tx.now, tx.now, limit))
        wakes: list[Wake] = []
        seen: set[str] = set()
        for row in rows:
            wake = _wake(row)
            if wake.session_id not in seen:
                seen.add(wake.session_id)
                wakes.append(wake)
        return wakes

    async def _mark_claimed(
        self, tx: _Tx, wakes: Sequence[Wake], holder: str, ttl_s: float
    ) -> list[Wake]:
        if not wakes:
            return []
        marks = ", ".join("%s" for _ in wakes)
        await tx.change(
            "UPDATE wakes SET claimed_by = %s, claim_expires_at = %s, "
            f"attempts = attempts + 1 WHERE id IN ({marks})",
            (holder, tx.now + ttl_s, *(w.id for w in wakes)),
        )
        return [dataclasses.replace(w, attempts=w.attempts + 1) for w in wakes]

    async def claim_wakes(self, *, holder: str, limit: int, ttl_s: float) -> list[Wake]:
        async with self._tx() as tx:
            return await self._mark_claimed(tx, await self._due_wakes(tx, limit), holder, ttl_s)

    async def claim_sessions(self, *, holder: str, limit: int, ttl_s: float) -> list[SessionClaim]:
        async with self._tx() as tx:
            due = await self._due_wakes(tx, limit)
            if not due:
                return []
            expires = tx.now + ttl_s
            # every lease in one upsert, in session order (two claimers lock rows in the
            # same order); a lease another holder took since is not granted
            sids = sorted(w.session_id for w in due)
            granted = await tx.rows(
                "INSERT INTO session_leases (session_id, holder, epoch, expires_at) VALUES "
                + ", ".join("(%s, %s, 1, %s)" for _ in sids)
                + " ON CONFLICT (session_id) DO UPDATE SET holder = excluded.holder, "
                "epoch = session_leases.epoch + 1, expires_at = excluded.expires_at "
                "WHERE session_leases.expires_at <= %s RETURNING session_id, epoch",
                (*(v for sid in sids for v in (sid, holder, expires)), tx.now),
            )
            epochs = {str(r[0]): int(r[1]) for r in granted}
            wakes = await self._mark_claimed(
                tx, [w for w in due if w.session_id in epochs], holder, ttl_s
            )
            if not wakes:
                return []
            marks = ", ".join("%s" for _ in wakes)
            rows = await tx.rows(
                "SELECT session_id, status, last_activity, events, snapshot, model "
                f"FROM sessions WHERE session_id IN ({marks})",
                tuple(w.session_id for w in wakes),
            )
            indexed = {r[0]: _session_row(r) for r in rows}
            return [
                SessionClaim(
                    wake=w,
                    lease=SessionLease(
                        session_id=w.session_id,
                        holder=holder,
                        epoch=epochs[w.session_id],
                        expires_at=expires,
                    ),
                    row=indexed.get(w.session_id),
                )
                for w in wakes
            ]

    async def end_wake(
        self, *, wake_id: int, lease: SessionLease, end: WakeEnd | None = None
    ) -> None:
        end = end or WakeEnd()
        async with self._tx() as tx:
            if end.row is not None:  # the index first: this wake ends as asked after it
                await self._index(tx, end.row, end.parked, end.release_held)
            if end.delay_s is None:
                await tx.change(
                    "UPDATE wakes SET done_at = %s, error = %s WHERE id = %s",
                    (tx.now, end.error, wake_id),
                )
            else:
                await self._hand_back(tx, wake_id, end.delay_s, end.held)
            await tx.change(
                "UPDATE session_cancels SET status = 'not_running', settled_at = %s "
                "WHERE session_id = %s AND epoch = %s AND status = 'pending'",
                (tx.now, lease.session_id, lease.epoch),
            )
            await self._release(tx, lease)

    async def _notify_wakes(self, tx: _Tx) -> None:
        """Wakes became due in this transaction: tell the listening workers (at commit).
        A control plane without notifications leaves them to poll."""

    async def _notify_if_due(self, tx: _Tx, session_id: str) -> None:
        """The session's lease was released: a wake of it that waited for the lease is
        claimable now. Only a control plane that notifies looks (PostgreSQL's release
        does, in the same statement)."""

    async def renew_wake(self, *, wake_id: int, holder: str, ttl_s: float) -> None:
        async with self._tx() as tx:
            await tx.change(
                "UPDATE wakes SET claim_expires_at = %s WHERE id = %s AND claimed_by = %s "
                "AND done_at IS NULL",
                (tx.now + ttl_s, wake_id, holder),
            )

    async def mark_wake_started(self, *, wake_id: int, offset: int) -> None:
        async with self._tx() as tx:
            await tx.change("UPDATE wakes SET started_offset = %s WHERE id = %s", (offset, wake_id))

    async def finish_wake(self, *, wake_id: int, error: str | None = None) -> None:
        async with self._tx() as tx:
            await tx.change(
                "UPDATE wakes SET done_at = %s, error = %s WHERE id = %s", (tx.now, error, wake_id)
            )

    async def hand_back_wake(
        self, *, wake_id: int, delay_s: float = 0.0, held: bool = False
    ) -> None:
        async with self._tx() as tx:
            await self._hand_back(tx, wake_id, delay_s, held)

    async def _hand_back(self, tx: _Tx, wake_id: int, delay_s: float, held: bool) -> None:
        changed = await tx.change(
            "UPDATE wakes SET claimed_by = NULL, claim_expires_at = NULL, "
            "due_at = CASE WHEN due_at > %s THEN due_at ELSE %s END, held = %s "
            "WHERE id = %s AND done_at IS NULL",
            (tx.now + delay_s, tx.now + delay_s, 1 if held else 0, wake_id),
        )
        if changed and delay_s <= 0 and not held:
            await self._notify_wakes(tx)

    async def release_held_wakes(self, *, session_id: str) -> int:
        async with self._tx() as tx:
            return await self._release_held(tx, session_id)

    async def _release_held(self, tx: _Tx, session_id: str) -> int:
        released = await tx.change(
            "UPDATE wakes SET held = 0, "
            "due_at = CASE WHEN due_at > %s THEN %s ELSE due_at END "
            "WHERE session_id = %s AND held = 1 AND done_at IS NULL",
            (tx.now, tx.now, session_id),
        )
        if released:
            await self._notify_wakes(tx)
        return released

    async def pending_wakes(self, *, session_id: str | None = None) -> list[Wake]:
        async with self._tx() as tx:
            if session_id is None:
                rows = await tx.rows(
                    f"SELECT {_WAKE_COLUMNS} FROM wakes WHERE done_at IS NULL ORDER BY id"
                )
            else:
                rows = await tx.rows(
                    f"SELECT {_WAKE_COLUMNS} FROM wakes WHERE done_at IS NULL "
                    "AND session_id = %s ORDER BY id",
                    (session_id,),
                )
            return [_wake(row) for row in rows]

    async def get_wake(self, *, wake_id: int) -> WakeInfo | None:
        async with self._tx() as tx:
            return await self._wake_info(tx, wake_id)

    async def wake_for_key(self, *, idempotency_key: str) -> WakeInfo | None:
        async with self._tx() as tx:
            rows = await tx.rows(
                "SELECT wake_id FROM idempotency_keys WHERE key = %s", (idempotency_key,)
            )
            if not rows or rows[0][0] is None:
                return None
            return await self._wake_info(tx, int(rows[0][0]))

    async def _wake_info(self, tx: _Tx, wake_id: int) -> WakeInfo | None:
        rows = await tx.rows(
            f"SELECT {_WAKE_COLUMNS}, claimed_by, claim_expires_at, done_at, error FROM wakes "
            "WHERE id = %s",
            (wake_id,),
        )
        if not rows:
            return None
        row = rows[0]
        if row[8] is not None:
            status = "done" if row[9] is None else "failed"
        elif row[6] is not None and row[7] is not None and float(row[7]) > tx.now:
            status = "running"
        else:
            status = "queued"
        keys = await tx.rows("SELECT key FROM idempotency_keys WHERE wake_id = %s", (wake_id,))
        return WakeInfo(
            wake=_wake(row[:6]),
            status=status,
            idempotency_key=keys[0][0] if keys else None,
            error=None if row[9] is None else str(row[9]),
        )

    async def add_schedule(
        self, *, session_id: str, cron: str, message: str, start: float | None = None
    ) -> Schedule:
        async with self._tx() as tx:
            first = next_fire(cron, tx.now if start is None else start)
            rows = await tx.rows(
                "INSERT INTO schedules (session_id, cron, message, next_at) "
                "VALUES (%s, %s, %s, %s) RETURNING id",
                (session_id, cron, message, first),
            )
            return Schedule(
                id=int(rows[0][0]), session_id=session_id, cron=cron, message=message,
                next_at=first,
            )  # fmt: skip

    async def list_schedules(self) -> list[Schedule]:
        async with self._tx() as tx:
            rows = await tx.rows(
                "SELECT id, session_id, cron, message, next_at FROM schedules ORDER BY id"
            )
            return [
                Schedule(id=int(r[0]), session_id=r[1], cron=r[2], message=r[3], next_at=r[4])
                for r in rows
            ]

    async def fire_schedules(self) -> int:
        async with self._tx() as tx:
            rows = await tx.rows(DUE_SCHEDULES + self._skip_locked, (tx.now,))
            for schedule_id, session_id, cron, message in rows:
                await tx.change(
                    "INSERT INTO wakes (session_id, message, due_at) VALUES (%s, %s, %s)",
                    (session_id, message, tx.now),
                )
                await tx.change(
                    "UPDATE schedules SET next_at = %s WHERE id = %s",
                    (next_fire(cron, tx.now), schedule_id),
                )
            if rows:
                await self._notify_wakes(tx)
            return len(rows)

    # ----------------------------------------------------------- indexes

    async def record_session(self, *, row: SessionRow) -> None:
        async with self._tx() as tx:
            await self._record(tx, row)

    async def _record(self, tx: _Tx, row: SessionRow) -> None:
        await tx.change(
            "INSERT INTO sessions (session_id, status, last_activity, events, snapshot, "
            "model) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (session_id) DO UPDATE "
            "SET status = excluded.status, last_activity = excluded.last_activity, "
            "events = excluded.events, "
            "snapshot = COALESCE(excluded.snapshot, sessions.snapshot), "
            "model = COALESCE(excluded.model, sessions.model)",
            (row.session_id, row.status, row.last_activity, row.events, row.snapshot,
             row.model),
        )  # fmt: skip

    async def index_session(
        self, *, row: SessionRow, parked: Sequence[ParkedCall], release_held: bool = False
    ) -> int:
        async with self._tx() as tx:
            return await self._index(tx, row, parked, release_held)

    async def _index(
        self, tx: _Tx, row: SessionRow, parked: Sequence[ParkedCall], release_held: bool
    ) -> int:
        await self._record(tx, dataclasses.replace(row, last_activity=tx.now))
        await self._set_parked(
            tx, row.session_id, [dataclasses.replace(c, since=tx.now) for c in parked]
        )
        return await self._release_held(tx, row.session_id) if release_held else 0

    async def get_session(self, *, session_id: str) -> SessionRow | None:
        async with self._tx() as tx:
            rows = await tx.rows(
                "SELECT session_id, status, last_activity, events, snapshot, model "
                "FROM sessions WHERE session_id = %s",
                (session_id,),
            )
            return _session_row(rows[0]) if rows else None

    async def list_sessions(self) -> list[SessionRow]:
        async with self._tx() as tx:
            rows = await tx.rows(
                "SELECT session_id, status, last_activity, events, snapshot, model "
                "FROM sessions ORDER BY last_activity DESC, session_id"
            )
            return [_session_row(row) for row in rows]

    async def set_parked(self, *, session_id: str, calls: Sequence[ParkedCall]) -> None:
        async with self._tx() as tx:
            await self._set_parked(tx, session_id, calls)

    async def _set_parked(self, tx: _Tx, session_id: str, calls: Sequence[ParkedCall]) -> None:
        await tx.change("DELETE FROM parked WHERE session_id = %s", (session_id,))
        for call in calls:
            await tx.change(
                "INSERT INTO parked (session_id, call_id, tool, reason, since) "
                "VALUES (%s, %s, %s, %s, %s)",
                (session_id, call.call_id, call.tool, call.reason, call.since),
            )

    async def list_parked(self, *, session_id: str | None = None) -> list[ParkedCall]:
        async with self._tx() as tx:
            sql = "SELECT session_id, call_id, tool, reason, since FROM parked"
            params: tuple[Any, ...] = ()
            if session_id is not None:
                sql += " WHERE session_id = %s"
                params = (session_id,)
            rows = await tx.rows(sql + " ORDER BY since, session_id, call_id", params)
            return [
                ParkedCall(session_id=r[0], call_id=r[1], tool=r[2], reason=r[3], since=r[4])
                for r in rows
            ]

    # ----------------------------------------------------------- approvals

    async def ask_approval(
        self,
        *,
        session_id: str,
        call_id: str,
        tool: str,
        summary: str,
        holder: str,
        wait_s: float,
    ) -> ApprovalRequest:
        async with self._tx() as tx:
            expires = tx.now + wait_s
            inserted = await tx.change(
                "INSERT INTO approvals (session_id, call_id, tool, summary, status, asked_by, "
                "asked_at, expires_at) VALUES (%s, %s, %s, %s, 'pending', %s, %s, %s) "
                "ON CONFLICT (session_id, call_id) DO NOTHING",
                (session_id, call_id, tool, summary, holder, tx.now, expires),
            )
            if not inserted:
                # Asked again (a resume after a crash): an answer given meanwhile stands;
                # an expired or abandoned question is asked afresh.
                # A parked question that expired stays expired (a denial); a pending
                # parked one is waited for here, as this worker's question.
                await tx.change(
                    "UPDATE approvals SET status = 'pending', asked_by = %s, asked_at = %s, "
                    "expires_at = %s, answered_by = NULL, answered_at = NULL, mode = 'wait' "
                    "WHERE session_id = %s AND call_id = %s AND ((status = 'expired' AND "
                    "mode = 'wait') OR (status = 'pending' AND mode = 'wait' AND "
                    "(expires_at <= %s OR asked_by <> %s)) OR (status = 'pending' AND "
                    "mode = 'park' AND expires_at > %s))",
                    (holder, tx.now, expires, session_id, call_id, tx.now, holder, tx.now),
                )
            return await self._approval_of(tx, session_id, call_id)

    async def park_approval(
        self,
        *,
        session_id: str,
        call_id: str,
        tool: str,
        summary: str,
        holder: str,
        expires_s: float,
    ) -> ApprovalRequest:
        async with self._tx() as tx:
            expires = tx.now + expires_s
            await tx.change(
                "INSERT INTO approvals (session_id, call_id, tool, summary, status, asked_by, "
                "asked_at, expires_at, mode) VALUES (%s, %s, %s, %s, 'pending', %s, %s, %s, "
                "'park') ON CONFLICT (session_id, call_id) DO NOTHING",
                (session_id, call_id, tool, summary, holder, tx.now, expires),
            )
            # Asked before: an answer stands, a parked question keeps its expiry; a
            # question a waiting worker left behind (it died, or gave up) parks afresh.
            await tx.change(
                "UPDATE approvals SET status = 'pending', mode = 'park', asked_by = %s, "
                "asked_at = %s, expires_at = %s, answered_by = NULL, answered_at = NULL "
                "WHERE session_id = %s AND call_id = %s AND mode = 'wait' AND "
                "status IN ('pending', 'expired')",
                (holder, tx.now, expires, session_id, call_id),
            )
            found = await self._approval_of(tx, session_id, call_id)
            # The session is dormant: its wake is queued now, due at the expiry (the
            # denial); an answer makes it due at once.
            due = found.expires_at if found.status == "pending" else tx.now
            await self._approval_wake(tx, session_id, call_id, due)
            return found

    async def _approval_wake(self, tx: _Tx, session_id: str, call_id: str, due: float) -> None:
        """The session's approval wake (one per call, by its key), due at ``due`` at
        the latest; a wake that was done already is queued again."""
        key = approval_key(session_id, call_id)
        rows = await tx.rows(
            "SELECT w.id FROM idempotency_keys k JOIN wakes w ON w.id = k.wake_id "
            "WHERE k.key = %s AND w.done_at IS NULL" + self._for_update,
            (key,),
        )
        if due <= tx.now:
            await self._notify_wakes(tx)
        if rows:
            await tx.change(
                "UPDATE wakes SET due_at = %s WHERE id = %s AND due_at > %s",
                (due, int(rows[0][0]), due),
            )
            return
        made = await tx.rows(
            "INSERT INTO wakes (session_id, message, due_at) VALUES (%s, NULL, %s) RETURNING id",
            (session_id, due),
        )
        await tx.change(
            "INSERT INTO idempotency_keys (key, wake_id, created_at) VALUES (%s, %s, %s) "
            "ON CONFLICT (key) DO UPDATE SET wake_id = excluded.wake_id",
            (key, int(made[0][0]), tx.now),
        )

    async def _approval_of(self, tx: _Tx, session_id: str, call_id: str) -> ApprovalRequest:
        rows = await tx.rows(
            f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE session_id = %s AND call_id = %s",
            (session_id, call_id),
        )
        return _approval(rows[0])

    async def poll_approval(self, *, session_id: str, call_id: str) -> ApprovalRequest | None:
        async with self._tx() as tx:
            # the deadline and an answer race through conditional updates: one wins
            await tx.change(
                "UPDATE approvals SET status = 'expired', answered_at = %s WHERE "
                "session_id = %s AND call_id = %s AND status = 'pending' AND expires_at <= %s",
                (tx.now, session_id, call_id, tx.now),
            )
            rows = await tx.rows(
                f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE session_id = %s AND call_id = %s",
                (session_id, call_id),
            )
            return _approval(rows[0]) if rows else None

    async def answer_approval(
        self, *, session_id: str, call_id: str, allow: bool, by: str
    ) -> tuple[ApprovalRequest | None, bool]:
        async with self._tx() as tx:
            won = await tx.change(
                "UPDATE approvals SET status = %s, answered_by = %s, answered_at = %s "
                "WHERE session_id = %s AND call_id = %s AND status = 'pending' "
                f"AND expires_at > %s AND {_ASKER_HOLDS}",
                ("allow" if allow else "deny", by, tx.now, session_id, call_id, tx.now, tx.now),
            )
            if not won:  # past its deadline, or its worker is gone: nobody waits any more
                await tx.change(
                    "UPDATE approvals SET status = 'expired', answered_at = %s "
                    "WHERE session_id = %s AND call_id = %s AND status = 'pending'",
                    (tx.now, session_id, call_id),
                )
            rows = await tx.rows(
                f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE session_id = %s AND call_id = %s",
                (session_id, call_id),
            )
            found = _approval(rows[0]) if rows else None
            if won and found is not None and found.mode == "park":
                # the dormant session is woken, in the transaction that answers
                await self._approval_wake(tx, session_id, call_id, tx.now)
            return found, bool(won)

    async def list_approvals(
        self, *, session_id: str | None = None, status: str | None = "pending"
    ) -> list[ApprovalRequest]:
        async with self._tx() as tx:
            sql = f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE 1 = 1"
            params: list[Any] = []
            if session_id is not None:
                sql += " AND session_id = %s"
                params.append(session_id)
            if status is not None:
                sql += " AND status = %s"
                params.append(status)
            if status == "pending":  # only those a worker still waits for
                sql += f" AND expires_at > %s AND {_ASKER_HOLDS}"
                params.extend((tx.now, tx.now))
            rows = await tx.rows(sql + " ORDER BY asked_at, session_id, call_id", params)
            return [_approval(row) for row in rows]

    async def withdraw_approvals(self, *, session_id: str) -> int:
        async with self._tx() as tx:
            return await tx.change(
                "UPDATE approvals SET status = 'expired', answered_at = %s "
                "WHERE session_id = %s AND status = 'pending'",
                (tx.now, session_id),
            )

    # ----------------------------------------------------------- host tokens, deliveries

    async def add_token(
        self, *, token_hash: str, scope: str, session_id: str | None, label: str
    ) -> HostToken:
        _check_hash(token_hash)
        if scope not in ("admin", "session") or (scope == "session") != (session_id is not None):
            raise UsageError(
                f"a host token's scope is 'admin' (no session) or 'session' (with one), "
                f"not {scope!r} with session {session_id!r}",
                hint="name a session for a session token, none for an admin token",
                code="invalid_request",
            )
        async with self._tx() as tx:
            await tx.change(
                f"INSERT INTO host_tokens ({_TOKEN_COLUMNS}) VALUES (%s, %s, %s, %s, %s, NULL) "
                "ON CONFLICT (token_hash) DO NOTHING",
                (token_hash, scope, session_id, label, tx.now),
            )
            rows = await tx.rows(
                f"SELECT {_TOKEN_COLUMNS} FROM host_tokens WHERE token_hash = %s", (token_hash,)
            )
            return _host_token(rows[0])

    # ----------------------------------------------------------- sealed secrets

    async def put_secret(self, *, name: str, value: bytes) -> None:
        """Keep ``value`` (already sealed by the caller) under ``name``, replacing it."""
        text = base64.b64encode(value).decode("ascii")
        async with self._tx() as tx:
            await tx.change(
                "INSERT INTO secrets (name, value, updated_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value, "
                "updated_at = excluded.updated_at",
                (name, text, tx.now),
            )

    async def get_secret(self, *, name: str) -> bytes | None:
        async with self._tx() as tx:
            rows = await tx.rows("SELECT value FROM secrets WHERE name = %s", (name,))
        return base64.b64decode(rows[0][0]) if rows else None

    async def delete_secret(self, *, name: str) -> bool:
        async with self._tx() as tx:
            return await tx.change("DELETE FROM secrets WHERE name = %s", (name,)) > 0

    async def list_secrets(self, *, prefix: str) -> list[str]:
        async with self._tx() as tx:
            rows = await tx.rows("SELECT name FROM secrets ORDER BY name")
        return [str(row[0]) for row in rows if str(row[0]).startswith(prefix)]

    async def get_token(self, *, token_hash: str) -> HostToken | None:
        _check_hash(token_hash)
        async with self._tx() as tx:
            rows = await tx.rows(
                f"SELECT {_TOKEN_COLUMNS} FROM host_tokens WHERE token_hash = %s", (token_hash,)
            )
            return _host_token(rows[0]) if rows else None

    async def revoke_token(self, *, token_hash: str) -> bool:
        _check_hash(token_hash)
        async with self._tx() as tx:
            changed = await tx.change(
                "UPDATE host_tokens SET revoked_at = %s WHERE token_hash = %s "
                "AND revoked_at IS NULL",
                (tx.now, token_hash),
            )
            return bool(changed)

    async def list_tokens(self) -> list[HostToken]:
        async with self._tx() as tx:
            rows = await tx.rows(
                f"SELECT {_TOKEN_COLUMNS} FROM host_tokens ORDER BY created_at, token_hash"
            )
            return [_host_token(row) for row in rows]

    async def claim_delivery(self, *, hook: str, delivery: str, session_id: str) -> str:
        async with self._tx() as tx:
            # a concurrent claim of the same delivery waits on the key, then finds the row
            await tx.change(
                "INSERT INTO webhook_deliveries (hook, delivery, session_id, received_at) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (hook, delivery) DO NOTHING",
                (hook, delivery, session_id, tx.now),
            )
            rows = await tx.rows(
                "SELECT session_id FROM webhook_deliveries WHERE hook = %s AND delivery = %s",
                (hook, delivery),
            )
            return str(rows[0][0])

    # ----------------------------------------------------------- global authorities

    async def acquire_named(self, *, name: str, holder: str, ttl_s: float) -> NamedLease | None:
        async with self._tx() as tx:
            expires = tx.now + ttl_s
            if await tx.change(
                "INSERT INTO named_leases (name, holder, token, expires_at) "
                "VALUES (%s, %s, 1, %s) ON CONFLICT (name) DO NOTHING",
                (name, holder, expires),
            ):
                return NamedLease(name=name, holder=holder, token=1, expires_at=expires)
            rows = await tx.rows(
                "SELECT token, expires_at FROM named_leases WHERE name = %s" + self._for_update,
                (name,),
            )
            token, current_expiry = int(rows[0][0]), float(rows[0][1])
            if current_expiry > tx.now:
                return None
            await tx.change(
                "UPDATE named_leases SET holder = %s, token = %s, expires_at = %s WHERE name = %s",
                (holder, token + 1, expires, name),
            )
            return NamedLease(name=name, holder=holder, token=token + 1, expires_at=expires)

    async def release_named(self, *, lease: NamedLease) -> None:
        async with self._tx() as tx:
            await tx.change(
                "UPDATE named_leases SET expires_at = 0 WHERE name = %s AND token = %s",
                (lease.name, lease.token),
            )

    async def admit_token(self, *, name: str, token: int) -> None:
        async with self._tx() as tx:
            rows = await tx.rows("SELECT token FROM named_leases WHERE name = %s", (name,))
            newest = int(rows[0][0]) if rows else 0
            if token < newest or newest == 0:
                raise StaleTokenError(
                    f"a write on {name!r} carried fencing token {token}, but token {newest} "
                    "was granted since"
                    if newest
                    else f"a write on {name!r} carried token {token}, never granted",
                    hint="the writer's lease expired while it was paused or slow; take the "
                    "lease again and re-read the resource before writing",
                )

    async def _lock_name(self, tx: _Tx, name: str) -> None:
        await tx.change(
            "INSERT INTO semaphores (name) VALUES (%s) ON CONFLICT (name) DO NOTHING", (name,)
        )
        await tx.rows("SELECT name FROM semaphores WHERE name = %s" + self._for_update, (name,))

    async def acquire_permit(
        self, *, name: str, limit: int, holder: str, ttl_s: float
    ) -> str | None:
        async with self._tx() as tx:
            await self._lock_name(tx, name)
            rows = await tx.rows(
                "SELECT count(*) FROM permits WHERE name = %s AND expires_at > %s",
                (name, tx.now),
            )
            if int(rows[0][0]) >= limit:
                return None
            permit = secrets.token_hex(12)
            await tx.change(
                "INSERT INTO permits (id, name, holder, expires_at) VALUES (%s, %s, %s, %s)",
                (permit, name, holder, tx.now + ttl_s),
            )
            await tx.change(
                "DELETE FROM permits WHERE name = %s AND expires_at <= %s", (name, tx.now)
            )
            return permit

    async def release_permit(self, *, name: str, permit: str) -> None:
        async with self._tx() as tx:
            await tx.change("DELETE FROM permits WHERE id = %s AND name = %s", (permit, name))

    async def take_quota(
        self, *, name: str, per_minute: int | None = None, per_hour: int | None = None
    ) -> float:
        async with self._tx() as tx:
            key = f"quota:{name}"
            await self._lock_name(tx, key)
            await tx.change(
                "DELETE FROM quota_events WHERE name = %s AND at <= %s", (key, tx.now - 3600)
            )
            wait = 0.0
            for limit, window in ((per_minute, 60.0), (per_hour, 3600.0)):
                if limit is None:
                    continue
                rows = await tx.rows(
                    "SELECT at FROM quota_events WHERE name = %s AND at > %s ORDER BY at",
                    (key, tx.now - window),
                )
                if len(rows) >= limit:
                    # free again when the oldest request that fills the window leaves it
                    wait = max(wait, float(rows[len(rows) - limit][0]) + window - tx.now)
            if wait > 0:
                return wait
            await tx.change("INSERT INTO quota_events (name, at) VALUES (%s, %s)", (key, tx.now))
            return 0.0

    # ----------------------------------------------------------- steers (session_steers)

    async def _steers_lock(self, tx: _Tx, session_id: str) -> bool:
        """Serialize a session's steers with its lease's release; whether it is held."""
        await self._lock_name(tx, f"steers:{session_id}")
        rows = await tx.rows(
            "SELECT 1 FROM session_leases WHERE session_id = %s AND expires_at > %s",
            (session_id, tx.now),
        )
        return bool(rows)

    async def add_steer(
        self, *, session_id: str, steer_id: str, text: str, who: str | None
    ) -> bool:
        async with self._tx() as tx:
            if not await self._steers_lock(tx, session_id):
                await self._send(tx, session_id, text, None, f"steer:{steer_id}")
                return False
            await tx.change(
                "INSERT INTO session_steers (steer_id, session_id, text, who, created_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (steer_id) DO NOTHING",
                (steer_id, session_id, text, who, tx.now),
            )
            return True

    async def take_steers(self, *, session_id: str, holder: str) -> list[SteerRow]:
        async with self._tx() as tx:
            await self._steers_lock(tx, session_id)
            rows = await tx.rows(
                "SELECT steer_id, session_id, text, who, created_at FROM session_steers "
                "WHERE session_id = %s AND (taken_by IS NULL OR taken_by <> %s) "
                "ORDER BY created_at, steer_id",
                (session_id, holder),
            )
            for row in rows:
                await tx.change(
                    "UPDATE session_steers SET taken_by = %s WHERE steer_id = %s",
                    (holder, row[0]),
                )
            return [
                SteerRow(
                    steer_id=str(r[0]),
                    session_id=str(r[1]),
                    text=str(r[2]),
                    who=None if r[3] is None else str(r[3]),
                    created_at=float(r[4]),
                )
                for r in rows
            ]

    async def done_steers(self, *, session_id: str, steer_ids: Sequence[str]) -> None:
        async with self._tx() as tx:
            for steer_id in steer_ids:
                await tx.change(
                    "DELETE FROM session_steers WHERE session_id = %s AND steer_id = %s",
                    (session_id, steer_id),
                )

    async def requeue_steers(self, *, session_id: str, skip: Sequence[str] = ()) -> int:
        async with self._tx() as tx:
            if await self._steers_lock(tx, session_id):
                return 0
            rows = await tx.rows(
                "SELECT steer_id, text FROM session_steers WHERE session_id = %s "
                "ORDER BY created_at, steer_id",
                (session_id,),
            )
            sent = 0
            for steer_id, text in rows:
                if steer_id not in skip:
                    await self._send(tx, session_id, str(text), None, f"steer:{steer_id}")
                    sent += 1
            await tx.change("DELETE FROM session_steers WHERE session_id = %s", (session_id,))
            return sent

    # ----------------------------------------------------------- cancel requests

    async def request_cancel(
        self, *, session_id: str, who: str | None, reason: str, policy: str = "cancel"
    ) -> tuple[SessionCancel | None, bool]:
        async with self._tx() as tx:
            rows = await tx.rows(
                "SELECT epoch FROM session_leases WHERE session_id = %s AND expires_at > %s",
                (session_id, tx.now),
            )
            if not rows:
                return None, False  # nobody holds the session: no turn runs
            epoch = int(rows[0][0])
            created = await tx.change(
                "INSERT INTO session_cancels (session_id, epoch, who, reason, requested_at, "
                "policy) VALUES (%s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (session_id, epoch) DO NOTHING",
                (session_id, epoch, who, reason, tx.now, policy),
            )
            found = await tx.rows(
                f"SELECT {_CANCEL_COLUMNS} FROM session_cancels "
                "WHERE session_id = %s AND epoch = %s",
                (session_id, epoch),
            )
            return _cancel(found[0]), created > 0

    def _read_tx(self) -> AbstractAsyncContextManager[_Tx]:
        """A transaction that only reads (SQLite: without the file's write lock, so a
        worker looking every quarter second takes no lock from anyone)."""
        return self._tx()

    async def pending_cancel(self, *, lease: SessionLease) -> SessionCancel | None:
        async with self._read_tx() as tx:
            rows = await tx.rows(
                f"SELECT {_CANCEL_COLUMNS} FROM session_cancels WHERE session_id = %s "
                "AND epoch = %s AND status = 'pending'",
                (lease.session_id, lease.epoch),
            )
            return _cancel(rows[0]) if rows else None

    async def settle_cancel(self, *, cancel_id: int, status: str) -> None:
        async with self._tx() as tx:
            await tx.change(
                "UPDATE session_cancels SET status = %s, settled_at = %s "
                "WHERE id = %s AND status = 'pending'",
                (status, tx.now, cancel_id),
            )

    async def get_cancel(self, *, cancel_id: int) -> SessionCancel | None:
        async with self._read_tx() as tx:
            rows = await tx.rows(
                f"SELECT {_CANCEL_COLUMNS} FROM session_cancels WHERE id = %s", (cancel_id,)
            )
            return _cancel(rows[0]) if rows else None

    # ----------------------------------------------------------- the follow-up queue

    async def _queue_rows(self, tx: _Tx, session_id: str) -> list[QueuedRow]:
        rows = await tx.rows(
            f"SELECT {_QUEUE_COLUMNS} FROM session_queue WHERE session_id = %s "
            "ORDER BY position, created_at, message_id",
            (session_id,),
        )
        return [_queued(r) for r in rows]

    async def _renumber(self, tx: _Tx, order: Sequence[QueuedRow]) -> None:
        for position, row in enumerate(order):
            if row.position != position:
                await tx.change(
                    "UPDATE session_queue SET position = %s WHERE message_id = %s",
                    (position, row.message_id),
                )

    async def _plain_wake(self, tx: _Tx, session_id: str) -> bool:
        """A plain wake for the session, unless one waits unclaimed already."""
        waiting = await tx.rows(
            "SELECT 1 FROM wakes WHERE session_id = %s AND done_at IS NULL AND message IS NULL "
            "AND claimed_by IS NULL AND held = 0",
            (session_id,),
        )
        if waiting:
            return False
        await self._send(tx, session_id, None, None, None)
        return True

    async def add_queued(
        self,
        *,
        session_id: str,
        message_id: str,
        text: str,
        policy: str,
        who: str | None,
        refuse_busy: bool = False,
    ) -> tuple[QueuedRow | None, bool]:
        async with self._tx() as tx:
            await self._lock_name(tx, f"queue:{session_id}")
            held = bool(
                await tx.rows(
                    "SELECT 1 FROM session_leases WHERE session_id = %s AND expires_at > %s",
                    (session_id, tx.now),
                )
            )
            queue = await self._queue_rows(tx, session_id)
            if refuse_busy and (held or queue or await self._has_due(tx, session_id)):
                return None, held
            made = QueuedRow(
                message_id=message_id, session_id=session_id, text=text, policy=policy,
                who=who, position=len(queue), created_at=tx.now,
            )  # fmt: skip
            await tx.change(
                "INSERT INTO session_queue (message_id, session_id, text, policy, who, "
                "position, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (message_id, session_id, text, policy, who, len(queue), tx.now),
            )
            if policy in _URGENT:  # ahead of the waiting ones, behind earlier urgent ones
                at = next((i for i, r in enumerate(queue) if r.policy not in _URGENT), len(queue))
                queue.insert(at, made)
                await self._renumber(tx, queue)
                made = dataclasses.replace(made, position=at)
            if not held:
                await self._plain_wake(tx, session_id)
            return made, held

    async def _has_due(self, tx: _Tx, session_id: str) -> bool:
        rows = await tx.rows(
            "SELECT 1 FROM wakes WHERE session_id = %s AND done_at IS NULL AND due_at <= %s",
            (session_id, tx.now),
        )
        return bool(rows)

    async def list_queued(self, *, session_id: str) -> list[QueuedRow]:
        async with self._read_tx() as tx:
            return await self._queue_rows(tx, session_id)

    async def change_queued(
        self,
        *,
        session_id: str,
        message_id: str,
        action: str,
        who: str | None,
        text: str | None = None,
        position: int | None = None,
    ) -> list[QueuedRow] | None:
        async with self._tx() as tx:
            await self._lock_name(tx, f"queue:{session_id}")
            queue = await self._queue_rows(tx, session_id)
            found = next((r for r in queue if r.message_id == message_id), None)
            if found is None or found.taken_by is not None:
                return None
            if action == "retract":
                await tx.change("DELETE FROM session_queue WHERE message_id = %s", (message_id,))
                queue.remove(found)
                await self._renumber(tx, queue)
                return await self._queue_rows(tx, session_id)
            await tx.change(
                "UPDATE session_queue SET changed_by = %s, changed_at = %s"
                + (", text = %s" if action == "edit" else "")
                + " WHERE message_id = %s",
                (who, tx.now, *((text,) if action == "edit" else ()), message_id),
            )
            if action == "move" and position is not None:
                queue.remove(found)
                queue.insert(max(0, min(position, len(queue))), found)
                await self._renumber(tx, queue)
            return await self._queue_rows(tx, session_id)

    async def take_queued(
        self, *, session_id: str, holder: str, urgent_only: bool = False
    ) -> QueuedRow | None:
        async with self._read_tx() as tx:  # a worker looks often: most looks find nothing
            if not await tx.rows(
                "SELECT 1 FROM session_queue WHERE session_id = %s", (session_id,)
            ):
                return None
        async with self._tx() as tx:
            await self._lock_name(tx, f"queue:{session_id}")
            queue = await self._queue_rows(tx, session_id)
            if not queue or (urgent_only and queue[0].policy not in _URGENT):
                return None
            await tx.change(
                "UPDATE session_queue SET taken_by = %s WHERE message_id = %s",
                (holder, queue[0].message_id),
            )
            return dataclasses.replace(queue[0], taken_by=holder)

    async def done_queued(self, *, session_id: str, message_id: str) -> None:
        async with self._tx() as tx:
            await self._lock_name(tx, f"queue:{session_id}")
            await tx.change(
                "DELETE FROM session_queue WHERE session_id = %s AND message_id = %s",
                (session_id, message_id),
            )
            await self._renumber(tx, await self._queue_rows(tx, session_id))

    async def wake_queued(self, *, session_id: str) -> bool:
        async with self._read_tx() as tx:  # after every wake: most find nothing queued
            if not await tx.rows(
                "SELECT 1 FROM session_queue WHERE session_id = %s", (session_id,)
            ):
                return False
        async with self._tx() as tx:
            await self._lock_name(tx, f"queue:{session_id}")
            if not await self._queue_rows(tx, session_id):
                return False
            if await tx.rows(
                "SELECT 1 FROM session_leases WHERE session_id = %s AND expires_at > %s",
                (session_id, tx.now),
            ):
                return False
            return await self._plain_wake(tx, session_id)

    # ----------------------------------------------------------- mode switches

    async def request_mode(
        self, *, session_id: str, mode: str, who: str | None
    ) -> ModeRequest | None:
        async with self._tx() as tx:
            rows = await tx.rows(
                "SELECT epoch FROM session_leases WHERE session_id = %s AND expires_at > %s",
                (session_id, tx.now),
            )
            if not rows:
                return None  # nobody holds the session: no worker runs a turn of it
            made = await tx.rows(
                "INSERT INTO session_modes (session_id, epoch, mode, who, requested_at) "
                f"VALUES (%s, %s, %s, %s, %s) RETURNING {_MODE_COLUMNS}",
                (session_id, int(rows[0][0]), mode, who, tx.now),
            )
            return _mode_request(made[0])

    async def pending_modes(self, *, lease: SessionLease) -> list[ModeRequest]:
        async with self._read_tx() as tx:
            rows = await tx.rows(
                f"SELECT {_MODE_COLUMNS} FROM session_modes WHERE session_id = %s "
                "AND epoch = %s AND status = 'pending' ORDER BY id",
                (lease.session_id, lease.epoch),
            )
            return [_mode_request(r) for r in rows]

    async def settle_mode(
        self, *, request_id: int, status: str, previous: str | None = None
    ) -> None:
        async with self._tx() as tx:
            await tx.change(
                "UPDATE session_modes SET status = %s, previous = %s, settled_at = %s "
                "WHERE id = %s AND status = 'pending'",
                (status, previous, tx.now, request_id),
            )

    async def get_mode_request(self, *, request_id: int) -> ModeRequest | None:
        async with self._read_tx() as tx:
            rows = await tx.rows(
                f"SELECT {_MODE_COLUMNS} FROM session_modes WHERE id = %s", (request_id,)
            )
            return _mode_request(rows[0]) if rows else None


_MODE_COLUMNS = "id, session_id, epoch, mode, who, status, previous"


def _mode_request(row: tuple[Any, ...]) -> ModeRequest:
    return ModeRequest(
        id=int(row[0]),
        session_id=str(row[1]),
        epoch=int(row[2]),
        mode=str(row[3]),
        who=None if row[4] is None else str(row[4]),
        status=str(row[5]),
        previous=None if row[6] is None else str(row[6]),
    )


_URGENT = ("interrupt", "rollback")
_QUEUE_COLUMNS = (
    "message_id, session_id, text, policy, who, position, created_at, changed_by, taken_by"
)


def _queued(row: tuple[Any, ...]) -> QueuedRow:
    return QueuedRow(
        message_id=str(row[0]),
        session_id=str(row[1]),
        text=str(row[2]),
        policy=str(row[3]),
        who=None if row[4] is None else str(row[4]),
        position=int(row[5]),
        created_at=float(row[6]),
        changed_by=None if row[7] is None else str(row[7]),
        taken_by=None if row[8] is None else str(row[8]),
    )


_CANCEL_COLUMNS = "id, session_id, epoch, who, reason, status, requested_at, policy"


def _cancel(row: tuple[Any, ...]) -> SessionCancel:
    return SessionCancel(
        id=int(row[0]),
        session_id=str(row[1]),
        epoch=int(row[2]),
        who=None if row[3] is None else str(row[3]),
        reason=str(row[4]),
        status=str(row[5]),
        requested_at=float(row[6]),
        policy=str(row[7]),
    )


def lease_lost(lease: SessionLease) -> LeaseLostError:
    """The commit guard's refusal of ``lease``."""
    return LeaseLostError(
        f"the lease of {lease.holder!r} on session {lease.session_id!r} (epoch "
        f"{lease.epoch}) is no longer current",
        hint="it expired or another worker took the session; nothing more is committed "
        "under it, and the session's new holder recovers it",
        session_id=lease.session_id,
    )

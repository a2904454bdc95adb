"""What the host keeps beside the logs: a small, strongly consistent index.

The logs are the truth about what happened in a session; the host also needs a few
things a log cannot hold (or holds only after the fact):

- **messages**: what clients asked to run, keyed per session by the client's idempotency
  key, so a retried send (or a replayed webhook delivery) wakes nothing;
- **approvals**: the index of calls parked on an approval, answered once (first wins);
- **session bindings**: the model a hosted session was created with;
- **tokens**: bearer tokens, stored as SHA-256 hashes only, scoped to one session or admin;
- **deliveries**: webhook delivery ids that made a new session.

``HostControl`` is the narrow interface; ``SqliteHostControl`` keeps it in one SQLite file
in the state directory (WAL, ``synchronous=FULL``). Every method is async; SQLite work
runs on a thread. In distributed mode ``lodger.storage.control.shared_host_index.SharedHostControl``
keeps tokens and deliveries in the control plane instead, so several hosts share them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from lodger._core.sqlite import use_wal
from lodger.errors import HostAuthError, HostConflictError, StorageError, UsageError

__all__ = [
    "Approval",
    "ApprovalStatus",
    "HostControl",
    "Message",
    "MessageKind",
    "MessageStatus",
    "SqliteHostControl",
    "TokenGrant",
    "TokenInfo",
    "hash_token",
    "token_id",
]

T = TypeVar("T")

#: ``media``: a turn whose ``text`` is the JSON of its input text and attachments (their
#: bytes are artifacts already: ``lodger.host.hub``)
MessageKind = Literal["message", "media", "resume"]
MessageStatus = Literal["queued", "running", "done", "failed"]
ApprovalStatus = Literal["pending", "allow", "deny", "expired"]


def hash_token(token: str) -> str:
    """How a token is kept at rest: its SHA-256 (tokens are 256-bit random, so a plain
    hash is enough; nothing reversible is stored)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_id(token_hash: str) -> str:
    """A token's public name: ``tok_`` and the first 16 hex digits of its SHA-256. It names
    the token in listings and revocations without revealing it (a 64-bit prefix of the
    hash of 256 random bits gives nothing back)."""
    return "tok_" + token_hash[:16]


def token_revoked(where: str = "") -> HostAuthError:
    """Adding a token that was revoked: refused, never revived."""
    return HostAuthError(
        f"this token was revoked; it is not accepted{where} any more",
        hint="make a new token (unset $LODGER_HOST_TOKEN to have one printed)",
        code="token_revoked",
    )


@dataclass(frozen=True, kw_only=True)
class Message:
    """One thing a client asked a session to do: run a turn of ``text`` or resume."""

    id: int
    session_id: str
    key: str
    kind: MessageKind
    text: str
    status: MessageStatus
    #: the session's high-water mark when the message started running
    start_offset: int | None = None
    result: dict[str, Any] | None = None
    created_us: int = 0
    #: the model settings the turn asks with (``ModelSettings.record()``), or None
    settings: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "session_id": self.session_id,
            "idempotency_key": self.key,
            "kind": self.kind,
            "status": self.status,
            "start_offset": self.start_offset,
            "result": self.result,
        }


@dataclass(frozen=True, kw_only=True)
class Approval:
    session_id: str
    call_id: str
    tool: str
    summary: str
    status: ApprovalStatus
    answered_by: str | None = None
    created_us: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "call_id": self.call_id,
            "tool": self.tool,
            "summary": self.summary,
            "status": self.status,
            "answered_by": self.answered_by,
        }


@dataclass(frozen=True, kw_only=True)
class TokenGrant:
    """What a token allows: everything (``admin``) or one session."""

    scope: Literal["admin", "session"]
    session_id: str | None
    label: str

    def allows(self, session_id: str | None) -> bool:
        return self.scope == "admin" or (session_id is not None and session_id == self.session_id)


@dataclass(frozen=True, kw_only=True)
class TokenInfo:
    """A recorded token as an admin may list it: its public ``id`` (``token_id``), never
    the token. ``created_at`` is known only where the index records it (the shared one)."""

    token_hash: str
    scope: Literal["admin", "session"]
    session_id: str | None
    label: str
    revoked: bool
    created_at: float | None = None

    @property
    def id(self) -> str:
        return token_id(self.token_hash)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "scope": self.scope,
            "session_id": self.session_id,
            "label": self.label,
            "revoked": self.revoked,
            "created_at": self.created_at,
        }


class HostControl(Protocol):
    """The host's control index (see the module docstring)."""

    async def close(self) -> None: ...

    # sessions
    async def bind_session(self, session_id: str, *, model: str, created_us: int) -> bool: ...
    async def session_model(self, session_id: str) -> str | None: ...
    async def bound_sessions(self) -> list[str]: ...

    # messages
    async def submit(
        self,
        session_id: str,
        *,
        key: str,
        kind: MessageKind,
        text: str,
        created_us: int,
        settings: dict[str, Any] | None = None,
        urgent: bool = False,
    ) -> tuple[Message, bool]: ...
    async def next_message(self, session_id: str) -> Message | None: ...
    async def start_message(self, message_id: int, *, start_offset: int) -> None: ...
    async def finish_message(
        self, message_id: int, *, status: MessageStatus, result: dict[str, Any]
    ) -> None: ...
    async def requeue(self, message_id: int, *, kind: MessageKind) -> None: ...
    async def message(self, session_id: str, message_id: int) -> Message | None: ...
    async def messages(
        self, *, session_id: str | None = None, status: MessageStatus | None = None
    ) -> list[Message]: ...

    # approvals
    async def park(
        self, session_id: str, call_id: str, *, tool: str, summary: str, created_us: int
    ) -> None: ...
    async def answer(self, session_id: str, call_id: str, *, allow: bool, by: str) -> Approval: ...
    async def approvals(
        self, *, session_id: str | None = None, status: ApprovalStatus | None = "pending"
    ) -> list[Approval]: ...
    async def expire_pending(self) -> int: ...

    # tokens
    async def add_token(
        self, token: str, *, scope: Literal["admin", "session"], session_id: str | None, label: str
    ) -> None: ...
    async def grant(self, token: str) -> TokenGrant | None: ...
    async def revoke(self, token: str) -> bool:
        """Revoke ``token`` for good; True when this call revoked it."""
        ...

    async def revoke_hash(self, token_hash: str) -> bool:
        """Revoke the token whose SHA-256 is ``token_hash``; True when this call did."""
        ...

    async def tokens(self) -> list[TokenInfo]:
        """Every recorded token, revoked ones included (by hash: never the token)."""
        ...

    # webhook deliveries that start a new session
    async def delivery_session(self, hook: str, delivery: str, *, new_session: str) -> str: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS bindings (
    session_id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    created_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    key TEXT NOT NULL,
    kind TEXT NOT NULL,
    text TEXT NOT NULL,
    text_sha256 TEXT NOT NULL,
    status TEXT NOT NULL,
    start_offset INTEGER,
    result TEXT,
    created_us INTEGER NOT NULL,
    settings TEXT,
    urgent INTEGER NOT NULL DEFAULT 0,
    UNIQUE (session_id, key)
);
CREATE INDEX IF NOT EXISTS messages_by_status ON messages (status, session_id, id);
CREATE TABLE IF NOT EXISTS approvals (
    session_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    summary TEXT NOT NULL,
    status TEXT NOT NULL,
    answered_by TEXT,
    created_us INTEGER NOT NULL,
    PRIMARY KEY (session_id, call_id)
);
CREATE TABLE IF NOT EXISTS tokens (
    hash TEXT PRIMARY KEY,
    scope TEXT NOT NULL,
    session_id TEXT,
    label TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS revoked_tokens (
    hash TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS deliveries (
    hook TEXT NOT NULL,
    delivery TEXT NOT NULL,
    session_id TEXT NOT NULL,
    PRIMARY KEY (hook, delivery)
);
"""


class SqliteHostControl:
    """``HostControl`` in one SQLite file (``<state>/host.sqlite3`` by default)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=30
            )
            use_wal(self._db)
            self._db.executescript(_SCHEMA)
            _add_settings_column(self._db)
        except (OSError, sqlite3.Error) as exc:
            raise StorageError(
                f"cannot open the host index {str(self.path)!r}: {exc}",
                hint="check that the state directory is writable",
                code="storage_open",
            ) from exc
        self._lock = threading.Lock()
        self._closed = False

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def work() -> T:
            with self._lock:
                if self._closed:
                    raise StorageError("the host index is closed", code="store_closed")
                try:
                    return fn(self._db)
                except sqlite3.Error as exc:
                    raise StorageError(
                        f"host index {str(self.path)!r} failed: {exc}", code="storage"
                    ) from exc

        return await asyncio.to_thread(work)

    async def close(self) -> None:
        def work() -> None:
            with self._lock:
                if not self._closed:
                    self._closed = True
                    self._db.close()

        await asyncio.to_thread(work)

    # ------------------------------------------------------------ sessions

    async def bind_session(self, session_id: str, *, model: str, created_us: int) -> bool:
        """Record a hosted session's model; False when the session was bound already."""

        def work(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                "INSERT OR IGNORE INTO bindings VALUES (?, ?, ?)", (session_id, model, created_us)
            )
            return cur.rowcount == 1

        return await self._run(work)

    async def session_model(self, session_id: str) -> str | None:
        def work(db: sqlite3.Connection) -> str | None:
            row = db.execute(
                "SELECT model FROM bindings WHERE session_id = ?", (session_id,)
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._run(work)

    async def bound_sessions(self) -> list[str]:
        def work(db: sqlite3.Connection) -> list[str]:
            return [str(r[0]) for r in db.execute("SELECT session_id FROM bindings")]

        return await self._run(work)

    # ------------------------------------------------------------ messages

    async def submit(
        self,
        session_id: str,
        *,
        key: str,
        kind: MessageKind,
        text: str,
        created_us: int,
        settings: dict[str, Any] | None = None,
        urgent: bool = False,
    ) -> tuple[Message, bool]:
        """Queue a message once per ``(session, key)``: ``(message, created)``. The same key
        with another text (or other settings) is a conflict (the key names one request,
        not a slot). An ``urgent`` message (sent with policy interrupt or rollback) runs
        before the session's other queued messages (``next_message``)."""
        stored = None if settings is None else json.dumps(settings, sort_keys=True)
        asked = f"{kind}\n{text}" if stored is None else f"{kind}\n{text}\n{stored}"
        digest = hashlib.sha256(asked.encode()).hexdigest()

        def work(db: sqlite3.Connection) -> tuple[Message, bool]:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT id, text_sha256 FROM messages WHERE session_id = ? AND key = ?",
                    (session_id, key),
                ).fetchone()
                if row is not None:
                    db.execute("COMMIT")
                    if row[1] != digest:
                        raise HostConflictError(
                            f"idempotency key {key!r} of session {session_id!r} was used "
                            "for another request",
                            hint="use a new key for a new message",
                            code="idempotency_conflict",
                            session_id=session_id,
                        )
                    found = _message_by_id(db, int(row[0]))
                    assert found is not None
                    return found, False
                cur = db.execute(
                    "INSERT INTO messages (session_id, key, kind, text, text_sha256, status, "
                    "created_us, settings, urgent) VALUES (?, ?, ?, ?, ?, 'queued', ?, ?, ?)",
                    (session_id, key, kind, text, digest, created_us, stored, int(urgent)),
                )
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            made = _message_by_id(db, int(cur.lastrowid or 0))
            assert made is not None
            return made, True

        return await self._run(work)

    async def next_message(self, session_id: str) -> Message | None:
        def work(db: sqlite3.Connection) -> Message | None:
            row = db.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND "
                "status = 'queued' ORDER BY urgent DESC, id LIMIT 1",
                (session_id,),
            ).fetchone()
            return None if row is None else _message(row)

        return await self._run(work)

    async def start_message(self, message_id: int, *, start_offset: int) -> None:
        await self._run(
            lambda db: db.execute(
                "UPDATE messages SET status = 'running', start_offset = ? WHERE id = ?",
                (start_offset, message_id),
            )
        )

    async def finish_message(
        self, message_id: int, *, status: MessageStatus, result: dict[str, Any]
    ) -> None:
        text = json.dumps(result, ensure_ascii=False, sort_keys=True)
        await self._run(
            lambda db: db.execute(
                "UPDATE messages SET status = ?, result = ? WHERE id = ?",
                (status, text, message_id),
            )
        )

    async def requeue(self, message_id: int, *, kind: MessageKind) -> None:
        await self._run(
            lambda db: db.execute(
                "UPDATE messages SET status = 'queued', kind = ? WHERE id = ?", (kind, message_id)
            )
        )

    async def message(self, session_id: str, message_id: int) -> Message | None:
        def work(db: sqlite3.Connection) -> Message | None:
            found = _message_by_id(db, message_id)
            return found if found is not None and found.session_id == session_id else None

        return await self._run(work)

    async def messages(
        self, *, session_id: str | None = None, status: MessageStatus | None = None
    ) -> list[Message]:
        where, args = _filters(session_id=session_id, status=status)
        return await self._run(
            lambda db: [
                _message(r)
                for r in db.execute(
                    f"SELECT {_MESSAGE_COLUMNS} FROM messages{where} ORDER BY id", args
                )
            ]
        )

    # ------------------------------------------------------------ approvals

    async def park(
        self, session_id: str, call_id: str, *, tool: str, summary: str, created_us: int
    ) -> None:
        await self._run(
            lambda db: db.execute(
                "INSERT INTO approvals VALUES (?, ?, ?, ?, 'pending', NULL, ?) "
                "ON CONFLICT (session_id, call_id) DO UPDATE SET status = 'pending', "
                "answered_by = NULL, created_us = excluded.created_us",
                (session_id, call_id, tool, summary, created_us),
            )
        )

    async def answer(self, session_id: str, call_id: str, *, allow: bool, by: str) -> Approval:
        """Decide a pending approval; exactly one answer wins, a later one is a conflict."""

        def work(db: sqlite3.Connection) -> Approval:
            cur = db.execute(
                "UPDATE approvals SET status = ?, answered_by = ? WHERE session_id = ? AND "
                "call_id = ? AND status = 'pending'",
                ("allow" if allow else "deny", by, session_id, call_id),
            )
            found = _approval_of(db, session_id, call_id)
            if found is None:
                raise no_such_approval(session_id, call_id)
            if cur.rowcount != 1:
                raise answered_already(session_id, call_id, found.status)
            return found

        return await self._run(work)

    async def approvals(
        self, *, session_id: str | None = None, status: ApprovalStatus | None = "pending"
    ) -> list[Approval]:
        where, args = _filters(session_id=session_id, status=status)
        return await self._run(
            lambda db: [
                _approval(r)
                for r in db.execute(
                    f"SELECT {_APPROVAL_COLUMNS} FROM approvals{where} ORDER BY created_us", args
                )
            ]
        )

    async def expire_pending(self) -> int:
        """Mark every pending approval expired (no process waits on it any more)."""
        return await self._run(
            lambda db: (
                db.execute(
                    "UPDATE approvals SET status = 'expired' WHERE status = 'pending'"
                ).rowcount
            )
        )

    # ------------------------------------------------------------ tokens

    async def add_token(
        self, token: str, *, scope: Literal["admin", "session"], session_id: str | None, label: str
    ) -> None:
        """Record ``token`` (its hash); a revoked token is refused, never revived."""
        digest = hash_token(token)

        def work(db: sqlite3.Connection) -> bool:
            if db.execute("SELECT 1 FROM revoked_tokens WHERE hash = ?", (digest,)).fetchone():
                return False
            db.execute(
                "INSERT OR IGNORE INTO tokens VALUES (?, ?, ?, ?)",
                (digest, scope, session_id, label),
            )
            return True

        if not await self._run(work):
            raise token_revoked()

    async def grant(self, token: str) -> TokenGrant | None:
        def work(db: sqlite3.Connection) -> TokenGrant | None:
            row = db.execute(
                "SELECT scope, session_id, label FROM tokens WHERE hash = ? AND hash NOT IN "
                "(SELECT hash FROM revoked_tokens)",
                (hash_token(token),),
            ).fetchone()
            if row is None:
                return None
            return TokenGrant(scope=row[0], session_id=row[1], label=row[2])

        return await self._run(work)

    async def revoke(self, token: str) -> bool:
        return await self.revoke_hash(hash_token(token))

    async def revoke_hash(self, token_hash: str) -> bool:
        def work(db: sqlite3.Connection) -> bool:
            if not db.execute("SELECT 1 FROM tokens WHERE hash = ?", (token_hash,)).fetchone():
                return False
            revoked = db.execute("INSERT OR IGNORE INTO revoked_tokens VALUES (?)", (token_hash,))
            return revoked.rowcount == 1

        return await self._run(work)

    async def tokens(self) -> list[TokenInfo]:
        def work(db: sqlite3.Connection) -> list[TokenInfo]:
            rows = db.execute(
                "SELECT hash, scope, session_id, label, "
                "hash IN (SELECT hash FROM revoked_tokens) FROM tokens ORDER BY rowid"
            ).fetchall()
            return [
                TokenInfo(
                    token_hash=row[0],
                    scope=row[1],
                    session_id=row[2],
                    label=row[3],
                    revoked=bool(row[4]),
                )
                for row in rows
            ]

        return await self._run(work)

    # ------------------------------------------------------------ deliveries

    async def delivery_session(self, hook: str, delivery: str, *, new_session: str) -> str:
        """The session a delivery of a per-event hook goes to: ``new_session`` the first
        time, the same session on every replay."""

        def work(db: sqlite3.Connection) -> str:
            db.execute(
                "INSERT OR IGNORE INTO deliveries VALUES (?, ?, ?)", (hook, delivery, new_session)
            )
            row = db.execute(
                "SELECT session_id FROM deliveries WHERE hook = ? AND delivery = ?",
                (hook, delivery),
            ).fetchone()
            return str(row[0])

        return await self._run(work)


_MESSAGE_COLUMNS = (
    "id, session_id, key, kind, text, status, start_offset, result, created_us, settings"
)


def _add_settings_column(db: sqlite3.Connection) -> None:
    """An index made before messages carried settings (or urgency) gains the column."""
    columns = {str(row[1]) for row in db.execute("PRAGMA table_info(messages)")}
    if "settings" not in columns:
        db.execute("ALTER TABLE messages ADD COLUMN settings TEXT")
    if "urgent" not in columns:
        db.execute("ALTER TABLE messages ADD COLUMN urgent INTEGER NOT NULL DEFAULT 0")


_APPROVAL_COLUMNS = "session_id, call_id, tool, summary, status, answered_by, created_us"


def _filters(**values: str | None) -> tuple[str, tuple[str, ...]]:
    parts = [(f"{name} = ?", v) for name, v in values.items() if v is not None]
    if not parts:
        return "", ()
    return " WHERE " + " AND ".join(p for p, _ in parts), tuple(v for _, v in parts)


def _message(row: tuple[Any, ...]) -> Message:
    return Message(
        id=int(row[0]),
        session_id=row[1],
        key=row[2],
        kind=row[3],
        text=row[4],
        status=row[5],
        start_offset=row[6],
        result=None if row[7] is None else json.loads(row[7]),
        created_us=int(row[8]),
        settings=None if row[9] is None else json.loads(row[9]),
    )


def _message_by_id(db: sqlite3.Connection, message_id: int) -> Message | None:
    row = db.execute(
        f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)
    ).fetchone()
    return None if row is None else _message(row)


def _approval(row: tuple[Any, ...]) -> Approval:
    return Approval(
        session_id=row[0],
        call_id=row[1],
        tool=row[2],
        summary=row[3],
        status=row[4],
        answered_by=row[5],
        created_us=int(row[6]),
    )


def _approval_of(db: sqlite3.Connection, session_id: str, call_id: str) -> Approval | None:
    row = db.execute(
        f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE session_id = ? AND call_id = ?",
        (session_id, call_id),
    ).fetchone()
    return None if row is None else _approval(row)


def no_such_approval(session_id: str, call_id: str) -> UsageError:
    return UsageError(
        f"session {session_id!r} has no approval for call {call_id!r}",
        hint="list the session's pending approvals",
        code="no_such_call",
        session_id=session_id,
        call_id=call_id,
    )


def answered_already(session_id: str, call_id: str, status: str) -> HostConflictError:
    """A second answer to one approval: the first won (or nobody waits for it any more)."""
    return HostConflictError(
        f"the approval of call {call_id!r} is already {status}",
        hint="someone answered it first (or whoever asked stopped waiting); the stream "
        "shows the decision",
        code="already_answered",
        session_id=session_id,
        call_id=call_id,
    )

"""``EventLog``: the event semantics of DESIGN section 3 on top of any ``LogStore``.

Each session's chain is plain (sha256) or keyed (HMAC-SHA256 under a ``LogKey``), fixed
by its first event: a log with a key starts keyed sessions, and reads every session with
the chain its ``session_started`` declares (DESIGN L10).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
from collections.abc import Sequence

from pydantic import ValidationError

from lodger._core.bulk import cycle_collector_paused
from lodger.errors import (
    AppendConflictError,
    CorruptLogError,
    LogKeyError,
    NextStep,
    SessionNotFoundError,
    UsageError,
)
from lodger.events import (
    DIGEST_DOMAIN,
    EMPTY_PREFIX,
    SCHEMA_VERSION,
    ChainKind,
    Event,
    EventDraft,
    Prefix,
    SessionStarted,
    claimed_chain,
    decode_event,
    keyed_chain_digest,
    new_prefix,
    seal,
)
from lodger.storage.checkpoints import CheckpointStore, NoCheckpoints
from lodger.storage.logkey import KEY_ENVVAR, KEY_FILE_ENVVAR, LogKey
from lodger.storage.logstore import LogStore, Record, WriterLease, check_session_id

__all__ = ["EMPTY_PREFIX", "EventLog", "SessionChain", "SessionWriter", "VerifiedRecords"]

_DOMAIN_STATE = hashlib.sha256(DIGEST_DOMAIN)
_DECODE_ON_LOOP = 1_000  # about 10 ms of decoding; longer reads go to a worker thread


def _order_error(session_id: str, offset: int, found: int) -> CorruptLogError:
    code = "duplicate_offset" if found < offset else "gap"
    why = (
        f"offset {found} appears again"
        if found < offset
        else f"the event is missing although offset {found} is stored"
    )
    return CorruptLogError(
        f"log for session {session_id!r} is invalid at offset {offset}: {why}",
        hint=f"events were deleted or duplicated outside lodger; restore from a backup or fork "
        f"the session from offset {offset}",
        code=code,
        session_id=session_id,
        offset=offset,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class SessionChain:
    """How a session's digests are chained: ``sha256`` (plain) or ``hmac-sha256`` under
    the key named by ``key_id``. ``mac`` is the configured key's HMAC state, set only
    when that key is the session's."""

    kind: ChainKind
    key_id: str | None = None
    mac: hmac.HMAC | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def keyed(self) -> bool:
        return self.kind == "hmac-sha256"


_PLAIN = SessionChain("sha256")
_SET_KEY = f"set ${KEY_ENVVAR} (or ${KEY_FILE_ENVVAR})"


def decode_records(
    session_id: str,
    records: Sequence[Record],
    *,
    start: int,
    prev_digest: str,
    mac: hmac.HMAC | None = None,
) -> list[Event]:
    """Decode contiguous records beginning at ``start``, checking order and the chain
    (keyed with ``mac`` when given).

    The chain is checked over the bytes first (``_check_chain``, the hash state of the
    domain tag copied per record), then the events are decoded without hashing again:
    100k events 0.80-0.85 s -> 0.73 s. A log that fails the chain check is decoded event
    by event instead, so the error is the one the first bad record always gave (a record
    that does not decode before a broken digest is named first, with its offset)."""
    events: list[Event] = []
    with cycle_collector_paused(len(records)):
        try:
            _check_chain(session_id, records, start=start, prev_digest=prev_digest, mac=mac)
        except (CorruptLogError, ValueError) as damaged:
            _decode_into(events, session_id, records, start, prev_digest, mac)
            raise damaged from None  # unreachable: the decoder rejects what the check did
        return _decode_chained(session_id, records, start=start, prev_digest=prev_digest, mac=mac)


def _decode_into(
    events: list[Event],
    session_id: str,
    records: Sequence[Record],
    expected: int,
    prev: str,
    mac: hmac.HMAC | None,
) -> None:
    for record in records:
        if record.offset != expected:
            raise _order_error(session_id, expected, record.offset)
        events.append(
            decode_event(
                record.data,
                session_id=session_id,
                offset=record.offset,
                digest=record.digest,
                prev_digest=prev,
                mac=mac,
            )
        )
        prev = record.digest
        expected += 1


class _Joined(Sequence[Event]):
    """Known events followed by newly read ones, indexable without copying either."""

    def __init__(self, known: Sequence[Event], tail: Sequence[Event]) -> None:
        self._known, self._tail = known, tail

    def __len__(self) -> int:
        return len(self._known) + len(self._tail)

    def __getitem__(self, index: int) -> Event:  # type: ignore[override]
        if index < 0:
            index += len(self)
        n = len(self._known)
        return self._known[index] if index < n else self._tail[index - n]


def _check_chain(
    session_id: str,
    records: Sequence[Record],
    *,
    start: int,
    prev_digest: str,
    mac: hmac.HMAC | None,
) -> None:
    """Check order and the chain over the stored bytes, decoding nothing: the digest covers
    exactly these bytes, so this is the whole integrity check of a full read. A record
    that breaks the chain is handed to the decoder, which names what is wrong."""
    expected = start
    prev = prev_digest
    # ``chain_digest`` with the domain tag hashed once: a copy of that state per record
    # (a fifth of the chain's cost over 100k records)
    domain, fromhex = _DOMAIN_STATE, bytes.fromhex
    for record in records:
        if record.offset != expected:
            raise _order_error(session_id, expected, record.offset)
        data = record.data
        if mac is None:
            h = domain.copy()
            h.update(fromhex(prev))
            h.update(data)
            computed = h.hexdigest()
        else:
            computed = keyed_chain_digest(mac, prev, data)
        if computed != record.digest:
            decode_event(
                data,
                session_id=session_id,
                offset=expected,
                digest=record.digest,
                prev_digest=prev,
                mac=mac,
            )
            raise AssertionError("unreachable: the decoder rejects a digest that differs")
        prev = record.digest
        expected += 1


def _decode_chained(
    session_id: str,
    records: Sequence[Record],
    *,
    start: int,
    prev_digest: str,
    mac: hmac.HMAC | None,
) -> list[Event]:
    """Decode contiguous records whose order and chain a verified read already checked
    over their bytes (``_check_chain``): the digests are not computed again. A record
    that does not decode, or decodes to another place, goes to ``decode_event`` (which
    checks its digest again and names what is wrong, with its offset)."""
    events: list[Event] = []
    validate = Event.model_validate_json
    offset, prev = start, prev_digest
    with cycle_collector_paused(len(records)):
        for record in records:
            data, digest = record.data, record.digest
            try:
                event = validate(b'%s,"digest":"%s"}' % (data[:-1], digest.encode()))
            except ValidationError:
                event = None
            if (
                event is None
                or not data.endswith(b"}")
                or event.v > SCHEMA_VERSION
                or event.offset != offset
                or event.session_id != session_id
            ):
                decode_event(
                    data,
                    session_id=session_id,
                    offset=offset,
                    digest=digest,
                    prev_digest=prev,
                    mac=mac,
                )
                raise AssertionError("unreachable: the decoder rejects this record too")
            events.append(event)
            prev = digest
            offset += 1
    return events


def _decode_each(session_id: str, records: Sequence[Record], mac: hmac.HMAC | None) -> None:
    """Decode every record of a full read, keeping none of the events (verify only)."""
    chunk = 4_096  # a few MB of events alive at a time
    for begin in range(0, len(records), chunk):
        prev = records[begin - 1].digest if begin else ""
        decode_records(
            session_id, records[begin : begin + chunk], start=begin, prev_digest=prev, mac=mac
        )


def _check_all_chained(session_id: str, records: Sequence[Record], mac: hmac.HMAC | None) -> None:
    with cycle_collector_paused(len(records)):
        _check_chain(session_id, records, start=0, prev_digest="", mac=mac)


@dataclasses.dataclass(frozen=True, slots=True)
class VerifiedRecords:
    """Every stored record of a session, verified as a full read verifies it (order, the
    chain over every byte, the stored head, the chain's declaration at offset 0), with
    decoding left to the reader: ``decode`` pays it only for the events looked at, and
    does not hash their bytes again (made by ``EventLog.read_verified``, which checked
    them; a value built by hand from unchecked records is not verified).

    >>> verified = await log.read_verified("s1")
    >>> last_ten = verified.decode(len(verified) - 10)
    """

    session_id: str
    records: Sequence[Record]
    chain: SessionChain

    def __len__(self) -> int:
        return len(self.records)

    def decode(self, start: int = 0, end: int | None = None) -> list[Event]:
        """The events ``[start, end)``, fully decoded (an unknown kind or field fails)."""
        stop = len(self.records) if end is None else min(end, len(self.records))
        if not 0 <= start <= stop:
            raise UsageError(f"invalid range [{start}, {end})", code="invalid_range")
        prev = self.records[start - 1].digest if start else ""
        # the read checked the chain over these very bytes: no digest is computed again
        return _decode_chained(
            self.session_id,
            self.records[start:stop],
            start=start,
            prev_digest=prev,
            mac=self.chain.mac,
        )


def _check_stored_head(
    session_id: str, events: Sequence[Event] | Sequence[Record], head: tuple[int, str]
) -> None:
    """A full read must contain the head recorded with the last append (DESIGN L8): the
    chain alone cannot show that the newest events were lost or rolled back. It may hold
    more: a process killed between a commit and recording its head leaves the head one
    append behind, and a reader may see appends committed after it read the head."""
    high_water, digest = head
    if len(events) >= high_water and (high_water == 0 or events[high_water - 1].digest == digest):
        return
    if len(events) < high_water:
        offset = len(events)
        found = f"the stored events end at offset {offset}"
    else:
        offset = high_water - 1
        found = f"the event at offset {offset} has another digest"
    raise CorruptLogError(
        f"log for session {session_id!r} is invalid at offset {offset}: the last append "
        f"recorded {high_water} events (offsets 0 to {high_water - 1}) ending in digest "
        f"{digest[:16]}, but {found}",
        hint="the newest events were lost or rolled back outside lodger (a damaged, "
        "truncated or deleted WAL, or a restored backup); nothing may resume on this log: "
        "restore it from a backup or fork the session from an offset that verifies",
        code="truncated",
        session_id=session_id,
        offset=offset,
    )


class EventLog:
    """The log of every session in one store.

    >>> log = EventLog(MemoryLogStore())
    >>> writer = await log.open_writer("s1")
    >>> await writer.append([draft], expected_offset=0)

    With ``key``, new sessions get a keyed chain (their first event must be
    ``session_started``, which records the chain and the key id), keyed sessions are
    checked with it and plain sessions still read: ``chain()`` tells which. With
    ``require_key``, a plain session fails to read (``LogKeyError``, ``unkeyed_chain``),
    which is how a log rewritten as plain by someone without the key is refused.
    A keyed session read without its key fails closed (``key_required``, ``wrong_key``).
    """

    def __init__(
        self,
        store: LogStore,
        *,
        key: LogKey | None = None,
        require_key: bool = False,
        checkpoints: CheckpointStore | None = None,
    ) -> None:
        if require_key and key is None:
            raise UsageError(
                "an event log that requires keyed chains needs a key",
                hint=f"{_SET_KEY}, or pass key=LogKey(...)",
                code="key_required",
            )
        self.store = store
        #: fold checkpoints (a cache, never an authority): ``checkpoints``, else the
        #: store's own (a state directory keeps files), else none
        found = getattr(store, "checkpoints", None)
        self.checkpoints: CheckpointStore = checkpoints or (
            found if isinstance(found, CheckpointStore) else NoCheckpoints()
        )
        self.key = key
        self.require_key = require_key
        # offset 0 never changes: once verified, a session's chain is known for good
        self._chains: dict[str, SessionChain] = {}

    def _chain_of(self, session_id: str, first: Record) -> SessionChain:
        """The chain the session's first record declares, checked against the key."""
        kind, key_id = claimed_chain(first.data)
        if kind == "sha256":
            if self.require_key:
                raise LogKeyError(
                    f"log for session {session_id!r} is not keyed (its chain is plain "
                    "sha256), and a keyed chain is required",
                    hint="it was written without a log key, or rewritten as plain by "
                    "someone without it; compare it with a trusted copy, and read it "
                    "without requiring a key only if it predates the key",
                    code="unkeyed_chain",
                    session_id=session_id,
                    configured_key_id=self.key.key_id if self.key else None,
                )
            return _PLAIN
        if self.key is None:
            raise LogKeyError(
                f"log for session {session_id!r} is keyed (hmac-sha256, key {key_id}) and "
                "no log key is configured",
                hint=f"{_SET_KEY} to the key this session was written with",
                code="key_required",
                session_id=session_id,
                expected_key_id=key_id,
            )
        if key_id != self.key.key_id:
            raise LogKeyError(
                f"log for session {session_id!r} is keyed with key {key_id}, and the "
                f"configured log key is {self.key.key_id}",
                hint=f"{_SET_KEY} to the key this session was written with",
                code="wrong_key",
                session_id=session_id,
                expected_key_id=key_id,
                configured_key_id=self.key.key_id,
            )
        return SessionChain("hmac-sha256", key_id, self.key.mac)

    async def _known_chain(self, session_id: str) -> SessionChain:
        """The chain of a session, verifying its first event when not yet known."""
        chain = self._chains.get(session_id)
        if chain is not None:
            return chain
        first = await self.store.read_records(session_id=session_id, start=0, end=1)
        if not first:
            return _PLAIN  # nothing at offset 0: an empty session, or a gap found later
        if first[0].offset != 0:
            raise _order_error(session_id, 0, first[0].offset)
        chain = self._chain_of(session_id, first[0])
        decode_records(session_id, first, start=0, prev_digest="", mac=chain.mac)
        self._chains[session_id] = chain
        return chain

    async def chain(self, session_id: str) -> SessionChain:
        """How the session's digests are chained (plain for a session not started yet).

        Raises ``LogKeyError`` when the chain does not fit the configured key.
        """
        check_session_id(session_id)
        return await self._known_chain(session_id)

    async def read(self, session_id: str, *, start: int = 0, end: int | None = None) -> list[Event]:
        """Events ``[start, end)``, verified against the chain from the event before ``start``.

        A full read from 0 verifies every byte; a read from a later offset trusts the stored
        digest of the event just before it (``verify`` checks that one too).
        """
        check_session_id(session_id)
        if start < 0 or (end is not None and end < start):
            raise UsageError(f"invalid range [{start}, {end})", code="invalid_range")
        full = start == 0 and end is None
        # the head first: it is recorded after its events commit, so the events read next
        # are never fewer than it names, even while another process appends
        head = await self.store.stored_head(session_id=session_id) if full else None
        prev = ""
        fetch_from = start
        if start > 0:
            fetch_from = start - 1
        expected = head[0] if head is not None else 0
        with cycle_collector_paused(expected):  # one tuple per record stays alive
            records = await self.store.read_records(
                session_id=session_id, start=fetch_from, end=end
            )
        if start > 0 and records:
            if records[0].offset != start - 1:
                raise _order_error(session_id, start - 1, records[0].offset)
            prev = records[0].digest
            records = records[1:]
        if start == 0:
            # a full read checks the chain's declaration afresh, never from the cache
            at_zero = bool(records) and records[0].offset == 0  # else: a gap, raised below
            chain = self._chain_of(session_id, records[0]) if at_zero else _PLAIN
        else:
            chain = await self._known_chain(session_id)
        if len(records) < _DECODE_ON_LOOP:
            events = decode_records(
                session_id, records, start=start, prev_digest=prev, mac=chain.mac
            )
        else:  # a long log takes CPU seconds to verify: keep the event loop free meanwhile
            events = await asyncio.to_thread(
                decode_records, session_id, records, start=start, prev_digest=prev, mac=chain.mac
            )
        if start == 0 and events:
            self._chains[session_id] = chain
        if end is not None and len(events) < end - start:
            # a short bounded read is the end of the log only if nothing is stored after it
            missing = start + len(events)
            last = await self.store.last_record(session_id=session_id)
            if last is not None and last.offset >= missing:
                # appended since the read (a turn running meanwhile) is no gap: the read is
                # a prefix of the log as it was; a gap is ``missing`` absent still
                now = await self.store.read_records(
                    session_id=session_id, start=missing, end=missing + 1
                )
                if not now:
                    raise _order_error(session_id, missing, last.offset)
        if head is not None:
            _check_stored_head(session_id, events, head)
        return events

    async def read_all(self, session_id: str) -> list[Event]:
        events = await self.read(session_id)
        if not events:
            raise SessionNotFoundError(
                f"no log for session {session_id!r}",
                hint="list the sessions of this state directory to find the id",
                session_id=session_id,
                next_steps=(NextStep(action="list_sessions"),),
            )
        return events

    async def read_verified(self, session_id: str, *, decode_all: bool = False) -> VerifiedRecords:
        """Every record of the session, verified as ``read_all`` verifies it, without
        decoding more than offset 0: the chain covers the stored bytes, so checking it over
        them is the same integrity check at a fraction of the cost of building every event.

        ``decode_all`` decodes every event too (keeping none), so an event the chain covers
        but this version cannot read (unknown kind or field) fails the read, as in
        ``read_all``. Raises ``SessionNotFoundError`` for a session without events.
        """
        check_session_id(session_id)
        head = await self.store.stored_head(session_id=session_id)  # before the events
        expected = head[0] if head is not None else 0
        with cycle_collector_paused(expected):  # one tuple per record stays alive
            records = await self.store.read_records(session_id=session_id, start=0, end=None)
        if not records:
            await self.read_all(session_id)  # raises: nothing stored, or the head names more
            return await self.read_verified(session_id, decode_all=decode_all)  # appended since
        if records[0].offset != 0:
            raise _order_error(session_id, 0, records[0].offset)
        chain = self._chain_of(session_id, records[0])
        decode_records(session_id, records[:1], start=0, prev_digest="", mac=chain.mac)
        check = _decode_each if decode_all else _check_all_chained
        if len(records) < _DECODE_ON_LOOP:
            check(session_id, records, chain.mac)
        else:  # CPU-bound on a long log: keep the event loop free meanwhile
            await asyncio.to_thread(check, session_id, records, chain.mac)
        if head is not None:
            _check_stored_head(session_id, records, head)
        self._chains[session_id] = chain
        return VerifiedRecords(session_id, records, chain)

    async def verify(self, session_id: str) -> Prefix:
        """Check every event of the session; return its head ``(high_water, digest)``."""
        events = await self.read_all(session_id)
        return Prefix(high_water=len(events), digest=events[-1].digest)

    async def head(self, session_id: str) -> Prefix:
        """The stored head, read without verifying the whole chain."""
        check_session_id(session_id)
        last = await self.store.last_record(session_id=session_id)
        if last is None:
            return EMPTY_PREFIX
        return Prefix(high_water=last.offset + 1, digest=last.digest)

    async def exists(self, session_id: str) -> bool:
        return (await self.head(session_id)).high_water > 0

    async def list_sessions(self) -> list[str]:
        return await self.store.list_sessions()

    async def open_writer(self, session_id: str, *, known: Sequence[Event] = ()) -> SessionWriter:
        """Take the session's single-writer lease and verify what is already there.

        ``known`` are verified events this process already holds (a session kept open
        between turns): only the events after them are read and verified, after checking
        that the stored log still ends its prefix where they do. The writer's
        ``initial_events`` are then the new events only.
        """
        check_session_id(session_id)
        lease = await self.store.acquire_writer(session_id=session_id)
        try:
            if known:
                events = await self.read_after(session_id, known)
                last = events[-1] if events else known[-1]
                head = Prefix(high_water=last.offset + 1, digest=last.digest)
            else:
                events = await self.read(session_id)
                head = (
                    Prefix(high_water=len(events), digest=events[-1].digest)
                    if events
                    else EMPTY_PREFIX
                )
        except BaseException:
            await lease.release()
            raise
        chain = await self._known_chain(session_id) if (events or known) else None
        return SessionWriter(self, lease, head, events, chain=chain)

    def _new_chain(self, session_id: str, drafts: Sequence[EventDraft]) -> list[EventDraft]:
        """Start a session's chain: with a key it is keyed, and ``session_started``, which
        must come first then, records the chain and the key id under the first digest."""
        first, rest = drafts[0], list(drafts[1:])
        if isinstance(first.body, SessionStarted):
            chain = self._chain_for_new()
            body = first.body.model_copy(update={"chain": chain.kind, "key_id": chain.key_id})
            return [first.model_copy(update={"body": body}), *rest]
        if self.key is not None:
            raise UsageError(
                f"a keyed session must start with session_started; session {session_id!r} "
                f"starts with {first.body.kind}",
                hint="append a SessionStarted event first: it records the chain and its key id",
                code="keyed_session_needs_start",
                session_id=session_id,
                offset=0,
            )
        return list(drafts)

    def _chain_for_new(self) -> SessionChain:
        if self.key is None:
            return _PLAIN
        return SessionChain("hmac-sha256", self.key.key_id, self.key.mac)

    async def read_after(self, session_id: str, known: Sequence[Event]) -> list[Event]:
        """The events after ``known`` (a verified prefix this process holds), verified
        from its last digest, and the whole log checked against the stored head."""
        prefix = Prefix(high_water=len(known), digest=known[-1].digest)
        head = await self.store.stored_head(session_id=session_id)  # before the events
        records = await self.store.read_records(
            session_id=session_id, start=prefix.high_water - 1, end=None
        )
        if not records or records[0].offset != prefix.high_water - 1:
            raise CorruptLogError(
                f"log for session {session_id!r} is invalid at offset {prefix.high_water - 1}: "
                "an event this process committed is no longer stored",
                hint="the newest events were deleted or rolled back outside lodger; restore "
                "the log from a backup or fork the session from an offset that verifies",
                code="truncated",
                session_id=session_id,
                offset=prefix.high_water - 1,
            )
        if records[0].digest != prefix.digest:
            raise CorruptLogError(
                f"log for session {session_id!r} is invalid at offset {prefix.high_water - 1}: "
                "the stored event differs from the one this process committed",
                hint="the log was changed outside lodger; restore it from a backup",
                code="digest_mismatch",
                session_id=session_id,
                offset=prefix.high_water - 1,
            )
        chain = await self._known_chain(session_id)
        events = decode_records(
            session_id,
            records[1:],
            start=prefix.high_water,
            prev_digest=prefix.digest,
            mac=chain.mac,
        )
        if head is not None:
            _check_stored_head(session_id, _Joined(known, events), head)
        return events

    async def close(self) -> None:
        await self.store.close()


class SessionWriter:
    """The one writer of a session; appends are atomic, durable and offset-checked."""

    def __init__(
        self,
        log: EventLog,
        lease: WriterLease,
        head: Prefix,
        events: Sequence[Event] = (),
        *,
        chain: SessionChain | None = None,
    ) -> None:
        self._log = log
        #: the session's chain; None until its first append decides it
        self.chain = chain
        #: the verified events the log held when this writer opened
        self.initial_events: list[Event] = list(events)
        self._lease = lease
        self._head: Prefix | None = head
        self._closed = False
        self.session_id = lease.session_id

    @property
    def head(self) -> Prefix:
        if self._head is None:
            raise UsageError(
                "the writer's head is unknown after a failed append",
                hint="call `await writer.refresh()` before appending again",
                code="head_unknown",
                session_id=self.session_id,
            )
        return self._head

    async def refresh(self) -> Prefix:
        """Re-read the head from storage (after a failed append the outcome is unknown)."""
        self._head = await self._log.head(self.session_id)
        return self._head

    async def append(self, drafts: Sequence[EventDraft], *, expected_offset: int) -> list[Event]:
        """Append ``drafts`` at ``expected_offset``: all or none, durable on return."""
        if self._closed:
            raise UsageError(
                "this session writer is closed", code="writer_closed", session_id=self.session_id
            )
        if not drafts:
            return []
        head = self._head if self._head is not None else await self.refresh()
        if expected_offset != head.high_water:
            raise AppendConflictError(
                f"append to session {self.session_id!r} expected offset {expected_offset} "
                f"but the log's high-water mark is {head.high_water}",
                hint="re-read the log and decide again; lodger never reorders appends",
                session_id=self.session_id,
                offset=expected_offset,
            )
        chain = self.chain
        if expected_offset == 0:
            drafts = self._log._new_chain(self.session_id, drafts)
            chain = self._log._chain_for_new()
        elif chain is None:  # a writer made by hand over a non-empty session
            chain = await self._log.chain(self.session_id)
        self.chain = chain
        mac = chain.mac
        events: list[Event] = []
        records: list[Record] = []
        prev = head.digest
        for index, draft in enumerate(drafts):
            event, data = seal(
                draft,
                session_id=self.session_id,
                offset=expected_offset + index,
                prev_digest=prev,
                mac=mac,
            )
            events.append(event)
            records.append(Record(event.offset, data, event.digest))
            prev = event.digest
        self._head = None  # unknown until the store answers
        await self._log.store.append_records(
            session_id=self.session_id, records=records, expected_offset=expected_offset
        )
        self._head = new_prefix(expected_offset + len(drafts), prev)
        if expected_offset == 0:
            self._log._chains[self.session_id] = chain
        return events

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._lease.release()

    async def __aenter__(self) -> SessionWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

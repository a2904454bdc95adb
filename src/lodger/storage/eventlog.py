"""``EventLog``: the event semantics of DESIGN section 3 on top of any ``LogStore``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from lodger._bulk import cycle_collector_paused
from lodger.errors import AppendConflictError, CorruptLogError, SessionNotFoundError, UsageError
from lodger.events import EMPTY_PREFIX, Event, EventDraft, Prefix, decode_event, seal
from lodger.storage.logstore import LogStore, Record, WriterLease, check_session_id

__all__ = ["EMPTY_PREFIX", "EventLog", "SessionWriter"]

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


def decode_records(
    session_id: str, records: Sequence[Record], *, start: int, prev_digest: str
) -> list[Event]:
    """Decode contiguous records beginning at ``start``, checking order and the chain."""
    events: list[Event] = []
    expected = start
    prev = prev_digest
    with cycle_collector_paused(len(records)):
        _decode_into(events, session_id, records, expected, prev)
    return events


def _decode_into(
    events: list[Event], session_id: str, records: Sequence[Record], expected: int, prev: str
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


def _check_stored_head(session_id: str, events: Sequence[Event], head: tuple[int, str]) -> None:
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
    """

    def __init__(self, store: LogStore) -> None:
        self.store = store

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
        records = await self.store.read_records(session_id=session_id, start=fetch_from, end=end)
        if start > 0 and records:
            if records[0].offset != start - 1:
                raise _order_error(session_id, start - 1, records[0].offset)
            prev = records[0].digest
            records = records[1:]
        if len(records) < _DECODE_ON_LOOP:
            events = decode_records(session_id, records, start=start, prev_digest=prev)
        else:  # a long log takes CPU seconds to verify: keep the event loop free meanwhile
            events = await asyncio.to_thread(
                decode_records, session_id, records, start=start, prev_digest=prev
            )
        if end is not None and len(events) < end - start:
            # a short bounded read is the end of the log only if nothing is stored after it
            missing = start + len(events)
            last = await self.store.last_record(session_id=session_id)
            if last is not None and last.offset >= missing:
                raise _order_error(session_id, missing, last.offset)
        if head is not None:
            _check_stored_head(session_id, events, head)
        return events

    async def read_all(self, session_id: str) -> list[Event]:
        events = await self.read(session_id)
        if not events:
            raise SessionNotFoundError(
                f"no log for session {session_id!r}",
                hint="run `lodger sessions` to list the sessions in this state directory",
                session_id=session_id,
            )
        return events

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
        return SessionWriter(self, lease, head, events)

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
        events = decode_records(
            session_id, records[1:], start=prefix.high_water, prev_digest=prefix.digest
        )
        if head is not None:
            _check_stored_head(session_id, _Joined(known, events), head)
        return events

    async def close(self) -> None:
        await self.store.close()


class SessionWriter:
    """The one writer of a session; appends are atomic, durable and offset-checked."""

    def __init__(
        self, log: EventLog, lease: WriterLease, head: Prefix, events: Sequence[Event] = ()
    ) -> None:
        self._log = log
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
        events: list[Event] = []
        records: list[Record] = []
        prev = head.digest
        for index, draft in enumerate(drafts):
            event, data = seal(
                draft, session_id=self.session_id, offset=expected_offset + index, prev_digest=prev
            )
            events.append(event)
            records.append(Record(event.offset, data, event.digest))
            prev = event.digest
        self._head = None  # unknown until the store answers
        await self._log.store.append_records(
            session_id=self.session_id, records=records, expected_offset=expected_offset
        )
        self._head = Prefix(high_water=expected_offset + len(drafts), digest=prev)
        return events

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._lease.release()

    async def __aenter__(self) -> SessionWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

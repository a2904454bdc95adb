"""The one conformance suite every ``LogStore`` backend runs through ``EventLog``.

A backend plugs in by implementing ``LogBackend`` (how to open its log, how to reach its
stored records behind lodger's back, how to make one write fail), a pytest fixture named
``backend`` that yields it, and test classes that inherit the suites::

    from lodger.testing.log_conformance import LogConformance, TamperConformance

    @pytest.fixture
    async def backend(tmp_path):
        yield MyBackend(tmp_path)

    class TestMyStore(LogConformance): ...
    class TestMyStoreTampering(TamperConformance): ...

Shipped with lodger (not only in its tests) so a third-party backend runs the same
checks; lodger's own memory and SQLite stores run it in ``tests/storage``. The suite
checks the log semantics of DESIGN section 3 (L1-L5, L8) and that every way of
tampering with stored records fails closed.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from lodger.errors import (
    AppendConflictError,
    CommitFailedError,
    CorruptLogError,
    SessionLockedError,
    SessionNotFoundError,
    UsageError,
)
from lodger.events import (
    EventDraft,
    ModelOutput,
    Prefix,
    ProposedCall,
    ToolDispatched,
    ToolResponded,
    TurnStarted,
    canonical_bytes,
    canonical_json,
    chain_digest,
)
from lodger.storage import EMPTY_PREFIX, EventLog, MemoryLogStore, Record, SqliteLogStore

__all__ = [
    "LogBackend",
    "LogConformance",
    "MemoryBackend",
    "ObjectStoreBackend",
    "SqliteBackend",
    "TamperConformance",
]

SID = "sess-1"


def draft(n: int, *, pad: int = 0) -> EventDraft:
    """The n-th event of a small, varied, deterministic session."""
    ts = 1_700_000_000_000_000 + n
    bodies = [
        TurnStarted(input=f"question {n} " + "x" * pad),
        ModelOutput(
            text=f"answer {n}",
            calls=(ProposedCall(call_id=f"c{n}", name="read", arguments='{"path": "a"}'),),
        ),
        ToolDispatched(
            operation_id=f"op{n}", tool="read", arguments={"path": "a", "opts": {"n": [n, None]}}
        ),
        ToolResponded(operation_id=f"op{n}", status="ok", content=f"content {n}"),
    ]
    return EventDraft(id=f"ev-{n:04d}", ts=ts, body=bodies[n % len(bodies)], turn_id="t1")


def drafts(first: int, count: int) -> list[EventDraft]:
    return [draft(n) for n in range(first, first + count)]


async def seed(log: EventLog, session_id: str, count: int) -> None:
    """Write ``count`` events in batches of 1, 2, 3 ... and release the writer."""
    async with await log.open_writer(session_id) as writer:
        size = 1
        while writer.head.high_water < count:
            at = writer.head.high_water
            await writer.append(drafts(at, min(size, count - at)), expected_offset=at)
            size += 1


# ---------------------------------------------------------------- backends


class LogBackend(abc.ABC):
    """One storage backend, plus the back doors the suite needs to attack it."""

    log: EventLog

    @abc.abstractmethod
    async def other_log(self) -> EventLog:
        """Another handle onto the same storage, as a second process would open it."""

    @abc.abstractmethod
    async def reopen(self) -> EventLog:
        """Close ``self.log`` and open the storage afresh (becomes ``self.log``)."""

    @abc.abstractmethod
    def stored(self, session_id: str) -> list[Record]:
        """The session's records as stored, ordered by offset, read behind lodger's back."""

    @abc.abstractmethod
    def overwrite(
        self, session_id: str, offset: int, *, data: bytes | None = None, digest: str | None = None
    ) -> None:
        """Change a stored record in place."""

    @abc.abstractmethod
    def delete(self, session_id: str, offset: int) -> None: ...

    @abc.abstractmethod
    def set_head(self, session_id: str, head: tuple[int, str] | None) -> None:
        """Replace (or with None, remove) the head the store recorded for the session."""

    @abc.abstractmethod
    def fail_write_at(
        self, session_id: str, offset: int
    ) -> contextlib.AbstractContextManager[None]:
        """While active, any append that writes ``offset`` fails as a storage failure."""

    @abc.abstractmethod
    async def aclose(self) -> None: ...


class _FaultyMemoryStore(MemoryLogStore):
    """The in-memory store has no write that can fail halfway, so its fault fires before
    the write; the SQLite backend's fault fires inside the transaction."""

    fail_at: tuple[str, int] | None = None

    async def append_records(
        self, *, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        if self.fail_at is not None and any(
            (session_id, r.offset) == self.fail_at for r in records
        ):
            raise CommitFailedError(
                "injected write fault", session_id=session_id, offset=expected_offset
            )
        await super().append_records(
            session_id=session_id, records=records, expected_offset=expected_offset
        )


class MemoryBackend(LogBackend):
    def __init__(self) -> None:
        self.store = _FaultyMemoryStore()
        self.log = EventLog(self.store)

    async def other_log(self) -> EventLog:
        return EventLog(self.store)

    async def reopen(self) -> EventLog:
        await self.log.close()
        self.log = EventLog(self.store)
        return self.log

    def stored(self, session_id: str) -> list[Record]:
        return sorted(self.store.sessions.get(session_id, []), key=lambda r: r.offset)

    def overwrite(
        self, session_id: str, offset: int, *, data: bytes | None = None, digest: str | None = None
    ) -> None:
        rows = self.store.sessions[session_id]
        (index,) = [i for i, r in enumerate(rows) if r.offset == offset]
        old = rows[index]
        rows[index] = Record(offset, old.data if data is None else data, digest or old.digest)

    def delete(self, session_id: str, offset: int) -> None:
        rows = self.store.sessions[session_id]
        rows[:] = [r for r in rows if r.offset != offset]

    def set_head(self, session_id: str, head: tuple[int, str] | None) -> None:
        if head is None:
            del self.store.heads[session_id]
        else:
            self.store.heads[session_id] = head

    @contextlib.contextmanager
    def fail_write_at(self, session_id: str, offset: int) -> Iterator[None]:
        self.store.fail_at = (session_id, offset)
        try:
            yield
        finally:
            self.store.fail_at = None

    async def aclose(self) -> None:
        await self.log.close()


class SqliteBackend(LogBackend):
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.log = EventLog(SqliteLogStore(state_dir))
        self._others: list[EventLog] = []

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.state_dir / "log.sqlite3", isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()

    async def other_log(self) -> EventLog:
        other = EventLog(SqliteLogStore(self.state_dir))
        self._others.append(other)
        return other

    async def reopen(self) -> EventLog:
        await self.log.close()
        self.log = EventLog(SqliteLogStore(self.state_dir))
        return self.log

    def stored(self, session_id: str) -> list[Record]:
        if not (self.state_dir / "log.sqlite3").exists():
            return []  # reads and empty appends create nothing
        with self._db() as db:
            rows = db.execute(
                'SELECT "offset", data, digest FROM events WHERE session_id = ? ORDER BY "offset"',
                (session_id,),
            ).fetchall()
        return [Record(o, bytes(d), g) for o, d, g in rows]

    def overwrite(
        self, session_id: str, offset: int, *, data: bytes | None = None, digest: str | None = None
    ) -> None:
        with self._db() as db:
            if data is not None:
                db.execute(
                    'UPDATE events SET data = ? WHERE session_id = ? AND "offset" = ?',
                    (data, session_id, offset),
                )
            if digest is not None:
                db.execute(
                    'UPDATE events SET digest = ? WHERE session_id = ? AND "offset" = ?',
                    (digest, session_id, offset),
                )

    def delete(self, session_id: str, offset: int) -> None:
        with self._db() as db:
            db.execute(
                'DELETE FROM events WHERE session_id = ? AND "offset" = ?', (session_id, offset)
            )

    def set_head(self, session_id: str, head: tuple[int, str] | None) -> None:
        path = self.state_dir / "heads" / f"{session_id}.head"
        if head is None:
            path.unlink()
        else:
            high_water, digest = head
            path.write_text(
                json.dumps({"session_id": session_id, "high_water": high_water, "digest": digest})
            )

    @contextlib.contextmanager
    def fail_write_at(self, session_id: str, offset: int) -> Iterator[None]:
        # A trigger aborts the INSERT of that one row, so the earlier rows of the same batch
        # are already inserted in the open transaction: only a rollback keeps them out.
        with self._db() as db:
            db.execute(
                "CREATE TRIGGER test_write_fault BEFORE INSERT ON events "
                f"WHEN NEW.session_id = '{session_id}' AND NEW.\"offset\" = {offset:d} "
                "BEGIN SELECT RAISE(ABORT, 'injected write fault'); END"
            )
        try:
            yield
        finally:
            with self._db() as db:
                db.execute("DROP TRIGGER test_write_fault")

    async def aclose(self) -> None:
        for other in self._others:
            await other.close()
        await self.log.close()


class ObjectStoreBackend(LogBackend):
    """An ``ObjectLogStore`` over any obstore store; ``make_store`` opens a fresh handle
    onto the same objects (as another process would). The back doors rewrite segment
    objects with plain overwriting puts, as an operator with bucket access could."""

    def __init__(self, make_store: Callable[[], Any]) -> None:
        from lodger.storage.objectstore import ObjectLogStore

        self._make = make_store
        self._raw = make_store()
        self._identity = f"conformance-{id(self)}"
        self.log = EventLog(ObjectLogStore(self._raw, identity=self._identity))
        self._others: list[EventLog] = []
        self._fail_at: tuple[str, int] | None = None
        self._install_fault(self.log)

    def _install_fault(self, log: EventLog) -> None:
        from lodger.storage.objectstore import ObjectLogStore

        store = log.store
        assert isinstance(store, ObjectLogStore)
        inner = store.append_records

        async def append_records(
            *, session_id: str, records: Sequence[Record], expected_offset: int
        ) -> None:
            if self._fail_at is not None and any(
                (session_id, r.offset) == self._fail_at for r in records
            ):
                raise CommitFailedError(
                    "injected write fault", session_id=session_id, offset=expected_offset
                )
            await inner(session_id=session_id, records=records, expected_offset=expected_offset)

        store.append_records = append_records  # type: ignore[method-assign]

    async def other_log(self) -> EventLog:
        from lodger.storage.objectstore import ObjectLogStore

        other = EventLog(ObjectLogStore(self._make(), identity=self._identity))
        self._others.append(other)
        return other

    async def reopen(self) -> EventLog:
        from lodger.storage.objectstore import ObjectLogStore

        await self.log.close()
        self.log = EventLog(ObjectLogStore(self._make(), identity=self._identity))
        self._install_fault(self.log)
        return self.log

    def _segments(self, session_id: str) -> list[tuple[str, int, list[Record]]]:
        import obstore

        from lodger.storage._segments import decode_segment, is_tombstone

        out: list[tuple[str, int, list[Record]]] = []
        root = f"sessions/{session_id}/"
        keys = sorted(
            str(m["path"])
            for chunk in obstore.list(self._raw, root)
            for m in chunk
            if "/seg/" in str(m["path"]) or "/sealed/" in str(m["path"])
        )
        for key in keys:
            blob = bytes(obstore.get(self._raw, key).bytes())
            if is_tombstone(blob):
                continue
            first = int(key.rsplit("/", 1)[1].split("-")[0])
            out.append((key, first, decode_segment(session_id, first, key, blob)))
        return out

    def stored(self, session_id: str) -> list[Record]:
        seen: dict[int, Record] = {}
        for _, _, records in self._segments(session_id):
            for record in records:
                seen.setdefault(record.offset, record)
        return [seen[o] for o in sorted(seen)]

    def _rewrite(
        self, session_id: str, offset: int, change: Callable[[Record], Record | None]
    ) -> None:
        import obstore

        from lodger.storage._segments import encode_segment

        for key, _, records in self._segments(session_id):
            if not any(r.offset == offset for r in records):
                continue
            kept: list[Record] = []
            for record in records:
                new = change(record) if record.offset == offset else record
                if new is not None:
                    kept.append(new)
            if kept:
                # keep the key's first offset in the header even if that record is gone
                data = encode_segment(session_id, kept)
                if kept[0].offset != records[0].offset:
                    data = data.replace(
                        f'"first":{kept[0].offset}'.encode(),
                        f'"first":{records[0].offset}'.encode(),
                        1,
                    )
                obstore.put(self._raw, key, data)
            else:
                obstore.delete(self._raw, key)

    def overwrite(
        self, session_id: str, offset: int, *, data: bytes | None = None, digest: str | None = None
    ) -> None:
        self._rewrite(
            session_id,
            offset,
            lambda r: Record(r.offset, r.data if data is None else data, digest or r.digest),
        )

    def delete(self, session_id: str, offset: int) -> None:
        self._rewrite(session_id, offset, lambda r: None)

    def set_head(self, session_id: str, head: tuple[int, str] | None) -> None:
        import obstore

        from lodger.storage._segments import head_key

        for chunk in obstore.list(self._raw, f"sessions/{session_id}/head/"):
            for meta in chunk:
                obstore.delete(self._raw, str(meta["path"]))
        if head is not None:
            obstore.put(self._raw, head_key(session_id, *head), b"")

    @contextlib.contextmanager
    def fail_write_at(self, session_id: str, offset: int) -> Iterator[None]:
        self._fail_at = (session_id, offset)
        try:
            yield
        finally:
            self._fail_at = None

    async def aclose(self) -> None:
        for other in self._others:
            await other.close()
        await self.log.close()


# ---------------------------------------------------------------- helpers for attacks


def rechain(backend: LogBackend, session_id: str, offset: int, data: bytes) -> None:
    """Store ``data`` at ``offset`` with a correct digest and re-chain every later record,
    so only the decoder (not the digest) can notice what is wrong."""
    records = backend.stored(session_id)
    prev = records[offset - 1].digest if offset > 0 else ""
    for record in records[offset:]:
        new_data = data if record.offset == offset else record.data
        digest = chain_digest(prev, new_data)
        backend.overwrite(session_id, record.offset, data=new_data, digest=digest)
        prev = digest


def edited(record: Record, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """The record's event JSON after ``edit``, in canonical form."""
    raw = json.loads(record.data)
    edit(raw)
    return canonical_json(raw)


async def assert_fails_closed(
    log: EventLog, session_id: str, *, offset: int, code: str, reads_from: Sequence[int] = ()
) -> None:
    """Every way to read the session (and to open a writer on it) raises the same error."""
    attempts: list[Callable[[], Awaitable[object]]] = [
        lambda: log.read(session_id),
        lambda: log.read_all(session_id),
        lambda: log.verify(session_id),
        lambda: log.open_writer(session_id),
    ]

    def read_from(start: int) -> Callable[[], Awaitable[object]]:
        return lambda: log.read(session_id, start=start)

    attempts.extend(read_from(start) for start in reads_from)
    for attempt in attempts:
        with pytest.raises(CorruptLogError) as info:
            await attempt()
        err = info.value
        assert (err.session_id, err.offset, err.code) == (session_id, offset, code), str(err)
        assert repr(session_id) in str(err)
        assert f"offset {offset}" in str(err)
        assert err.hint


# ---------------------------------------------------------------- the suite


class LogConformance:
    """What every backend must do. Subclass it in a test module that defines ``backend``."""

    async def test_append_single_event_at_zero(self, backend: LogBackend) -> None:
        log = backend.log
        async with await log.open_writer(SID) as writer:
            assert writer.head == EMPTY_PREFIX
            (event,) = await writer.append([draft(0)], expected_offset=0)
        assert (event.offset, event.session_id, event.id, event.kind) == (
            0,
            SID,
            "ev-0000",
            "turn_started",
        )
        assert event.digest == chain_digest("", canonical_bytes(event))
        assert await log.read(SID) == [event]

    async def test_multi_event_append_lands_at_the_expected_offsets(
        self, backend: LogBackend
    ) -> None:
        log = backend.log
        async with await log.open_writer(SID) as writer:
            await writer.append(drafts(0, 1), expected_offset=0)
            events = await writer.append(drafts(1, 3), expected_offset=1)
            assert writer.head == Prefix(high_water=4, digest=events[-1].digest)
        assert [e.offset for e in events] == [1, 2, 3]
        assert [e.id for e in events] == ["ev-0001", "ev-0002", "ev-0003"]
        assert (await log.read(SID))[1:] == events

    async def test_empty_append_writes_nothing(self, backend: LogBackend) -> None:
        async with await backend.log.open_writer(SID) as writer:
            assert await writer.append([], expected_offset=0) == []
        assert await backend.log.head(SID) == EMPTY_PREFIX
        assert backend.stored(SID) == []

    async def test_read_ranges(self, backend: LogBackend) -> None:
        log = backend.log
        await seed(log, SID, 6)
        everything = await log.read(SID)
        assert [e.offset for e in everything] == list(range(6))
        for start, end in [(0, 6), (0, 1), (2, 4), (3, None), (5, 6), (4, 100), (0, None)]:
            got = await log.read(SID, start=start, end=end)
            assert got == everything[start:end], (start, end)
        for start, end in [(0, 0), (3, 3), (6, None), (6, 9), (50, None)]:
            assert await log.read(SID, start=start, end=end) == [], (start, end)
        assert await log.read("never-written") == []

    async def test_invalid_ranges_are_usage_errors(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 3)
        for start, end in [(-1, None), (2, 1)]:
            with pytest.raises(UsageError) as info:
                await backend.log.read(SID, start=start, end=end)
            assert info.value.code == "invalid_range"

    async def test_head_is_high_water_and_last_digest(self, backend: LogBackend) -> None:
        log = backend.log
        assert await log.head(SID) == EMPTY_PREFIX
        assert not await log.exists(SID)
        await seed(log, SID, 5)
        last = (await log.read(SID))[-1]
        assert await log.head(SID) == Prefix(high_water=5, digest=last.digest)
        assert await log.exists(SID)

    async def test_verify_returns_the_head(self, backend: LogBackend) -> None:
        log = backend.log
        await seed(log, SID, 7)
        head = await log.verify(SID)
        assert head == await log.head(SID)
        assert head.high_water == 7
        assert head.digest == backend.stored(SID)[-1].digest

    async def test_verify_of_a_missing_session_is_not_found(self, backend: LogBackend) -> None:
        with pytest.raises(SessionNotFoundError) as info:
            await backend.log.verify("ghost")
        assert info.value.session_id == "ghost"

    async def test_list_sessions(self, backend: LogBackend) -> None:
        log = backend.log
        assert await log.list_sessions() == []
        for sid in ["b-sess", "a-sess", "c.sess"]:
            await seed(log, sid, 2)
        async with await log.open_writer("opened-but-empty"):
            pass
        assert await log.list_sessions() == ["a-sess", "b-sess", "c.sess"]

    async def test_sessions_are_independent(self, backend: LogBackend) -> None:
        log = backend.log
        async with await log.open_writer("s-a") as a, await log.open_writer("s-b") as b:
            await a.append(drafts(0, 2), expected_offset=0)
            await b.append(drafts(10, 1), expected_offset=0)
            await a.append(drafts(2, 1), expected_offset=2)
        assert [e.id for e in await log.read("s-a")] == ["ev-0000", "ev-0001", "ev-0002"]
        assert [e.id for e in await log.read("s-b")] == ["ev-0010"]

    async def test_digests_chain(self, backend: LogBackend) -> None:
        log = backend.log
        await seed(log, SID, 6)
        events = await log.read(SID)
        prev = ""
        for event, record in zip(events, backend.stored(SID), strict=True):
            assert record.data == canonical_bytes(event)
            assert event.digest == record.digest == chain_digest(prev, record.data)
            prev = event.digest

    async def test_appends_survive_reopening(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 4)
        before = await backend.log.read(SID)
        log = await backend.reopen()
        assert await log.read(SID) == before
        async with await log.open_writer(SID) as writer:
            assert writer.head == Prefix(high_water=4, digest=before[-1].digest)
            await writer.append(drafts(4, 1), expected_offset=4)
        assert (await log.verify(SID)).high_water == 5

    # -- atomicity ------------------------------------------------------------

    async def test_batch_with_an_unencodable_event_writes_nothing(
        self, backend: LogBackend
    ) -> None:
        log = backend.log
        await seed(log, SID, 2)
        head = await log.head(SID)
        nan = EventDraft(
            id="bad",
            ts=1,
            body=ToolDispatched(operation_id="o", tool="t", arguments={"x": float("nan")}),
        )
        async with await log.open_writer(SID) as writer:
            # canonical JSON refuses NaN; the batch fails while sealing, before any write
            with pytest.raises(UsageError, match="cannot be stored") as info:
                await writer.append([draft(2), nan, draft(3)], expected_offset=2)
            assert info.value.code == "unencodable_event"
            assert await log.head(SID) == head
            assert writer.head == head
            await writer.append(drafts(2, 2), expected_offset=2)
        assert [e.id for e in await log.read(SID)] == [f"ev-{n:04d}" for n in range(4)]

    async def test_failed_write_in_the_middle_of_a_batch_writes_nothing(
        self, backend: LogBackend
    ) -> None:
        log = backend.log
        await seed(log, SID, 2)
        head = await log.head(SID)
        async with await log.open_writer(SID) as writer:
            with backend.fail_write_at(SID, 3), pytest.raises(CommitFailedError) as info:
                await writer.append(drafts(2, 3), expected_offset=2)
            assert (info.value.session_id, info.value.offset) == (SID, 2)
            assert [r.offset for r in backend.stored(SID)] == [0, 1]
            assert await log.verify(SID) == head
            # the writer cannot know what happened; it must re-read before going on
            with pytest.raises(UsageError) as unknown:
                _ = writer.head
            assert unknown.value.code == "head_unknown"
            assert await writer.refresh() == head
            await writer.append(drafts(2, 3), expected_offset=2)
        assert (await log.verify(SID)).high_water == 5

    # -- offsets ----------------------------------------------------------------

    @pytest.mark.parametrize("expected", [0, 2, 4, 99])
    async def test_wrong_expected_offset_is_a_conflict(
        self, backend: LogBackend, expected: int
    ) -> None:
        log = backend.log
        await seed(log, SID, 3)
        before = backend.stored(SID)
        async with await log.open_writer(SID) as writer:
            with pytest.raises(AppendConflictError) as info:
                await writer.append(drafts(3, 2), expected_offset=expected)
            assert (info.value.session_id, info.value.offset) == (SID, expected)
            assert writer.head.high_water == 3
        assert backend.stored(SID) == before

    @pytest.mark.parametrize("expected", [0, 2, 4])
    async def test_store_refuses_a_stale_expected_offset(
        self, backend: LogBackend, expected: int
    ) -> None:
        # the store checks the offset itself: a writer whose idea of the head is stale
        # (e.g. fenced) must not land its records anywhere else
        log = backend.log
        await seed(log, SID, 3)
        before = backend.stored(SID)
        stray = [Record(expected + i, b"{}", "0" * 64) for i in range(2)]
        with pytest.raises(AppendConflictError) as info:
            await log.store.append_records(session_id=SID, records=stray, expected_offset=expected)
        assert (info.value.session_id, info.value.offset) == (SID, expected)
        assert backend.stored(SID) == before
        assert (await log.verify(SID)).high_water == 3

    # -- one writer per session ------------------------------------------------

    async def test_second_writer_is_refused(self, backend: LogBackend) -> None:
        log = backend.log
        other = await backend.other_log()
        writer = await log.open_writer(SID)
        for contender in (log, other):
            with pytest.raises(SessionLockedError) as info:
                await contender.open_writer(SID)
            assert info.value.session_id == SID
            assert repr(SID) in str(info.value)
        # a different session is not affected
        async with await other.open_writer("sess-2"):
            pass
        await writer.close()
        async with await other.open_writer(SID) as again:
            assert again.head == EMPTY_PREFIX

    async def test_new_writer_after_close_sees_the_appends(self, backend: LogBackend) -> None:
        log = backend.log
        async with await log.open_writer(SID) as first:
            events = await first.append(drafts(0, 3), expected_offset=0)
        async with await (await backend.other_log()).open_writer(SID) as second:
            assert second.head == Prefix(high_water=3, digest=events[-1].digest)
            await second.append(drafts(3, 1), expected_offset=3)
        assert (await log.verify(SID)).high_water == 4

    async def test_closed_writer_refuses_to_append(self, backend: LogBackend) -> None:
        writer = await backend.log.open_writer(SID)
        await writer.append(drafts(0, 1), expected_offset=0)
        await writer.close()
        await writer.close()  # idempotent
        with pytest.raises(UsageError) as info:
            await writer.append(drafts(1, 1), expected_offset=1)
        assert (info.value.code, info.value.session_id) == ("writer_closed", SID)
        assert len(backend.stored(SID)) == 1

    async def test_writer_closed_after_its_log_still_releases_the_session(
        self, backend: LogBackend
    ) -> None:
        # shutdown order in `finally` blocks is not always writer-then-log
        writer = await backend.log.open_writer(SID)
        await writer.append(drafts(0, 1), expected_offset=0)
        log = await backend.reopen()
        await writer.close()
        async with await log.open_writer(SID) as again:
            assert again.head.high_water == 1

    async def test_open_writer_on_a_corrupt_log_fails_and_keeps_no_lease(
        self, backend: LogBackend
    ) -> None:
        log = backend.log
        await seed(log, SID, 3)
        good = backend.stored(SID)[1]
        backend.overwrite(SID, 1, digest="f" * 64)
        for _ in range(2):  # the second attempt fails the same way, not as "locked"
            with pytest.raises(CorruptLogError):
                await log.open_writer(SID)
        backend.overwrite(SID, 1, digest=good.digest)
        async with await log.open_writer(SID) as writer:
            assert writer.head.high_water == 3

    async def test_concurrent_writers_one_wins(self, backend: LogBackend) -> None:
        logs = [backend.log, await backend.other_log()]
        results = await asyncio.gather(
            *(log.open_writer(SID) for log in logs), return_exceptions=True
        )
        writers = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, BaseException)]
        assert len(writers) == 1
        assert len(refused) == 1
        assert isinstance(refused[0], SessionLockedError)
        await writers[0].close()

    # -- session ids -------------------------------------------------------------

    @pytest.mark.parametrize(
        "bad",
        ["", ".hidden", "-dash", "a/b", "../up", "sp ace", "tab\t", "nl\n", "é", "a" * 129],
    )
    async def test_session_ids_are_validated(self, backend: LogBackend, bad: str) -> None:
        log = backend.log
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: log.read(bad),
            lambda: log.head(bad),
            lambda: log.verify(bad),
            lambda: log.exists(bad),
            lambda: log.open_writer(bad),
        ]
        for call in calls:
            with pytest.raises(UsageError) as info:
                await call()
            assert info.value.code == "invalid_session_id"
        assert await log.list_sessions() == []

    @pytest.mark.parametrize("good", ["a", "A9", "0.b_c-d", "x" * 128])
    async def test_valid_session_ids_work(self, backend: LogBackend, good: str) -> None:
        await seed(backend.log, good, 1)
        assert await backend.log.list_sessions() == [good]


class TamperConformance:
    """Stored records changed behind lodger's back: every read fails closed, naming the
    session, the offset and what is wrong."""

    async def test_changed_byte_in_data(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 5)
        record = backend.stored(SID)[2]
        assert b'"op2"' in record.data
        backend.overwrite(SID, 2, data=record.data.replace(b'"op2"', b'"op9"'))
        await assert_fails_closed(
            backend.log, SID, offset=2, code="digest_mismatch", reads_from=[1, 2]
        )
        # a range that ends before the damage still reads
        assert len(await backend.log.read(SID, end=2)) == 2

    async def test_changed_digest(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 5)
        digest = backend.stored(SID)[2].digest
        flipped = ("1" if digest[10] == "0" else "0").join([digest[:10], digest[11:]])
        backend.overwrite(SID, 2, digest=flipped)
        await assert_fails_closed(backend.log, SID, offset=2, code="digest_mismatch")

    async def test_changed_last_digest(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 5)
        backend.overwrite(SID, 4, digest="0" * 64)
        await assert_fails_closed(backend.log, SID, offset=4, code="digest_mismatch")

    async def test_digest_that_is_not_hex(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 5)
        backend.overwrite(SID, 2, digest="not-a-digest")
        # a read from offset 3 starts from the stored digest of offset 2
        await assert_fails_closed(
            backend.log, SID, offset=2, code="digest_mismatch", reads_from=[3]
        )

    async def test_deleted_middle_row_is_a_gap(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 5)
        backend.delete(SID, 2)
        await assert_fails_closed(backend.log, SID, offset=2, code="gap", reads_from=[1, 2, 3])

    async def test_deleted_first_row_is_a_gap(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 3)
        backend.delete(SID, 0)
        await assert_fails_closed(backend.log, SID, offset=0, code="gap")

    @pytest.mark.parametrize("lost", [1, 2])
    async def test_deleted_newest_rows_are_a_truncation(
        self, backend: LogBackend, lost: int
    ) -> None:
        # the chain cannot tell a shorter log from a lost tail; the recorded head can
        await seed(backend.log, SID, 5)
        for offset in range(5 - lost, 5):
            backend.delete(SID, offset)
        await assert_fails_closed(backend.log, SID, offset=5 - lost, code="truncated")

    async def test_every_row_lost_keeps_the_session_listed_and_failing_closed(
        self, backend: LogBackend
    ) -> None:
        # a lost WAL can take every event of a session: it must not vanish or start afresh
        await seed(backend.log, SID, 3)
        for offset in range(3):
            backend.delete(SID, offset)
        assert await backend.log.list_sessions() == [SID]
        await assert_fails_closed(backend.log, SID, offset=0, code="truncated")

    async def test_lost_head_record_fails_closed(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 4)
        backend.set_head(SID, None)
        await assert_fails_closed(backend.log, SID, offset=4, code="head_missing")
        assert await backend.log.list_sessions() == [SID]

    async def test_head_one_append_behind_is_a_valid_prefix(self, backend: LogBackend) -> None:
        # a process killed between a commit and recording its head leaves the head behind
        await seed(backend.log, SID, 6)  # appends of 1, 2 and 3 events
        records = backend.stored(SID)
        backend.set_head(SID, (3, records[2].digest))
        assert (await backend.log.verify(SID)).high_water == 6
        async with await backend.log.open_writer(SID) as writer:
            await writer.append(drafts(6, 1), expected_offset=6)
        assert (await backend.log.verify(SID)).high_water == 7

    async def test_head_whose_digest_differs_from_the_stored_event(
        self, backend: LogBackend
    ) -> None:
        # same length, other facts: the tail was rolled back and written again
        await seed(backend.log, SID, 6)
        records = backend.stored(SID)
        backend.set_head(SID, (3, records[1].digest))
        await assert_fails_closed(backend.log, SID, offset=2, code="truncated")

    @pytest.mark.parametrize(("start", "end"), [(0, 3), (1, 3), (2, 3), (2, 4), (0, 5)])
    async def test_gap_inside_a_bounded_range(
        self, backend: LogBackend, start: int, end: int
    ) -> None:
        # a bounded read must not pass a gap off as the end of the log
        await seed(backend.log, SID, 5)
        backend.delete(SID, 2)
        with pytest.raises(CorruptLogError) as info:
            await backend.log.read(SID, start=start, end=end)
        assert (info.value.session_id, info.value.offset, info.value.code) == (SID, 2, "gap")

    async def test_two_rows_swapped(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 5)
        one, two = backend.stored(SID)[1:3]
        backend.overwrite(SID, 1, data=two.data, digest=two.digest)
        backend.overwrite(SID, 2, data=one.data, digest=one.digest)
        await assert_fails_closed(backend.log, SID, offset=1, code="digest_mismatch")

    async def test_two_rows_swapped_and_rechained(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 5)
        one, two = backend.stored(SID)[1:3]
        rechain(backend, SID, 1, two.data)
        rechain(backend, SID, 2, one.data)
        await assert_fails_closed(
            backend.log, SID, offset=1, code="offset_mismatch", reads_from=[1]
        )

    async def test_record_moved_to_another_session(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 2)
        await seed(backend.log, "sess-2", 2)
        foreign = backend.stored(SID)[1]
        rechain(backend, "sess-2", 1, foreign.data)
        await assert_fails_closed(backend.log, "sess-2", offset=1, code="session_mismatch")

    async def test_unknown_kind(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 5)
        record = backend.stored(SID)[2]
        rechain(backend, SID, 2, edited(record, lambda raw: raw["body"].update(kind="dream")))
        await assert_fails_closed(backend.log, SID, offset=2, code="unknown_kind")

    @pytest.mark.parametrize("where", ["envelope", "body"])
    async def test_unknown_field(self, backend: LogBackend, where: str) -> None:
        await seed(backend.log, SID, 5)
        record = backend.stored(SID)[3]

        def add_field(raw: dict[str, Any]) -> None:
            (raw if where == "envelope" else raw["body"])["colour"] = "red"

        rechain(backend, SID, 3, edited(record, add_field))
        await assert_fails_closed(backend.log, SID, offset=3, code="unknown_field")

    async def test_missing_field(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 5)
        record = backend.stored(SID)[3]
        rechain(backend, SID, 3, edited(record, lambda raw: raw.pop("ts")))
        await assert_fails_closed(backend.log, SID, offset=3, code="missing_field")

    @pytest.mark.parametrize("with_new_field", [False, True])
    async def test_newer_schema_version(self, backend: LogBackend, with_new_field: bool) -> None:
        await seed(backend.log, SID, 5)
        record = backend.stored(SID)[4]

        def bump(raw: dict[str, Any]) -> None:
            raw["v"] += 1
            if with_new_field:  # what a newer writer would plausibly add
                raw["priority"] = 1

        rechain(backend, SID, 4, edited(record, bump))
        await assert_fails_closed(backend.log, SID, offset=4, code="newer_schema")

    async def test_torn_write(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 5)
        record = backend.stored(SID)[3]
        rechain(backend, SID, 3, record.data[: len(record.data) // 2])
        await assert_fails_closed(backend.log, SID, offset=3, code="undecodable", reads_from=[3])

    async def test_bytes_that_are_not_utf8(self, backend: LogBackend) -> None:
        await seed(backend.log, SID, 5)
        record = backend.stored(SID)[3]
        rechain(backend, SID, 3, record.data.replace(b"op3", b"op\xff"))
        await assert_fails_closed(backend.log, SID, offset=3, code="undecodable")

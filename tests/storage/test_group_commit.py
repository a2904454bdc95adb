"""Group commit in the SQLite store: appends of many sessions share one transaction.

The store's I/O thread is held on a gate while appends queue up, so every group here is
exactly the appends that arrived while the thread was busy (as they do while a commit
waits for its fsync), and the orders are forced, not timed.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest

from lodger.errors import AppendConflictError, CommitFailedError
from lodger.storage import EventLog, SessionWriter, SqliteLogStore
from lodger.storage.logstore import Record
from lodger.testing.log_conformance import drafts

SESSIONS = [f"sess-{n}" for n in range(8)]


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[EventLog]:
    opened = EventLog(SqliteLogStore(tmp_path / "state"))
    yield opened
    await opened.close()


def store_of(log: EventLog) -> SqliteLogStore:
    assert isinstance(log.store, SqliteLogStore)
    return log.store


@contextlib.asynccontextmanager
async def held(store: SqliteLogStore, expected: int) -> AsyncIterator[None]:
    """Hold the store's I/O thread until ``expected`` appends wait for the next group."""
    gate = threading.Event()

    def wait() -> None:
        gate.wait(10)

    store._io.post(wait)
    try:
        yield
        for _ in range(1000):
            if store._appends.waiting() >= expected:
                break
            await asyncio.sleep(0.001)
        assert store._appends.waiting() == expected
    finally:
        gate.set()


async def grouped(store: SqliteLogStore, appends: list[Awaitable[object]]) -> list[object]:
    """Run ``appends`` as one group; their results or exceptions, in order."""
    async with held(store, len(appends)):
        tasks = [asyncio.ensure_future(a) for a in appends]
        await asyncio.sleep(0)
    return list(await asyncio.gather(*tasks, return_exceptions=True))


async def writers(log: EventLog, count: int) -> list[SessionWriter]:
    opened = []
    for sid in SESSIONS:
        writer = await log.open_writer(sid)
        await writer.append(drafts(0, count), expected_offset=0)
        opened.append(writer)
    return opened


async def test_appends_of_many_sessions_share_one_commit(log: EventLog, tmp_path: Path) -> None:
    store = store_of(log)
    opened = await writers(log, 2)
    before = store.group_stats.groups
    results = await grouped(store, [w.append(drafts(2, 3), expected_offset=2) for w in opened])
    assert all(isinstance(r, list) and len(r) == 3 for r in results)
    assert store.group_stats.groups == before + 1
    assert store.group_stats.largest == len(SESSIONS)
    for writer in opened:
        assert writer.head.high_water == 5
        await writer.close()
    again = EventLog(SqliteLogStore(tmp_path / "state"))
    try:
        for sid in SESSIONS:
            assert (await again.verify(sid)).high_water == 5
    finally:
        await again.close()


async def test_a_conflict_fails_its_own_append_only(log: EventLog) -> None:
    store = store_of(log)
    for writer in await writers(log, 2):
        await writer.close()
    stale = [Record(1, b"{}", "0" * 64)]  # session 0 already holds offsets 0 and 1
    fresh = [Record(2, b"{}", "1" * 64)]
    results = await grouped(
        store,
        [
            store.append_records(session_id=SESSIONS[0], records=stale, expected_offset=1),
            store.append_records(session_id=SESSIONS[1], records=fresh, expected_offset=2),
            store.append_records(session_id=SESSIONS[2], records=fresh, expected_offset=2),
        ],
    )
    assert isinstance(results[0], AppendConflictError)
    assert (results[0].session_id, results[0].offset) == (SESSIONS[0], 1)
    assert results[1:] == [None, None]
    for sid in SESSIONS[1:3]:
        assert await store.last_record(session_id=sid) == fresh[0]
        assert await store.stored_head(session_id=sid) == (3, "1" * 64)
    assert (await store.last_record(session_id=SESSIONS[0])) != stale[0]


async def test_a_row_sqlite_refuses_fails_its_own_append_only(
    log: EventLog, tmp_path: Path
) -> None:
    store = store_of(log)
    opened = await writers(log, 2)
    db = tmp_path / "state" / "log.sqlite3"
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.session_id = 'sess-3' "
            "AND NEW.\"offset\" = 3 BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
    results = await grouped(store, [w.append(drafts(2, 2), expected_offset=2) for w in opened])
    for sid, result in zip(SESSIONS, results, strict=True):
        if sid == "sess-3":
            assert isinstance(result, CommitFailedError)
            assert (result.session_id, result.offset) == (sid, 2)
        else:
            assert isinstance(result, list)
    for writer in opened:
        await writer.close()
    assert (await log.verify("sess-3")).high_water == 2  # neither of its two rows
    assert (await log.verify("sess-4")).high_water == 4


@contextlib.asynccontextmanager
async def statements(store: SqliteLogStore) -> AsyncIterator[list[str]]:
    """The SQL the store's connection runs meanwhile (traced on its own thread)."""
    seen: list[str] = []
    conn = store._conn
    assert conn is not None
    await store._run(lambda: conn.set_trace_callback(seen.append))
    try:
        yield seen
    finally:
        await store._run(lambda: conn.set_trace_callback(None))


async def test_the_high_water_mark_is_kept_while_the_lock_is_held(log: EventLog) -> None:
    store = store_of(log)
    async with await log.open_writer("sess-0") as writer:
        await writer.append(drafts(0, 2), expected_offset=0)  # the first append reads it
        async with statements(store) as seen:
            await writer.append(drafts(2, 2), expected_offset=2)
        assert not [s for s in seen if "MAX(" in s]
        with pytest.raises(AppendConflictError):  # the kept mark still refuses stale ones
            await store.append_records(
                session_id="sess-0", records=[Record(1, b"{}", "0" * 64)], expected_offset=1
            )
    # without the lock the store reads the mark from the table
    async with statements(store) as seen:
        with pytest.raises(AppendConflictError):
            await store.append_records(
                session_id="sess-0", records=[Record(3, b"{}", "0" * 64)], expected_offset=3
            )
    assert [s for s in seen if "MAX(" in s]


async def test_a_mark_kept_from_an_earlier_lock_is_not_trusted(
    log: EventLog, tmp_path: Path
) -> None:
    async with await log.open_writer("sess-0") as writer:
        await writer.append(drafts(0, 2), expected_offset=0)
    other = EventLog(SqliteLogStore(tmp_path / "state"))  # as another process would
    try:
        async with await other.open_writer("sess-0") as writer:
            await writer.append(drafts(2, 2), expected_offset=2)
    finally:
        await other.close()
    store = store_of(log)
    lease = await store.acquire_writer(session_id="sess-0")
    try:
        with pytest.raises(AppendConflictError):  # 2 was this store's mark; it is now 4
            await store.append_records(
                session_id="sess-0", records=[Record(2, b"{}", "0" * 64)], expected_offset=2
            )
    finally:
        await lease.release()


@pytest.mark.parametrize("vanish", ["remove", "rename"])
async def test_a_failed_commit_fails_every_append_of_its_group(
    log: EventLog, tmp_path: Path, vanish: str
) -> None:
    store = store_of(log)
    state = tmp_path / "state"
    opened = await writers(log, 2)
    async with held(store, len(opened)):
        tasks = [asyncio.ensure_future(w.append(drafts(2, 1), expected_offset=2)) for w in opened]
        await asyncio.sleep(0)
        if vanish == "remove":
            shutil.rmtree(state)
        else:
            state.rename(tmp_path / "moved")
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for sid, result in zip(SESSIONS, results, strict=True):
        assert isinstance(result, CommitFailedError)
        assert (result.code, result.session_id, result.offset) == ("log_file_gone", sid, 2)
    for writer in opened:
        await writer.close()
    if vanish == "rename":  # what was committed before the group is there, nothing after
        again = EventLog(SqliteLogStore(tmp_path / "moved"))
        try:
            for sid in SESSIONS:
                assert (await again.verify(sid)).high_water == 2
        finally:
            await again.close()


async def test_a_group_takes_no_savepoint_per_append(log: EventLog, tmp_path: Path) -> None:
    """Each statement is a trip off the GIL and back for the I/O thread: a group's rows
    are inserted through one statement, with no savepoint per append unless SQLite
    refuses a row."""
    store = store_of(log)
    opened = await writers(log, 2)
    async with statements(store) as seen:
        results = await grouped(store, [w.append(drafts(2, 3), expected_offset=2) for w in opened])
    assert all(isinstance(r, list) for r in results)
    assert len([s for s in seen if s.lstrip().upper().startswith("INSERT")]) == 24  # rows
    assert not [s for s in seen if "SAVEPOINT" in s.upper()]
    for writer in opened:
        await writer.close()
    again = EventLog(SqliteLogStore(tmp_path / "state"))
    try:
        for sid in SESSIONS:
            assert (await again.verify(sid)).high_water == 5
    finally:
        await again.close()

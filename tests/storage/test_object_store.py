"""The object-store log beyond the conformance suite: fencing between writers (threads
and processes, local directory and S3), a writer killed between its segment and its head,
compaction racing readers and writers, and damaged segments failing closed."""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import subprocess
import sys
import threading
from pathlib import Path

import obstore
import pytest

from lodger.errors import CorruptLogError, SessionLockedError, WriterFencedError
from lodger.storage import EventLog
from lodger.storage._segments import seg_key
from lodger.storage.objectstore import ObjectLogStore, open_object_store

from ._object_writer import make_draft, open_log, race
from ._s3server import S3Server

CHILD = Path(__file__).with_name("_object_writer.py")
SID = "shared"


# the S3 server (moto) is slow to start: the fast lane runs the directory store only
@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.slow)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path / 'objects'}"
    server: S3Server = request.getfixturevalue("s3")
    return server.url()


def _check_race(url: str, outcomes: dict[str, list[str]], rounds: int) -> None:
    # each round: exactly one writer won the offset, the other was fenced at it
    for n in range(rounds):
        got = sorted(outcomes[name][n] for name in outcomes)
        assert got == [f"fenced {n}", f"won {n}"], (n, got)
    events = asyncio.run(_verified(url))
    assert [e.offset for e in events] == list(range(rounds))
    winners = {o.split()[1]: name for name in outcomes for o in outcomes[name] if "won" in o}
    assert [e.id.split("-")[0] for e in events] == [winners[str(n)] for n in range(rounds)]


async def _verified(url: str) -> list:  # type: ignore[type-arg]
    log = open_log(url, "reader")
    try:
        await log.verify(SID)
        return await log.read(SID)
    finally:
        await log.close()


def test_two_writer_threads_one_wins_each_offset(url: str) -> None:
    rounds = 6
    barrier = threading.Barrier(2)
    outcomes: dict[str, list[str]] = {}

    def run(name: str) -> None:
        from ._object_writer import race_rounds

        outcomes[name] = asyncio.run(race_rounds(url, SID, name, rounds, barrier))

    threads = [threading.Thread(target=run, args=(name,)) for name in ("alpha", "beta")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert set(outcomes) == {"alpha", "beta"}
    _check_race(url, outcomes, rounds)


@pytest.mark.slow
def test_two_writer_processes_one_wins_each_offset(url: str) -> None:
    rounds = 5
    ctx = multiprocessing.get_context("spawn")  # obstore's runtime does not survive fork
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=race, args=(url, SID, name, rounds, barrier, results))
        for name in ("alpha", "beta")
    ]
    for proc in procs:
        proc.start()
    outcomes = dict(results.get(timeout=90) for _ in procs)
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    _check_race(url, outcomes, rounds)


def test_fenced_writer_keeps_nothing_and_says_so(url: str) -> None:
    async def main() -> None:
        first, second = open_log(url, "one"), open_log(url, "two")
        stale = await first.open_writer(SID)
        fresh = await second.open_writer(SID)
        await fresh.append([make_draft("two", 0), make_draft("two", 1)], expected_offset=0)
        with pytest.raises(WriterFencedError) as info:
            await stale.append([make_draft("one", 0)], expected_offset=0)
        assert (info.value.session_id, info.value.offset, info.value.code) == (
            SID,
            0,
            "writer_fenced",
        )
        assert "another writer committed" in str(info.value)
        # the fenced writer re-reads: it sees the other writer's events, not its own
        assert (await stale.refresh()).high_water == 2
        await stale.close()
        await fresh.close()
        assert [e.id for e in await first.read(SID)] == ["two-0", "two-1"]
        await first.close()
        await second.close()

    asyncio.run(main())


def test_writer_killed_between_segment_and_head_loses_nothing(url: str) -> None:
    done = subprocess.run(
        [sys.executable, str(CHILD), "kill-before-head", url, SID, "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr

    async def main() -> None:
        log = open_log(url, "next")
        store = log.store
        assert isinstance(store, ObjectLogStore)
        # four segments committed; only the first append's head was recorded
        head = await store.stored_head(session_id=SID)
        assert head is not None and head[0] == 1
        events = await log.read(SID)
        assert [e.id for e in events] == [f"killed-{n}" for n in range(4)]
        async with await log.open_writer(SID) as writer:
            assert writer.head.high_water == 4
            await writer.append([make_draft("next", 4)], expected_offset=4)
        head = await store.stored_head(session_id=SID)
        assert head is not None and head[0] == 5  # the next writer's release recorded it
        assert (await log.verify(SID)).high_water == 5
        await log.close()

    asyncio.run(main())


async def _seed(log: EventLog, count: int, *, batch: int = 1) -> None:
    async with await log.open_writer(SID) as writer:
        while writer.head.high_water < count:
            at = writer.head.high_water
            n = min(batch, count - at)
            await writer.append([make_draft("w", i) for i in range(at, at + n)], expected_offset=at)


async def test_compaction_keeps_every_byte_and_digest(tmp_path: Path) -> None:
    where = open_object_store(f"file://{tmp_path / 'o'}")
    store = ObjectLogStore(where.store, identity=where.identity)
    log = EventLog(store)
    await _seed(log, 12)
    before = await store.read_records(session_id=SID, start=0, end=None)
    ref = await store.compact(SID)
    assert ref is not None and (ref.first, ref.end) == (0, 12)
    assert await store.read_records(session_id=SID, start=0, end=None) == before
    assert await store.collect_garbage(SID, grace_s=3600) == 0  # within the grace period
    changed = await store.collect_garbage(SID, grace_s=0)
    assert changed >= 12
    assert await store.read_records(session_id=SID, start=0, end=None) == before
    assert (await log.verify(SID)).high_water == 12
    # the tombstoned keys still fence a stale writer at an old offset
    assert not await store._put(seg_key(SID, 5), b"stale", create=True)
    async with await log.open_writer(SID) as writer:
        await writer.append([make_draft("w", 12)], expected_offset=12)
    assert (await log.verify(SID)).high_water == 13
    await log.close()


class _CompactsMidRead(ObjectLogStore):
    """Runs compaction and garbage collection after a reader has listed the segments and
    before it fetches them: the interleaving where the reader meets tombstones."""

    armed = False

    async def _segment(self, session_id: str, key: str, first: int):  # type: ignore[no-untyped-def]
        if self.armed:
            self.armed = False
            other = ObjectLogStore(self.store, identity="compactor")
            await other.compact(session_id)
            await other.collect_garbage(session_id, grace_s=0)
        return await super()._segment(session_id, key, first)


async def test_reader_that_meets_a_compaction_rereads(tmp_path: Path) -> None:
    where = open_object_store(f"file://{tmp_path / 'o'}")
    store = _CompactsMidRead(where.store, identity=where.identity)
    log = EventLog(store)
    await _seed(log, 9, batch=2)
    expected = await log.read(SID)
    store.armed = True
    assert await log.read(SID) == expected
    assert not store.armed  # the compaction did run in the middle of that read
    await log.close()


async def test_compaction_racing_a_reader_and_a_writer_loses_nothing(url: str) -> None:
    where = open_object_store(url)
    writer_store = ObjectLogStore(where.store, identity=where.identity + "#w")
    log = EventLog(writer_store)
    total = 60
    stop = asyncio.Event()
    seen: list[int] = []
    sealed: list[object] = []

    async def write() -> None:
        await _seed(log, total, batch=3)
        stop.set()

    async def compact() -> None:
        compactor = ObjectLogStore(where.store, identity=where.identity + "#c")
        while not stop.is_set():
            ref = await compactor.compact(SID)
            if ref is not None:
                sealed.append(ref)
            await compactor.collect_garbage(SID, grace_s=0)
            await asyncio.sleep(0)

    async def read() -> None:
        reader = EventLog(ObjectLogStore(where.store, identity=where.identity + "#r"))
        while not stop.is_set():
            if await reader.exists(SID):
                seen.append((await reader.verify(SID)).high_water)
            await asyncio.sleep(0)

    async with asyncio.TaskGroup() as group:
        group.create_task(write())
        group.create_task(compact())
        group.create_task(read())
    assert sealed, "the compactor never merged anything while the writer wrote"
    assert seen == sorted(seen)  # every verified read saw a growing prefix
    events = await log.read(SID)
    assert [e.id for e in events] == [f"w-{n}" for n in range(total)]
    assert (await log.verify(SID)).high_water == total
    await log.close()


async def test_replaced_segment_fails_closed_with_its_offset(url: str) -> None:
    where = open_object_store(url)
    log = EventLog(ObjectLogStore(where.store, identity=where.identity))
    await _seed(log, 6, batch=2)
    # another session's segment for the same offsets, copied over this one
    other = "other"
    async with await log.open_writer(other) as writer:
        await writer.append([make_draft("x", 0), make_draft("x", 1)], expected_offset=0)
        await writer.append([make_draft("x", 2), make_draft("x", 3)], expected_offset=2)
    foreign = bytes(await (await obstore.get_async(where.store, seg_key(other, 2))).bytes_async())
    await obstore.put_async(where.store, seg_key(SID, 2), foreign)
    with pytest.raises(CorruptLogError) as info:
        await log.verify(SID)
    assert (info.value.session_id, info.value.offset) == (SID, 2)
    # deleted instead of replaced: a gap at the same offset
    await obstore.delete_async(where.store, seg_key(SID, 2))
    with pytest.raises(CorruptLogError) as info:
        await log.verify(SID)
    assert (info.value.session_id, info.value.offset, info.value.code) == (SID, 2, "gap")
    await log.close()


async def test_a_worker_with_a_cache_fetches_only_the_new_tail(url: str, tmp_path: Path) -> None:
    where = open_object_store(url)
    writer_store = ObjectLogStore(where.store, identity=where.identity + "#w")
    log = EventLog(writer_store)
    await _seed(log, 40, batch=4)
    await writer_store.compact(SID)
    worker = ObjectLogStore(where.store, identity=where.identity + "#r", cache_dir=tmp_path / "c")
    reader = EventLog(worker)
    assert (await reader.verify(SID)).high_water == 40
    cold = worker.stats.gets
    assert cold == 2  # the manifest and the one sealed segment
    async with await log.open_writer(SID) as writer:
        await writer.append([make_draft("w", 40), make_draft("w", 41)], expected_offset=40)
        await writer.append([make_draft("w", 42)], expected_offset=42)
    assert (await reader.verify(SID)).high_water == 43
    assert worker.stats.gets - cold == 2  # exactly the two new segments
    # the cached bytes are still checked: a damaged cached segment is a miss, fetched
    # again from the store (which is intact), never read as the session's events
    cached = next((tmp_path / "c").rglob("00000000000000000040"))
    cached.write_bytes(cached.read_bytes().replace(b"w says 40", b"w says 99"))
    fetched = worker.stats.gets
    assert (await reader.verify(SID)).high_water == 43
    assert worker.stats.gets - fetched == 1
    assert b"w says 40" in cached.read_bytes()
    # a cached copy altered with a matching checksum still meets the chain: fails closed
    altered = cached.read_bytes()[:-32].replace(b"w says 40", b"w says 99")
    cached.write_bytes(altered + hashlib.sha256(altered).digest())
    with pytest.raises(CorruptLogError) as info:
        await reader.verify(SID)
    assert (info.value.offset, info.value.code) == (40, "digest_mismatch")
    await log.close()
    await reader.close()


async def test_closing_one_handle_keeps_another_handles_writer(tmp_path: Path) -> None:
    where = open_object_store(f"file://{tmp_path / 'o'}")
    holder = EventLog(ObjectLogStore(where.store, identity=where.identity))
    other = EventLog(ObjectLogStore(where.store, identity=where.identity))
    writer = await holder.open_writer(SID)
    await other.close()
    with pytest.raises(SessionLockedError):
        await EventLog(ObjectLogStore(where.store, identity=where.identity)).open_writer(SID)
    await writer.close()
    await holder.close()


class _LostResponses(ObjectLogStore):
    """A real object log whose segment puts are each sent twice, as a client does when
    the first put was stored but its response was lost (a dropped connection, a 500
    after the write): the retry finds the object there, create-only refuses it."""

    async def _put(self, key: str, data: bytes, *, create: bool) -> bool:
        if "/seg/" in key:
            await super()._put(key, data, create=create)  # stored; the answer never came
        return await super()._put(key, data, create=create)


async def test_a_retried_put_of_the_same_bytes_is_the_writers_own_commit(url: str) -> None:
    """Broke: a retried create-only put answered 412 read as "another writer committed
    that offset first", so the writer was fenced by its own commit (and a T1 segment's
    never-retry call parked though its effect never ran). The object is now read back:
    the same bytes are this writer's commit; other bytes still fence."""
    where = open_object_store(url)
    # no lease objects: the late writer and its rival each believe they hold the session
    log = EventLog(_LostResponses(where.store, identity=where.identity, writer_lease=False))
    async with await log.open_writer(SID) as writer:
        await writer.append([make_draft("a", 0)], expected_offset=0)
        await writer.append([make_draft("a", 1), make_draft("a", 2)], expected_offset=1)
    assert [e.id for e in await log.read(SID)] == ["a-0", "a-1", "a-2"]
    assert (await log.verify(SID)).high_water == 3
    # another writer's bytes at the offset: still a fence, not a success
    other = EventLog(
        ObjectLogStore(where.store, identity=where.identity + "#2", writer_lease=False)
    )
    late = await log.open_writer(SID)
    async with await other.open_writer(SID) as rival:
        await rival.append([make_draft("b", 3)], expected_offset=3)
    with pytest.raises(WriterFencedError):
        await late.append([make_draft("a", 3)], expected_offset=3)
    await late.close()
    assert [e.id for e in await log.read(SID)][-1] == "b-3"
    await log.close()
    await other.close()

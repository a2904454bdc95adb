"""What an append costs on the object store, and what the cheaper head still proves.

One create-only segment put per append; the head is recorded at checkpoints (a session's
first append, a writer's release, ``checkpoint()``, a compaction) instead of after every
append. Concurrent facts are group-committed by the journal into one put. Compaction
runs on its own when a writer is released with enough segments piled up.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import obstore
import pytest

from lodger.engine.journal import Journal
from lodger.engine.settings import Services
from lodger.engine.state import SessionState
from lodger.errors import CommitFailedError, CorruptLogError, UsageError
from lodger.events import ProviderRetried, ToolDispatched
from lodger.ids import ManualClock, SequentialIds
from lodger.storage import EventLog
from lodger.storage._segments import seg_key, session_root
from lodger.storage.objectstore import ObjectLogStore, open_object_store

from ._object_writer import make_draft

SID = "s1"


class GatedStore(ObjectLogStore):
    """A real object log whose segment puts wait, while ``gate`` is closed, until the
    test opens it (so the test can line facts up behind an append in flight)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate: asyncio.Event | None = None
        self.waiting = asyncio.Event()
        self.segment_puts: list[str] = []

    async def _put(self, key: str, data: bytes, *, create: bool) -> bool:
        if "/seg/" in key:
            self.segment_puts.append(key)
            if self.gate is not None:
                self.waiting.set()
                await self.gate.wait()
        return await super()._put(key, data, create=create)


def _store(tmp_path: Path, cls: type[ObjectLogStore] = ObjectLogStore, **kw: Any) -> Any:
    where = open_object_store(f"file://{tmp_path / 'objects'}")
    return cls(where.store, identity=where.identity, local_root=where.local_root, **kw)


def _fact(n: int) -> ProviderRetried:
    return ProviderRetried(attempt=n, error=f"retry {n}", delay_ms=0)


async def _journal(log: EventLog) -> tuple[Journal, Any]:
    writer = await log.open_writer(SID)
    state = SessionState(SID, writer.initial_events)
    journal = Journal(writer, state, clock=ManualClock(tick_us=1), ids=SequentialIds("e"))
    return journal, writer


# ---------------------------------------------------------------- one put per append


async def test_an_append_is_one_put_and_the_head_is_recorded_at_release(tmp_path: Path) -> None:
    store = _store(tmp_path)
    log = EventLog(store)
    async with await log.open_writer(SID) as writer:
        for n in range(6):
            await writer.append([make_draft("w", n)], expected_offset=n)
        # the first append recorded a head; the other five cost their segment only
        assert store.stats.puts == 6 + 1
        assert await store.stored_head(session_id=SID) == (1, (await log.read(SID))[0].digest)
    head = await store.stored_head(session_id=SID)
    events = await log.read(SID)
    assert head == (6, events[-1].digest)  # released: the head covers every append
    assert store.stats.puts == 6 + 2
    await log.close()


async def test_head_per_append_is_the_strict_mode(tmp_path: Path) -> None:
    store = _store(tmp_path, head_per_append=True)
    log = EventLog(store)
    async with await log.open_writer(SID) as writer:
        for n in range(4):
            await writer.append([make_draft("w", n)], expected_offset=n)
            assert (await store.stored_head(session_id=SID) or (0, ""))[0] == n + 1
    assert store.stats.puts == 8  # nothing left to record at release
    await log.close()


async def test_a_tail_lost_after_the_release_fails_closed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    log = EventLog(store)
    async with await log.open_writer(SID) as writer:
        for n in range(5):
            await writer.append([make_draft("w", n)], expected_offset=n)
    # the two newest segments are deleted (a lifecycle rule, an operator, a bad restore)
    for n in (3, 4):
        await obstore.delete_async(store.store, seg_key(SID, n))
    with pytest.raises(CorruptLogError) as info:
        await EventLog(_store(tmp_path)).verify(SID)
    assert (info.value.session_id, info.value.offset, info.value.code) == (SID, 3, "truncated")
    await log.close()


async def test_checkpoint_narrows_the_window_of_a_long_open_writer(tmp_path: Path) -> None:
    store = _store(tmp_path)
    log = EventLog(store)
    writer = await log.open_writer(SID)
    for n in range(3):
        await writer.append([make_draft("w", n)], expected_offset=n)
    assert (await store.checkpoint(SID) or (0, ""))[0] == 3
    assert await store.checkpoint(SID) is None  # nothing new: no put
    await obstore.delete_async(store.store, seg_key(SID, 2))
    with pytest.raises(CorruptLogError) as info:
        await EventLog(_store(tmp_path)).verify(SID)
    assert (info.value.offset, info.value.code) == (2, "truncated")
    await writer.close()
    await log.close()


@pytest.mark.parametrize("strict", [False, True])
async def test_the_window_before_a_checkpoint_and_the_strict_mode_that_closes_it(
    tmp_path: Path, strict: bool
) -> None:
    # the documented trade-off: a writer dies mid-turn (no release, no checkpoint) and
    # its newest segment is deleted afterwards; only a head per append can tell
    store = _store(tmp_path, head_per_append=strict)
    log = EventLog(store)
    writer = await log.open_writer(SID)
    for n in range(4):
        await writer.append([make_draft("w", n)], expected_offset=n)
    await obstore.delete_async(store.store, seg_key(SID, 3))
    reader = EventLog(_store(tmp_path))
    if strict:
        with pytest.raises(CorruptLogError) as info:
            await reader.verify(SID)
        assert (info.value.offset, info.value.code) == (3, "truncated")
    else:
        assert (await reader.verify(SID)).high_water == 3  # not detected
    await reader.close()
    store.fail_put = lambda key: True  # the "dead" writer writes nothing more
    if strict:
        await writer.close()  # every head is already recorded: nothing to put
    else:
        with pytest.raises(CommitFailedError):
            await writer.close()
    await log.close()


async def test_a_failed_head_put_at_release_loses_nothing_and_frees_the_session(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    log = EventLog(store)
    writer = await log.open_writer(SID)
    for n in range(3):
        await writer.append([make_draft("w", n)], expected_offset=n)
    store.fail_put = lambda key: "/head/" in key
    with pytest.raises(CommitFailedError) as info:
        await writer.close()
    assert "could not record its head" in str(info.value)
    assert info.value.hint and "valid prefix" in info.value.hint
    store.fail_put = None
    # the head lags (offset 1), the events are all there, and the session is free again
    assert (await store.stored_head(session_id=SID) or (0, ""))[0] == 1
    async with await log.open_writer(SID) as again:
        assert again.head.high_water == 3
        await again.append([make_draft("w", 3)], expected_offset=3)
    assert (await log.verify(SID)).high_water == 4
    await log.close()


async def test_a_stale_writer_is_still_fenced_between_checkpoints(tmp_path: Path) -> None:
    from lodger.errors import WriterFencedError

    first = EventLog(_store(tmp_path))
    where = open_object_store(f"file://{tmp_path / 'objects'}")
    second = EventLog(ObjectLogStore(where.store, identity=where.identity + "#2"))
    stale = await first.open_writer(SID)
    await stale.append([make_draft("a", 0)], expected_offset=0)
    await stale.append([make_draft("a", 1)], expected_offset=1)
    # its lease object is lost (deleted, or judged lapsed on a skewed clock) while it
    # still believes it holds it: the segment keys alone must fence it
    for key in list(where.store.list(f"sessions/{SID}/lease/").collect()):
        where.store.delete(key["path"])
    # another process takes over (no head covers offset 1 yet) and appends at 2
    async with await second.open_writer(SID) as fresh:
        assert fresh.head.high_water == 2
        await fresh.append([make_draft("b", 2)], expected_offset=2)
    with pytest.raises(WriterFencedError) as info:
        await stale.append([make_draft("a", 2)], expected_offset=2)
    assert info.value.offset == 2
    await stale.close()  # its own head (2) lags the other writer's (3): still a prefix
    assert [e.id for e in await first.read(SID)] == ["a-0", "a-1", "b-2"]
    assert (await first.verify(SID)).high_water == 3
    await first.close()
    await second.close()


# ---------------------------------------------------------------- group commit


async def test_facts_recorded_while_an_append_is_in_flight_share_one_put(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path, GatedStore)
    log = EventLog(store)
    journal, writer = await _journal(log)
    await journal.fact(_fact(0))
    store.gate = asyncio.Event()
    leader = asyncio.create_task(journal.fact(_fact(1)))
    await store.waiting.wait()  # the leader's segment put is in flight
    followers = [asyncio.create_task(journal.fact(_fact(n))) for n in range(2, 7)]
    for _ in range(3):
        await asyncio.sleep(0)  # every follower is queued behind the lock
    puts_before = len(store.segment_puts)
    store.gate.set()
    first = await leader
    rest = await asyncio.gather(*followers)
    assert first.offset == 1
    # five facts, one segment put, each caller its own event, in arrival order
    assert len(store.segment_puts) == puts_before + 1
    assert [e.offset for e in rest] == [2, 3, 4, 5, 6]
    assert [e.body.attempt for e in rest] == [2, 3, 4, 5, 6]  # type: ignore[union-attr]
    assert (journal.commits, journal.records) == (3, 7)
    await writer.close()
    assert (await log.verify(SID)).high_water == 7
    await log.close()


async def test_a_group_whose_put_fails_fails_every_caller_and_stops_the_journal(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path, GatedStore)
    log = EventLog(store)
    journal, writer = await _journal(log)
    await journal.fact(_fact(0))
    store.gate = asyncio.Event()
    leader = asyncio.create_task(journal.fact(_fact(1)))
    await store.waiting.wait()
    followers = [asyncio.create_task(journal.fact(_fact(n))) for n in (2, 3)]
    for _ in range(3):
        await asyncio.sleep(0)
    store.fail_put = lambda key: key == seg_key(SID, 2)
    store.gate.set()
    assert (await leader).offset == 1
    outcomes = await asyncio.gather(*followers, return_exceptions=True)
    assert all(isinstance(o, CommitFailedError) for o in outcomes), outcomes
    store.fail_put = None
    with pytest.raises(CommitFailedError, match="stopped after a failed commit"):
        await journal.fact(_fact(4))
    await writer.close()
    assert (await log.verify(SID)).high_water == 2  # nothing of the failed group
    await log.close()


async def test_one_unsealable_fact_does_not_fail_the_rest_of_its_group(tmp_path: Path) -> None:
    store = _store(tmp_path, GatedStore)
    log = EventLog(store)
    journal, writer = await _journal(log)
    await journal.fact(_fact(0))
    store.gate = asyncio.Event()
    leader = asyncio.create_task(journal.fact(_fact(1)))
    await store.waiting.wait()
    nan = ToolDispatched(operation_id="o", tool="t", arguments={"x": float("nan")})
    good = asyncio.create_task(journal.fact(_fact(2)))
    bad = asyncio.create_task(journal.fact(nan))
    later = asyncio.create_task(journal.fact(_fact(3)))
    for _ in range(3):
        await asyncio.sleep(0)
    store.gate.set()
    await leader
    with pytest.raises(UsageError) as info:
        await bad
    assert info.value.code == "unencodable_event"
    assert [(await good).offset, (await later).offset] == [2, 3]
    assert journal.failure is None
    await writer.close()
    assert (await log.verify(SID)).high_water == 4
    await log.close()


async def test_cancelled_callers_either_wrote_nothing_or_wait_for_the_outcome(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path, GatedStore)
    log = EventLog(store)
    journal, writer = await _journal(log)
    await journal.fact(_fact(0))
    store.gate = asyncio.Event()
    in_flight_draft = journal.draft(_fact(1))
    leader = asyncio.create_task(journal.record(in_flight_draft))
    await store.waiting.wait()
    queued_draft = journal.draft(_fact(2))
    queued = asyncio.create_task(journal.record(queued_draft))
    await asyncio.sleep(0)
    # cancelled while queued: its fact is never written
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    # cancelled while its own append is in flight: it returns only once the append
    # settled, and the fact is then known to be committed
    leader.cancel()
    await asyncio.sleep(0)
    assert not leader.done()
    store.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert journal.committed(in_flight_draft)
    assert not journal.committed(queued_draft)
    await journal.fact(_fact(3))
    await writer.close()
    events = await log.read(SID)
    assert [e.body.attempt for e in events] == [0, 1, 3]  # type: ignore[union-attr]
    await log.close()


# ---------------------------------------------------------------- automatic compaction


async def test_a_release_with_enough_segments_compacts_and_readers_keep_working(
    tmp_path: Path,
) -> None:
    clock = [10**15]
    store = _store(tmp_path, compact_after=4, grace_s=60, clock_us=lambda: clock[0])
    log = EventLog(store)
    reader_store = _store(tmp_path)
    reader = EventLog(reader_store)

    async def turn(first: int, count: int) -> None:
        async with await log.open_writer(SID) as writer:
            for n in range(first, first + count):
                await writer.append([make_draft("w", n)], expected_offset=n)

    await turn(0, 3)
    assert store.stats.compactions == 0  # three segments: below the threshold
    await turn(3, 2)
    assert store.stats.compactions == 1
    manifest = await store.manifest(SID)
    assert manifest is not None and [(s.first, s.end) for s in manifest.sealed] == [(0, 5)]
    assert manifest.head is not None and manifest.head[0] == 5
    # within the grace period the merged segments stay readable: a reader that listed
    # them before the compaction still reads them
    for n in range(5):
        blob = await (await obstore.get_async(store.store, seg_key(SID, n))).bytes_async()
        assert bytes(blob).startswith(b"LSEG1")
    assert (await reader.verify(SID)).high_water == 5
    await turn(5, 4)
    assert store.stats.compactions == 2  # the first compaction's objects are not yet due
    for n in range(5):
        blob = await (await obstore.get_async(store.store, seg_key(SID, n))).bytes_async()
        assert bytes(blob).startswith(b"LSEG1")
    clock[0] += 61 * 10**6  # past the grace period
    await turn(9, 4)
    assert store.stats.compactions == 3
    tombstoned = 0
    for n in range(9):
        blob = bytes(await (await obstore.get_async(store.store, seg_key(SID, n))).bytes_async())
        tombstoned += blob.startswith(b"LTOMB1")
    assert tombstoned == 9  # the first two compactions' segments, after their grace
    events = await reader.read(SID)
    assert [e.id for e in events] == [f"w-{n}" for n in range(13)]
    assert (await reader.verify(SID)).high_water == 13
    await log.close()
    await reader.close()


async def test_compaction_racing_a_reader_through_releases_loses_nothing(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path, compact_after=3, grace_s=0)
    log = EventLog(store)
    reader = EventLog(_store(tmp_path))
    seen: list[int] = []
    done = asyncio.Event()

    async def write() -> None:
        at = 0
        for _ in range(8):
            async with await log.open_writer(SID) as writer:
                for _ in range(3):
                    await writer.append([make_draft("w", at)], expected_offset=at)
                    at += 1
        done.set()

    async def read() -> None:
        while not done.is_set():
            if await reader.exists(SID):
                seen.append((await reader.verify(SID)).high_water)
            await asyncio.sleep(0)

    async with asyncio.TaskGroup() as group:
        group.create_task(write())
        group.create_task(read())
    assert store.stats.compactions >= 4
    assert seen and seen == sorted(seen)
    assert [e.id for e in await reader.read(SID)] == [f"w-{n}" for n in range(24)]
    await log.close()
    await reader.close()


class LateHeadsStore(ObjectLogStore):
    """A real object log whose first listing of head objects comes back empty, as it
    does for a reader that listed them just before the writer put the first head."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hidden_listings = 1

    async def _list(self, prefix: str) -> list[str]:
        keys = await super()._list(prefix)
        if prefix.endswith("/head/") and self.hidden_listings:
            self.hidden_listings -= 1
            return []
        return keys


async def test_a_reader_that_listed_heads_before_the_first_head_was_put_reads_on(
    tmp_path: Path,
) -> None:
    log = EventLog(_store(tmp_path))
    reader = _store(tmp_path, LateHeadsStore)
    async with await log.open_writer(SID) as writer:
        for n in range(2):
            await writer.append([make_draft("w", n)], expected_offset=n)
    head = await reader.stored_head(session_id=SID)
    assert reader.hidden_listings == 0 and head is not None and head[0] >= 1
    # a head really gone still fails closed, with the offset
    for key in await reader._list(f"{session_root(SID)}head/"):
        await reader._delete(key)
    with pytest.raises(CorruptLogError, match="head record object is missing") as failed:
        await reader.stored_head(session_id=SID)
    assert failed.value.offset == 2
    await log.close()


async def test_a_failed_compaction_on_release_keeps_the_turn_and_retries_later(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path, compact_after=2)
    log = EventLog(store)
    store.fail_put = lambda key: "/sealed/" in key
    async with await log.open_writer(SID) as writer:
        for n in range(3):
            await writer.append([make_draft("w", n)], expected_offset=n)
    assert (store.stats.compactions, store.stats.compaction_failures) == (0, 1)
    assert store.last_compaction_error is not None
    store.fail_put = None
    async with await log.open_writer(SID) as writer:
        await writer.append([make_draft("w", 3)], expected_offset=3)
    assert store.stats.compactions == 1
    assert (await log.verify(SID)).high_water == 4
    await log.close()


def test_compact_after_must_leave_something_to_merge(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        _store(tmp_path, compact_after=1)


async def test_session_root_holds_only_the_expected_objects(tmp_path: Path) -> None:
    # per session: the segments, two heads (first append, release) and nothing else
    store = _store(tmp_path)
    log = EventLog(store)
    async with await log.open_writer(SID) as writer:
        for n in range(4):
            await writer.append([make_draft("w", n)], expected_offset=n)
    keys = [str(m["path"]) for chunk in obstore.list(store.store, session_root(SID)) for m in chunk]
    kinds = sorted(k.split("/")[2] for k in keys)
    assert kinds == ["head", "head", "seg", "seg", "seg", "seg"]
    await log.close()


async def test_an_agent_turn_end_compacts_and_the_next_turn_reads_on(tmp_path: Path) -> None:
    from lodger import Agent, ScriptedModel, tool
    from lodger.storage import Storage

    @tool
    async def ping(n: int) -> str:
        """Answer pong."""
        return f"pong {n}"

    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    store = storage.log.store
    assert isinstance(store, ObjectLogStore)
    assert store.compact_after == 64  # the default every object-store session gets
    store.compact_after = 4
    script = [{"calls": [{"name": "ping", "args": {"n": n}}]} for n in range(3)]
    agent = Agent(
        model=ScriptedModel([*script, {"text": "done"}]),
        tools=[ping],
        storage=storage,
        services=Services(ids=SequentialIds("a"), clock=ManualClock(tick_us=1)),
    )
    first = await agent.run("go", session=SID)
    assert first.status == "completed"
    assert store.stats.compactions == 1  # at the turn's end (the writer's release)
    manifest = await store.manifest(SID)
    high_water = (await storage.log.verify(SID)).high_water
    assert manifest is not None and manifest.sealed_end == high_water
    second = await agent.run("again", session=SID)  # the agent's cached fold reads on
    assert second.status == "completed"
    assert store.stats.compactions == 2
    fresh = EventLog(_store(tmp_path))
    assert [e.id for e in await fresh.read(SID)] == [e.id for e in await storage.log.read(SID)]
    await fresh.close()
    await storage.close()

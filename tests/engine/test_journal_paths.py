"""The journal's two write paths keep one contract, over a real SQLite log.

A ``record`` that finds nobody writing or waiting is written at once, alone (no ticket);
records that arrive while an append is in flight are group-committed by the next leader.
Each test drives ``Journal`` directly and forces the interleaving with events: a failed
commit stops the journal, a cancelled caller whose append completed still leaves memory
in step with the log, a refused draft fails only its caller, queued records are grouped.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from lodger.engine.envelope import Envelope
from lodger.engine.journal import Journal
from lodger.engine.state import SessionState
from lodger.errors import CommitFailedError, UsageError
from lodger.events import RunEnded, ToolDispatched, TurnStarted
from lodger.ids import ManualClock, SequentialIds
from lodger.storage import EventLog, SqliteLogStore
from lodger.storage.logstore import LogStore, Record
from lodger.testing import FaultyLogStore

ENV = Envelope(turn_id="t", run_id="r")


class Gate(FaultyLogStore):
    """Holds every append whose records contain ``marker`` until released."""

    def __init__(self, inner: LogStore, marker: bytes) -> None:
        super().__init__(inner)
        self.marker = marker
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.batches: list[int] = []

    async def append_records(
        self, *, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        if any(self.marker in r.data for r in records):
            self.entered.set()
            await self.release.wait()
        await super().append_records(
            session_id=session_id, records=records, expected_offset=expected_offset
        )
        self.batches.append(len(records))


async def open_journal(store: LogStore) -> tuple[EventLog, Journal]:
    log = EventLog(store)
    writer = await log.open_writer("s")
    journal = Journal(
        writer, SessionState("s"), clock=ManualClock(tick_us=1), ids=SequentialIds("e")
    )
    return log, journal


async def stored(log: EventLog) -> list[str]:
    return [e.kind for e in await log.read_all("s")]


async def test_a_lone_record_that_fails_stops_the_journal(tmp_path: Path) -> None:
    store = FaultyLogStore(SqliteLogStore(tmp_path), fail_appends={2})
    log, journal = await open_journal(store)
    await journal.fact(TurnStarted(input="go"), ENV)
    with pytest.raises(CommitFailedError) as first:
        await journal.fact(RunEnded(status="completed"), ENV)
    assert journal.failure is first.value
    with pytest.raises(CommitFailedError, match="stopped after a failed commit") as then:
        await journal.fact(RunEnded(status="completed"), ENV)
    assert then.value.__cause__ is first.value
    assert store.appends == 2  # the stopped journal never reached the store again
    assert await stored(log) == ["turn_started"]
    assert [e.kind for e in journal.events] == ["turn_started"]
    await log.close()


async def test_a_cancelled_caller_whose_append_completed_leaves_memory_in_step(
    tmp_path: Path,
) -> None:
    store = Gate(SqliteLogStore(tmp_path), b'"kind":"run_ended"')
    log, journal = await open_journal(store)
    await journal.fact(TurnStarted(input="go"), ENV)
    caller = asyncio.create_task(journal.fact(RunEnded(status="completed"), ENV))
    async with asyncio.timeout(5):
        await store.entered.wait()
    caller.cancel()
    await asyncio.sleep(0.01)
    assert not caller.done()  # it waits for the append it started
    store.release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert journal.failure is None
    assert [e.kind for e in journal.events] == await stored(log) == ["turn_started", "run_ended"]
    await journal.fact(TurnStarted(input="again"), ENV)  # the next offset is right
    assert len(await stored(log)) == 3
    await log.close()


async def test_a_refused_draft_fails_its_caller_only(tmp_path: Path) -> None:
    log, journal = await open_journal(SqliteLogStore(tmp_path))
    await journal.fact(TurnStarted(input="go"), ENV)
    body = ToolDispatched(operation_id="o", tool="t", arguments={})
    nan = ToolDispatched.model_construct(**{**body.__dict__, "arguments": {"x": math.nan}})
    with pytest.raises(UsageError) as info:
        await journal.fact(nan, ENV)
    assert info.value.code == "unencodable_event"
    assert journal.failure is None
    await journal.fact(RunEnded(status="completed"), ENV)
    assert await stored(log) == ["turn_started", "run_ended"]
    await log.close()


async def test_records_that_arrive_during_a_lone_append_are_grouped(tmp_path: Path) -> None:
    store = Gate(SqliteLogStore(tmp_path), b'"input":"first"')
    log, journal = await open_journal(store)
    first = asyncio.create_task(journal.fact(TurnStarted(input="first"), ENV))
    async with asyncio.timeout(5):
        await store.entered.wait()
    later = [
        asyncio.create_task(journal.fact(TurnStarted(input=f"later {i}"), ENV)) for i in range(3)
    ]
    await asyncio.sleep(0.01)
    assert not any(t.done() for t in later)  # queued behind the append in flight
    store.release.set()
    async with asyncio.timeout(5):
        results = await asyncio.gather(first, *later)
    assert [r.offset for r in results] == [0, 1, 2, 3]
    assert store.batches == [1, 3]  # the three queued records went as one append
    assert (journal.commits, journal.records) == (2, 4)
    assert [e.body.input for e in await log.read_all("s")] == [  # type: ignore[union-attr]
        "first",
        "later 0",
        "later 1",
        "later 2",
    ]
    await log.close()


async def test_deferred_facts_go_with_the_next_lone_record(tmp_path: Path) -> None:
    log, journal = await open_journal(SqliteLogStore(tmp_path))
    journal.defer(journal.draft(TurnStarted(input="go"), ENV))
    events = await journal.record(journal.draft(RunEnded(status="completed"), ENV))
    assert [e.kind for e in events] == ["run_ended"]  # the caller gets its own facts
    assert [e.kind for e in journal.events] == await stored(log) == ["turn_started", "run_ended"]
    assert journal.commits == 1
    await log.close()

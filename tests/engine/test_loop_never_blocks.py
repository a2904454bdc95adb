"""Nothing blocks the event loop: every callback of a whole turn is timed, and one that
holds the loop longer than ``SLOW_S`` fails the test.

A callback's wall time on a loaded machine includes the time the scheduler kept the loop's
thread waiting for a CPU (another process ran); that is not blocking, so it is taken out:
the kernel counts it per thread (``run_delay`` in ``/proc/thread-self/schedstat``). What
remains is time the callback computed or waited in a blocking call (a sleep, an fsync, a
disk read), which is what must never happen on the loop."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lodger.cli._run import DEMO_FILES, DEMO_SCRIPT
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.agent import Agent
from lodger.runtime.builtin import workspace_tools
from lodger.storage import EventLog, MemoryArtifactStore, SqliteLogStore, Storage
from lodger.tools.policy import PermissionPolicy

SLOW_S = 0.05
SCHEDSTAT = Path("/proc/thread-self/schedstat")


def _waited_for_cpu() -> float:
    """Seconds this thread has spent runnable but not running (0 without schedstat)."""
    try:
        return int(SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


@pytest.fixture
def slow_callbacks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Time every callback the loop runs; the slow ones are added to the list."""
    slow: list[str] = []
    real_run = asyncio.events.Handle._run

    def timed(handle: asyncio.events.Handle) -> None:
        waited = _waited_for_cpu()
        start = time.perf_counter()
        try:
            real_run(handle)
        finally:
            held = time.perf_counter() - start - (_waited_for_cpu() - waited)
            if held > SLOW_S:
                slow.append(f"{handle!r} held the loop {held:.3f} s")

    monkeypatch.setattr(asyncio.events.Handle, "_run", timed)
    return slow  # the heap earlier tests left is frozen by the autouse fixture below


def test_the_scheduler_delay_is_counted() -> None:
    assert SCHEDSTAT.exists(), "this kernel does not report schedstat; the test below needs it"
    assert _waited_for_cpu() >= 0


@pytest.fixture(autouse=True)
def _earlier_tests_heap_frozen() -> Iterator[None]:
    """In a whole-suite run the process holds everything earlier tests left alive, and one
    full cycle collection over that heap can hold a callback past ``SLOW_S`` (seen in
    full-suite runs on a loaded 2-core machine, never alone). These tests measure what
    lodger does on the loop, so the earlier heap is frozen out of collections meanwhile;
    what the turn itself allocates is still collected as usual."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def test_a_turn_with_file_tools_never_blocks_the_loop(
    tmp_path: Path, slow_callbacks: list[str]
) -> None:
    workspace = tmp_path / "ws"
    for rel, content in DEMO_FILES.items():
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_text(content * 2000)  # big enough for real file I/O

    async def turn() -> str:
        agent = Agent(
            model=ScriptedModel(DEMO_SCRIPT),
            tools=workspace_tools(),
            storage=Storage(
                log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
            ),
            workspace=workspace,
            permissions=PermissionPolicy(approve_all=True),
        )
        try:
            return (await agent.run("move the port", session="s1")).status
        finally:
            await agent.close()

    status = asyncio.run(turn())
    assert status == "completed"
    assert slow_callbacks == [], slow_callbacks


def test_the_detector_catches_a_blocking_tool(tmp_path: Path, slow_callbacks: list[str]) -> None:
    import time

    from lodger.tools import tool

    @tool
    async def blocks() -> str:
        """A badly written async tool that sleeps on the loop."""
        time.sleep(SLOW_S * 2)  # noqa: ASYNC251 - the point of this test
        return "done"

    async def turn() -> None:
        agent = Agent(
            model=ScriptedModel([{"calls": [{"name": "blocks"}]}, {"text": "ok"}]),
            tools=[blocks],
            storage=Storage(
                log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
            ),
        )
        try:
            await agent.run("go", session="s1")
        finally:
            await agent.close()

    asyncio.run(turn())
    assert any("held the loop" in line for line in slow_callbacks), slow_callbacks


def test_opening_a_long_session_keeps_the_loop_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verifying 20k events is CPU work: it must happen off the loop's thread. Checked by
    where the decoding runs (a spy around the real decoder), not by wall-clock bounds that
    a loaded machine breaks; and, coarsely, no stretch without a loop turn may take half
    of the open."""
    import threading

    from lodger.events import EventDraft, TurnStarted
    from lodger.storage import eventlog

    decoded_on: list[tuple[int, bool]] = []
    real_decode = eventlog.decode_records

    def spy(session_id: str, records: Any, **kw: Any) -> Any:
        decoded_on.append((len(records), threading.current_thread() is threading.main_thread()))
        return real_decode(session_id, records, **kw)

    monkeypatch.setattr(eventlog, "decode_records", spy)

    async def build_and_open() -> tuple[int, float, float]:
        log = EventLog(SqliteLogStore(tmp_path / "state"))
        writer = await log.open_writer("long")
        drafts = [
            EventDraft(id=f"e{i}", ts=i, body=TurnStarted(input="x" * 200)) for i in range(20_000)
        ]
        for i in range(0, len(drafts), 2_000):
            await writer.append(drafts[i : i + 2_000], expected_offset=i)
        await writer.close()
        stamps: list[float] = []
        opened = False

        async def ticker() -> None:
            while not opened:
                stamps.append(time.perf_counter())
                await asyncio.sleep(0)

        async with asyncio.TaskGroup() as group:
            group.create_task(ticker())
            await asyncio.sleep(0)
            decoded_on.clear()
            start = time.perf_counter()
            reopened = await log.open_writer("long")  # verifies all 20k events
            total = time.perf_counter() - start
            opened = True
        high_water = reopened.head.high_water
        await reopened.close()
        await log.close()
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        return high_water, max(gaps), total

    high_water, longest, total = asyncio.run(build_and_open())
    assert high_water == 20_000
    assert sum(n for n, _ in decoded_on) >= 20_000  # the whole log was decoded ...
    assert all(not on_loop for n, on_loop in decoded_on if n >= 1_000), decoded_on  # ... off it
    assert longest < total / 2, (longest, total)

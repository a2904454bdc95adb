"""SessionState: the incremental fold equals folding the whole log at once."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lodger.engine.settings import Limits, Services
from lodger.engine.state import SessionState
from lodger.errors import CommitFailedError
from lodger.events import Event, RunStarted
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.scripted import ScriptedModel
from lodger.recovery import plan_recovery
from lodger.runtime.agent import Agent
from lodger.runtime.builtin import workspace_tools
from lodger.storage import EventLog, MemoryArtifactStore, MemoryLogStore, Storage
from lodger.storage.logstore import Record
from lodger.testing import FaultyLogStore
from lodger.tools import tool


@tool(recovery="idempotent")
def lookup(key: str) -> str:
    """Look up a key."""
    return key.upper()


@tool(deferred=True, group="extra")
def extra(n: int) -> int:
    """An extra tool found through tool_search."""
    return n + 1


SCRIPT = [
    {"text": "start", "calls": [{"name": "lookup", "args": {"key": "a"}}]},
    {"calls": [{"name": "tool_search", "args": {"query": "select:extra"}}]},
    {"calls": [{"name": "extra", "args": {"n": 1}}, {"name": "nope", "args": {}}]},
    {"text": "done"},
    {"calls": [{"name": "lookup", "args": {"key": "b"}}]},
    {"text": "second turn done"},
    {"calls": [{"name": "write_file", "args": {"path": "f.txt", "content": "x"}}]},
    {"text": "third turn done"},
]
TURNS = [SCRIPT[:4], SCRIPT[4:6], SCRIPT[6:]]  # each turn plays its own script
WRITE = [t for t in workspace_tools() if t.name == "write_file"]


def _first_t2(records: Sequence[Record]) -> bool:
    return any(b'"kind":"tool_responded"' in r.data for r in records)


def _log() -> tuple[list[Event], tuple[str, str]]:
    """Two turns in one workspace, a third interrupted before its T2 and resumed in a
    copy of the workspace (a relocation); returns the log and the two workspaces."""

    async def build(root: Path) -> list[Event]:
        store = MemoryLogStore()
        clock, ids = ManualClock(tick_us=3), SequentialIds("x")

        def agent(log_store: object, workspace: Path) -> Agent:
            return Agent(
                model=ScriptedModel(turns=TURNS),
                tools=[lookup, extra, *WRITE],
                storage=Storage(log=EventLog(log_store), artifacts=MemoryArtifactStore()),
                workspace=workspace,
                services=Services(clock=clock, ids=ids),
            )

        (root / "ws").mkdir()
        first = agent(store, root / "ws")
        await first.run("first", session="s1")
        await first.run("second", session="s1")
        crashing = agent(FaultyLogStore(store, fail_when=_first_t2), root / "ws")
        with pytest.raises(CommitFailedError):
            await crashing.run("third", session="s1")
        shutil.copytree(root / "ws", root / "moved")
        moved = agent(store, root / "moved")
        await moved.resume("s1", relocate=True)
        return await moved.session("s1").events()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        return asyncio.run(build(root)), (str(root / "ws"), str(root / "moved"))


LOG, (WS, MOVED) = _log()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=0, max_value=len(LOG)),
    st.lists(st.integers(min_value=0, max_value=len(LOG)), max_size=6),
)
def test_incremental_fold_equals_the_whole_fold(n: int, cuts: list[int]) -> None:
    prefix = LOG[:n]
    whole = SessionState("s1", prefix)
    incremental = SessionState("s1")
    start = 0
    for cut in sorted({c for c in cuts if c <= n} | {n}):
        incremental.feed(prefix[start:cut])
        start = cut
    assert incremental.snapshot() == whole.snapshot()
    # the plan from the fold is the plan recovery computes from the log alone
    if prefix:
        assert whole.plan() == plan_recovery(prefix)


def test_the_fold_tracks_turns_steps_and_activations() -> None:
    state = SessionState("s1", LOG)
    assert state.turns == 3 and state.open_turn is None
    assert state.last_turn_status == "completed"
    assert state.used_tools() == ["extra", "lookup", "tool_search", "write_file"]
    first_turn = [e for e in LOG if e.turn_id == LOG[1].turn_id]
    mid = SessionState("s1", LOG[: first_turn[-1].offset])  # before the first turn ended
    assert mid.open_turn == LOG[1].turn_id
    assert mid.turn_activated == ["extra"] and mid.turn_steps == 4


def test_the_fold_takes_the_workspace_from_the_latest_relocation() -> None:
    relocated = next(
        e for e in LOG if isinstance(e.body, RunStarted) and e.body.workspace is not None
    )
    assert isinstance(relocated.body, RunStarted)
    assert relocated.body.resumed_from is not None and relocated.body.workspace == MOVED
    before = SessionState("s1", LOG[: relocated.offset])
    after = SessionState("s1", LOG[: relocated.offset + 1])
    assert before.workspace == WS and after.workspace == MOVED
    assert after.workspace_id == relocated.body.workspace_id != before.workspace_id
    assert SessionState("s1", LOG).workspace == MOVED


def test_a_gap_in_what_is_fed_is_refused() -> None:
    state = SessionState("s1", LOG[:3])
    with pytest.raises(ValueError, match="expected offset 3"):
        state.feed(LOG[4:5])


@pytest.mark.slow
def test_folding_a_long_log_runs_no_cycle_collection() -> None:
    """A fold of thousands of events keeps the cycle collector paused (each automatic
    collection would rescan every event already folded: measured on 100k events, most of
    the fold's time), and turns it back on afterwards."""
    import gc

    from lodger import FunctionModel
    from lodger.events import ProposedCall
    from lodger.providers.base import ModelRequest, ModelResponse

    left = [800]

    def step(request: ModelRequest) -> ModelResponse:
        if left[0] == 0:
            return ModelResponse(text="done")
        left[0] -= 1
        return ModelResponse(
            calls=(ProposedCall(call_id="", name="lookup", arguments='{"key": "k"}'),)
        )

    log = EventLog(MemoryLogStore())

    async def build() -> list[Event]:
        agent = Agent(
            model=FunctionModel(step),
            tools=[lookup],
            storage=Storage(log=log, artifacts=MemoryArtifactStore()),
            limits=Limits(max_steps=1_000),
        )
        result = await agent.run("many calls", session="s")
        assert result.status == "completed"
        return await log.read_all("s")

    events = asyncio.run(build())
    assert len(events) > 3_000
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        state = SessionState("s", events)
    finally:
        gc.callbacks.remove(count)
    assert len(collections) <= 1, collections  # at most the one due when it resumes
    assert gc.isenabled()
    assert state.turns == 1
    assert len(state.calls) == 800


def test_a_dropped_fold_is_freed_without_the_cycle_collector() -> None:
    """A service drops folds it no longer caches: with no reference cycle inside, the
    fold and the events only it holds go at once, not at the next full collection (which
    can be far off when a long log's events were moved to the oldest generation)."""
    import gc
    import weakref

    events = [e.model_copy() for e in LOG]  # held by the fold alone once the list goes
    state = SessionState("s1", events)
    assert state.plan().prefix.high_water == len(LOG)  # the classifier was used
    fold, first_event = weakref.ref(state), weakref.ref(events[0])
    was = gc.isenabled()
    gc.disable()
    try:
        del state, events
        assert fold() is None
        assert first_event() is None
    finally:
        if was:
            gc.enable()

"""SessionState: the incremental fold equals folding the whole log at once."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lodger.agent import Agent
from lodger.engine.state import SessionState
from lodger.events import Event
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.scripted import ScriptedModel
from lodger.recovery import plan_recovery
from lodger.storage import EventLog, MemoryArtifactStore, MemoryLogStore
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
]


def _log() -> list[Event]:
    async def build() -> list[Event]:
        agent = Agent(
            model=ScriptedModel(SCRIPT),
            tools=[lookup, extra],
            log=EventLog(MemoryLogStore()),
            artifacts=MemoryArtifactStore(),
            clock=ManualClock(tick_us=3),
            ids=SequentialIds("x"),
        )
        await agent.run("first", session="s1")
        await agent.run("second", session="s1")
        return await agent.session("s1").events()

    return asyncio.run(build())


LOG = _log()


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
    assert state.turns == 2 and state.open_turn is None
    assert state.last_turn_status == "completed"
    assert state.used_tools() == ["extra", "lookup", "tool_search"]
    first_turn = [e for e in LOG if e.turn_id == LOG[1].turn_id]
    mid = SessionState("s1", LOG[: first_turn[-1].offset])  # before the first turn ended
    assert mid.open_turn == LOG[1].turn_id
    assert mid.turn_activated == ["extra"] and mid.turn_steps == 4


def test_a_gap_in_what_is_fed_is_refused() -> None:
    state = SessionState("s1", LOG[:3])
    with pytest.raises(ValueError, match="expected offset 3"):
        state.feed(LOG[4:5])

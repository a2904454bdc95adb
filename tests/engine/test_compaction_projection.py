"""Property tests of the compacted projection over a real compacted session (several
compactions, two turns): folding one event at a time equals projecting the prefix at
once, a fork's inherited prefix projects as the whole lineage, a checkpoint's fold
projects as the live one, and every prefix keeps calls whole."""

from __future__ import annotations

import asyncio
import json
import zlib

from compaction_world import World, agent, policy
from hypothesis import given, settings
from hypothesis import strategies as st

from lodger.context import Projector, project_messages
from lodger.events import Compacted, CompactionFailed, Event
from lodger.providers.base import AssistantMessage, Message, ToolResultMessage
from lodger.storage import EventLog, MemoryLogStore, Storage
from lodger.testing import MemoryArtifactStore


def _session() -> list[Event]:
    async def build() -> list[Event]:
        world = World(steps=14)
        storage = Storage(log=EventLog(MemoryLogStore()), artifacts=MemoryArtifactStore())
        async with agent(storage, world, policy(threshold_tokens=5000, budget_tokens=7000)) as a:
            await a.run("read the pages", session="s")
            world.summarizer = "bad"  # the second turn's first attempt fails: elision
            world.steps = 20
            await a.run("read on", session="s")
            return await a.log.read_all("s")

    return asyncio.run(build())


EVENTS = _session()
BUDGETS = st.sampled_from([None, 300, 3000, 7000])


def test_the_session_holds_compactions_and_a_failure() -> None:
    assert sum(isinstance(e.body, Compacted) for e in EVENTS) >= 3
    assert any(isinstance(e.body, CompactionFailed) for e in EVENTS)


def _calls_whole(messages: object) -> bool:
    proposed: set[str] = set()
    answered: set[str] = set()
    for m in messages:  # type: ignore[attr-defined]
        if isinstance(m, AssistantMessage):
            proposed.update(c.call_id for c in m.calls)
        elif isinstance(m, ToolResultMessage):
            if m.call_id not in proposed:
                return False
            answered.add(m.call_id)
    return proposed == answered


@settings(max_examples=80, deadline=None)
@given(st.integers(min_value=0, max_value=len(EVENTS)), BUDGETS)
def test_incremental_equals_full_and_calls_stay_whole(n: int, budget: int | None) -> None:
    growing: list[Event] = []
    projector = Projector(growing)
    for event in EVENTS[:n]:
        growing.append(event)
        projector.project(budget_tokens=budget)
    full = project_messages(EVENTS[:n], budget_tokens=budget)
    assert projector.project(budget_tokens=budget) == full
    assert _calls_whole(full.messages)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=0, max_value=len(EVENTS)),
    st.integers(min_value=0, max_value=len(EVENTS)),
    BUDGETS,
)
def test_an_inherited_prefix_projects_as_the_whole_lineage(
    cut: int, n: int, budget: int | None
) -> None:
    prefix, own = EVENTS[:cut], EVENTS[cut : max(cut, n)]
    growing: list[Event] = []
    projector = Projector(growing, prefix=prefix)
    for event in own:
        growing.append(event)
        projector.project(budget_tokens=budget)
    assert projector.project(budget_tokens=budget) == project_messages(
        [*prefix, *own], budget_tokens=budget
    )


def _chunks(plain: list[list[object]], chunk: int) -> list[bytes]:
    return [
        zlib.compress(json.dumps(plain[i : i + chunk]).encode())
        for i in range(0, len(plain), chunk)
    ]


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=1, max_value=len(EVENTS)), st.integers(min_value=0, max_value=60))
def test_an_exported_fold_restores_and_projects_on(n: int, more: int) -> None:
    """A checkpoint's projector (``export``/``restore``) at ``n`` events, fed ``more``."""
    first = Projector(EVENTS[:n])
    data = first.export()
    assert data is not None
    names = {
        c.call_id: c.name for e in EVENTS[:n] if hasattr(e.body, "calls") for c in e.body.calls
    }
    events = list(EVENTS[:n])
    restored = Projector.restore(
        events,
        json.loads(json.dumps(data)),
        names=names,
        closed=_chunks(first.closed_plain(), 8),
        chunk=8,
        session_id="s",
    )
    events.extend(EVENTS[n : n + more])  # the log grew after the checkpoint
    expected: tuple[Message, ...] = tuple(project_messages(events).messages)
    assert tuple(restored.project().messages) == expected

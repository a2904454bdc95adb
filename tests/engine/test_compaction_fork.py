"""A fork at a prefix before or after a compaction projects exactly what the original
projected at that prefix (the compaction is a fact of the shared history, read through
the fork's inherited events), and a fork's own compaction covers the inherited history
too. Real SQLite storage; no event is copied into a fork."""

from __future__ import annotations

from pathlib import Path

from compaction_world import World, agent, policy

from lodger.context import project_messages
from lodger.engine.state import SessionState
from lodger.events import Compacted, Event
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import UserMessage
from lodger.storage import Storage
from lodger.storage.forks import fork_session, read_inherited


async def _fork_projection(storage: Storage, parent: str, at: int, name: str) -> tuple[object, ...]:
    await fork_session(
        storage.log,
        parent,
        fork_id=name,
        at=at,
        clock=ManualClock(),
        ids=SequentialIds(prefix=f"{name}-"),
    )
    own = await storage.log.read_all(name)
    state = SessionState(name, own)
    state.inherit(await read_inherited(storage.log, name, own))
    return tuple(state.projector.project().messages)


def _prefixes_around(events: list[Event]) -> list[int]:
    """Fork points just before, at and after each compaction, and a few others."""
    points = {5, len(events) // 2, len(events)}
    for e in events:
        if isinstance(e.body, Compacted):
            points.update({e.offset, e.offset + 1, e.offset + 2})
    return sorted(p for p in points if 1 <= p <= len(events))


async def test_a_fork_before_or_after_a_compaction_projects_as_the_original(
    tmp_path: Path,
) -> None:
    world = World(steps=30)
    storage = Storage.local(tmp_path / "state")
    try:
        async with agent(storage, world, policy(threshold_tokens=6000, budget_tokens=9000)) as a:
            await a.run("read the pages", session="p")
            events = await a.log.read_all("p")
        compactions = [e.offset for e in events if isinstance(e.body, Compacted)]
        assert len(compactions) >= 2
        points = _prefixes_around(events)
        for at in points:
            expected = tuple(project_messages(events[:at]).messages)
            got = await _fork_projection(storage, "p", at, f"f{at}")
            assert got == expected, f"fork at {at} projects otherwise"
        # before the first compaction the fork sees the whole history; after it, the summary
        before = await _fork_projection(storage, "p", compactions[0], "before")
        after = await _fork_projection(storage, "p", compactions[0] + 1, "after")
        assert not (isinstance(before[0], UserMessage) and before[0].source == "runtime")
        assert isinstance(after[0], UserMessage) and "## Summary" in after[0].text
    finally:
        await storage.close()


async def test_a_forks_own_compaction_covers_its_inherited_history(tmp_path: Path) -> None:
    world = World(steps=8)
    storage = Storage.local(tmp_path / "state")
    try:
        async with agent(storage, world, policy()) as a:
            await a.run("read the pages", session="p")
            parent = await a.log.read_all("p")
            await fork_session(
                storage.log, "p", fork_id="f", at=len(parent), clock=a.clock, ids=a.ids
            )
            made = await a.compact("f")
            own = await a.log.read_all("f")
        assert made.previous is None and "pages read: 8" in made.summary
        assert len(made.dropped_call_ids) == 8  # the parent's calls, summarized in the fork
        state = SessionState("f", own)
        state.inherit(await read_inherited(storage.log, "f", own))
        messages = state.projector.project().messages
        assert len(messages) == 1 and isinstance(messages[0], UserMessage)
        # the parent is untouched: its own projection still holds every page
        assert len(project_messages(parent).messages) > 8
    finally:
        await storage.close()

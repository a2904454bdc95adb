"""Forks that copy nothing: a new session that continues from a parent's verified prefix.

A fork is a session of its own whose first event, ``session_started``, names the parent
and the prefix it shares: ``ForkParent(session_id, high_water, digest)``. Nothing of the
parent is copied (no event, artifact or snapshot): the fork's history is the parent's
events ``[0, high_water)`` followed by its own, and every read of the shared part checks
that the parent still ends that prefix in the recorded digest (``read_lineage``). On the
object store the fork's first manifest also records the parent prefix and the workspace
snapshot the parent had at that point; on SQLite the two sessions share one database.
Both sessions go on independently and both verify.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lodger.errors import CorruptLogError, NextStep, UsageError
from lodger.events import (
    Event,
    EventDraft,
    ForkParent,
    SessionStarted,
    WorkspaceSnapshot,
)
from lodger.ids import Clock, IdFactory
from lodger.storage.eventlog import EventLog
from lodger.storage.logstore import check_session_id

__all__ = ["Fork", "Lineage", "fork_session", "read_inherited", "read_lineage"]

SNAPSHOT_KEY = "fork.snapshot"


@dataclass(frozen=True, kw_only=True)
class Fork:
    session_id: str
    parent: ForkParent
    #: the parent's newest workspace snapshot before the fork point, shared by reference
    snapshot: str | None
    started: Event


@dataclass(frozen=True, kw_only=True)
class Lineage:
    """A session's whole history: each ancestor's shared prefix, oldest first, then its
    own events. ``parts`` are ``(session_id, events)``."""

    parts: tuple[tuple[str, tuple[Event, ...]], ...]

    @property
    def events(self) -> list[Event]:
        return [event for _, events in self.parts for event in events]


async def fork_session(
    log: EventLog,
    parent_id: str,
    *,
    fork_id: str,
    at: int | None = None,
    clock: Clock,
    ids: IdFactory,
    metadata: Mapping[str, str] | None = None,
    then: Sequence[EventDraft] = (),
) -> Fork:
    """Start ``fork_id`` from the parent's prefix ``[0, at)`` (default: its whole log),
    after verifying that prefix and the parent's stored head. ``metadata`` is added to the
    fork's ``session_started`` (a subagent records its parent link there); ``then`` are
    facts committed with it, in the same append (a rewind's ``rewound``)."""
    check_session_id(parent_id)
    check_session_id(fork_id)
    parent_events = await log.read_all(parent_id)  # verifies the chain and the head
    high_water = len(parent_events) if at is None else at
    if at is not None and at < 1:
        # an empty prefix shares nothing: that is a new session, not a fork
        raise UsageError(
            f"cannot fork session {parent_id!r} at offset {at}: a fork shares at least the "
            "parent's first event",
            hint="fork at an offset from 1 to the parent's event count, or start a new session",
            code="usage",
            session_id=parent_id,
            offset=at,
        )
    if not 1 <= high_water <= len(parent_events):
        held = (
            f"its log holds offsets 0 to {len(parent_events) - 1}"
            if parent_events
            else "its log holds no event yet"
        )
        raise UsageError(
            f"cannot fork session {parent_id!r} at offset {high_water}: {held}",
            hint=f"fork at an offset from 1 to {len(parent_events)} (the events before it "
            "are shared)"
            if parent_events
            else "fork it once it has run a turn",
            code="fork_beyond_head",
            session_id=parent_id,
            offset=high_water,
        )
    shared = parent_events[:high_water]
    parent = ForkParent(session_id=parent_id, high_water=high_water, digest=shared[-1].digest)
    start = shared[0].body if isinstance(shared[0].body, SessionStarted) else None
    snapshot = next(
        (e.body.ref for e in reversed(shared) if isinstance(e.body, WorkspaceSnapshot)), None
    )
    extra = metadata
    metadata = dict(start.metadata) if start else {}
    metadata.pop(SNAPSHOT_KEY, None)
    if snapshot is not None:
        metadata[SNAPSHOT_KEY] = snapshot
    metadata.update(extra or {})
    body = SessionStarted(
        workspace=start.workspace if start else None,
        workspace_id=start.workspace_id if start else None,
        parent=parent,
        metadata=metadata,
    )
    draft = EventDraft(id=ids.new_id(), ts=clock.now_us(), body=body)
    async with await log.open_writer(fork_id) as writer:
        if writer.head.high_water:
            raise UsageError(
                f"cannot fork into session {fork_id!r}: it already has a log",
                hint="choose a new session id for the fork",
                code="usage",
                session_id=fork_id,
            )
        started, *_ = await writer.append([draft, *then], expected_offset=0)
    await _record_in_manifest(log, fork_id, parent, snapshot)
    return Fork(session_id=fork_id, parent=parent, snapshot=snapshot, started=started)


async def _record_in_manifest(
    log: EventLog, fork_id: str, parent: ForkParent, snapshot: str | None
) -> None:
    from lodger.storage.objectstore import ObjectLogStore

    store = log.store
    if isinstance(store, ObjectLogStore):
        await store.write_manifest(
            fork_id,
            parent=parent.model_dump(),
            snapshots=((0, snapshot),) if snapshot else (),
            head=await store.stored_head(session_id=fork_id),
        )


async def read_lineage(log: EventLog, session_id: str) -> Lineage:
    """The session's events preceded by the prefixes it shares with its ancestors, each
    checked against the ``(high_water, digest)`` its fork recorded."""
    own = await log.read_all(session_id)
    parts = await _ancestors(log, session_id, own)
    return Lineage(parts=(*parts, (session_id, tuple(own))))


async def read_inherited(log: EventLog, session_id: str, own: Sequence[Event]) -> list[Event]:
    """The events a session inherits from its ancestors, oldest first (empty when it is
    not a fork), given its own verified events ``own``; each shared prefix is checked
    against the ``(high_water, digest)`` its fork recorded. This is what a fork's model
    context puts before the fork's own events (``SessionState.inherit``)."""
    parts = await _ancestors(log, session_id, own)
    return [event for _, events in parts for event in events]


async def _ancestors(
    log: EventLog, session_id: str, own: Sequence[Event]
) -> list[tuple[str, tuple[Event, ...]]]:
    parts: list[tuple[str, tuple[Event, ...]]] = []
    child, events = session_id, list(own)
    seen = {session_id}
    while True:
        parent = _parent_of(events)
        if parent is None:
            break
        if parent.session_id in seen:
            raise _lineage_error(child, "its ancestors form a cycle")
        seen.add(parent.session_id)
        shared = await log.read(parent.session_id, end=parent.high_water)
        if len(shared) != parent.high_water:
            raise _lineage_error(
                child,
                f"its parent {parent.session_id!r} holds {len(shared)} of the "
                f"{parent.high_water} events the fork shares",
                code="truncated",
            )
        if shared[-1].digest != parent.digest:
            raise _lineage_error(
                child,
                f"its parent {parent.session_id!r} ends the shared prefix at offset "
                f"{parent.high_water - 1} in another digest than the fork recorded",
            )
        parts.insert(0, (parent.session_id, tuple(shared)))
        child, events = parent.session_id, list(shared)
    return parts


def _parent_of(events: Sequence[Event]) -> ForkParent | None:
    if events and isinstance(events[0].body, SessionStarted):
        return events[0].body.parent
    return None


def _lineage_error(session_id: str, why: str, *, code: str = "digest_mismatch") -> CorruptLogError:
    return CorruptLogError(
        f"log for session {session_id!r} is invalid at offset 0: {why}",
        hint="the parent's shared events were changed or lost outside lodger; restore the "
        "parent from a backup",
        code=code,
        session_id=session_id,
        offset=0,
        next_steps=(NextStep(action="list_sessions"),),
    )

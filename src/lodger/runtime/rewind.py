"""Rewind a session to an earlier prefix, conversation and workspace, and undo it.

A rewind edits nothing. It starts a copy-free fork of a branch at the prefix it goes back
to, commits ``rewound(left, to, restored, removed, forced, who)`` in the fork's first
append, and that fork becomes the session's current branch (the name ``S`` leads to its
newest branch ``S..rN``: :mod:`lodger.storage.branches`). The branch left behind keeps
every fact, so rewinding to it (``branch=left``, or ``undo=True``) undoes the rewind: a
new branch that shares its whole log.

The workspace is put back to what the log says it held at that prefix
(:mod:`lodger.runtime._workspace_at`: turn-end snapshots and the file tools' per-edit
checkpoints). Before anything changes, the workspace is snapshotted as it is; a file whose
content is not what the log says the branch left it at (edited outside lodger) refuses
the rewind, naming the files, unless ``force`` (then ``forced`` lists them). Either way
the snapshot is committed to the branch left behind, so its files, even the forced ones,
come back when the rewind is undone. The restore is crash-safe
(:mod:`lodger.runtime._restore`): a rewind cut short is finished by whoever opens the
session next (``open_branch``).

``to`` is an offset of the branch's own log (as ``lodger log show`` prints it): the new
branch shares ``[0, to)``. ``turn`` is turn N of that log, numbered from 1 as
``lodger log show`` does: the branch shares everything before the turn started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lodger.engine.state import SessionState
from lodger.errors import (
    AppendConflictError,
    ResumeBlockedError,
    SessionNotFoundError,
    StorageError,
    UsageError,
)
from lodger.events import Event, EventDraft, ForkParent, Prefix, Rewound, TurnStarted
from lodger.events import WorkspaceSnapshot as SnapshotFact
from lodger.ids import Clock, IdFactory
from lodger.runtime._restore import Intent, apply_changes, drop_intent, read_intent, write_intent
from lodger.runtime._workspace_at import (
    Change,
    WorkspaceView,
    plan_changes,
    read_snapshot,
    reverting,
    view_at,
)
from lodger.runtime.replay_report import refuse_replay
from lodger.storage import EventLog, SessionWriter, Storage, check_session_id
from lodger.storage.branches import current_branch, names_a_branch, next_branch, root_of
from lodger.storage.forks import fork_session, read_inherited, read_lineage
from lodger.storage.snapshots import SnapshotResult, snapshot_workspace

__all__ = ["RewindResult", "finish_rewind", "open_branch", "rewind_session"]


@dataclass(frozen=True, kw_only=True)
class RewindResult:
    """What a rewind did: ``branch`` is the session's current branch now."""

    session_id: str
    branch: str
    source: str
    left: ForkParent
    to: Prefix
    restored: int = 0
    removed: int = 0
    forced: tuple[str, ...] = ()
    files: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "branch": self.branch,
            "source": self.source,
            "left": self.left.model_dump(),
            "to": self.to.model_dump(),
            "restored": self.restored,
            "removed": self.removed,
            "forced": list(self.forced),
            "files": list(self.files),
        }


async def open_branch(storage: Storage, name: str) -> str:
    """The log a door opening session ``name`` works on: a rewind of it cut short is
    finished first, then its current branch is found (``lodger.storage.branches``)."""
    finished = await finish_rewind(storage, root_of(check_session_id(name)))
    if finished is not None and name == finished.rewound["left"]["session_id"]:
        return finished.branch  # the door named the branch that was current then
    return await current_branch(storage.log, name)


async def finish_rewind(storage: Storage, session: str) -> Intent | None:
    """Finish the rewind of ``session`` a crash cut short, if there is one (and say
    which it was)."""
    intent = await read_intent(storage.state_dir, session)
    if intent is not None:
        await _complete(storage, intent)
    return intent


async def rewind_session(
    storage: Storage,
    name: str,
    *,
    to: int | None = None,
    turn: int | None = None,
    branch: str | None = None,
    undo: bool = False,
    force: bool = False,
    who: str | None = None,
    clock: Clock,
    ids: IdFactory,
    workspace: Path | None = None,
) -> RewindResult:
    """Rewind session ``name`` (see the module docstring): to offset ``to`` or before turn
    ``turn`` of its current branch, or of ``branch``; ``undo`` goes back to the head of the
    branch the current one was rewound from. ``who`` names the operator. ``workspace``
    is the directory to restore instead of the one the log records (a worker-run
    session's workspace lives in its snapshots: the caller restores one into a directory,
    rewinds it, and snapshots it again)."""
    root = root_of(check_session_id(name))
    await finish_rewind(storage, root)
    log = storage.log
    current = await current_branch(log, root)
    if not await log.exists(current):
        raise SessionNotFoundError(f"no log for session {name!r}", session_id=name)
    async with await log.open_writer(current) as writer:  # no run goes on meanwhile
        own = list(writer.initial_events)
        refuse_replay(current, own)  # its snapshots are a scratch copy's, not the workspace's
        lineage = [*await read_inherited(log, current, own), *own]
        source, source_own, at = await _target(storage, root, current, own, to, turn, branch, undo)
        source_lineage = (await read_lineage(log, source)).events if source != current else lineage
        where = workspace or _workspace_of(current, own)
        changes, forced, revert = await _leave(
            storage,
            writer,
            where,
            lineage,
            source_lineage,
            len(source_lineage) - len(source_own) + at,
            force=force,
            clock=clock,
            ids=ids,
        )
        head = writer.head
        left = ForkParent(session_id=current, high_water=head.high_water, digest=head.digest)
        target = Prefix(high_water=at, digest=source_own[at - 1].digest)
        restored = sum(1 for c in changes if c.sha256 is not None)
        intent = Intent(
            session=root,
            branch=await next_branch(log, root),
            source=source,
            at=at,
            workspace=str(where) if where is not None else None,
            changes=tuple(changes),
            revert=tuple(revert),
            rewound=_rewound_fields(
                left, target, restored, len(changes) - restored, forced, who, clock, ids
            ),
        )
        await write_intent(storage.state_dir, intent)
        await _complete(storage, intent)
    return RewindResult(
        session_id=root,
        branch=intent.branch,
        source=source,
        left=left,
        to=target,
        restored=restored,
        removed=len(changes) - restored,
        forced=tuple(forced),
        files=tuple(c.path for c in changes),
    )


def _rewound_fields(
    left: ForkParent,
    target: Prefix,
    restored: int,
    removed: int,
    forced: list[str],
    who: str | None,
    clock: Clock,
    ids: IdFactory,
) -> dict[str, Any]:
    """What the intent keeps of the ``rewound`` fact it will append (ids and time fixed
    now, so a crash-cut rewind completes with the same fact)."""
    return {
        "left": left.model_dump(),
        "to": target.model_dump(),
        "restored": restored,
        "removed": removed,
        "forced": forced,
        "who": who,
        "id": ids.new_id(),
        "start_id": ids.new_id(),
        "ts": clock.now_us(),
    }


async def _leave(
    storage: Storage,
    writer: SessionWriter,
    workspace: Path | None,
    lineage: list[Event],
    source: list[Event],
    shared: int,
    *,
    force: bool,
    clock: Clock,
    ids: IdFactory,
) -> tuple[list[Change], list[str], list[Change]]:
    """Plan the workspace changes to the view at ``[0, shared)`` of ``source``, refuse
    over files changed outside lodger unless ``force``, and commit the workspace as it
    is now to the branch left behind (so undoing the rewind brings every file back):
    the changes, the (forced) files changed outside lodger, sorted, and the changes that
    would undo the changes."""
    if workspace is None:
        return [], [], []
    taken, changes, outside, revert = await _plan(storage, workspace, lineage, source, shared)
    if outside and not force:
        raise _changed_outside(root_of(writer.session_id), outside)
    snapshot = SnapshotFact(ref=taken.ref, files=taken.files, size=taken.size)
    await writer.append([_draft(snapshot, clock, ids)], expected_offset=writer.head.high_water)
    return changes, sorted(outside), revert


def _draft(body: Any, clock: Clock, ids: IdFactory) -> EventDraft:
    return EventDraft(id=ids.new_id(), ts=clock.now_us(), body=body, origin="operator")


async def _complete(storage: Storage, intent: Intent) -> None:
    """Apply the intent's file changes (again: each is idempotent), commit its branch
    unless it is committed already, and drop the intent. A change that cannot be made
    (a blob lost, a file that cannot be written) before the branch is committed rolls the
    workspace back as the rewind found it and drops the intent: the session stays on its
    branch, as if the rewind was never asked."""
    log = storage.log
    if intent.workspace is not None:
        root, hidden = Path(intent.workspace), storage.hidden_paths()
        try:
            await apply_changes(root, intent.changes, storage.artifacts, hidden)
        except (StorageError, UsageError) as exc:
            if await log.exists(intent.branch):
                raise
            await apply_changes(root, intent.revert, storage.artifacts, hidden)
            await drop_intent(storage.state_dir, intent.session)
            raise StorageError(
                f"cannot rewind session {intent.session!r}: {exc.message}; its workspace and "
                "its branch were left as they were",
                hint=exc.hint,
                code=exc.code,
                session_id=intent.session,
            ) from exc
    if not await log.exists(intent.branch):
        await _commit_branch(log, intent)
    await drop_intent(storage.state_dir, intent.session)


async def _commit_branch(log: EventLog, intent: Intent) -> None:
    fields = dict(intent.rewound)
    start = _Fixed(fields["ts"], fields["start_id"])
    body = Rewound(
        left=ForkParent(**fields["left"]),
        to=Prefix(**fields["to"]),
        restored=fields["restored"],
        removed=fields["removed"],
        forced=tuple(fields["forced"]),
        who=fields["who"],
    )
    draft = EventDraft(id=fields["id"], ts=start.us, body=body, origin="operator")
    try:
        await fork_session(
            log,
            intent.source,
            fork_id=intent.branch,
            at=intent.at,
            clock=start,
            ids=start,
            then=[draft],
        )
    except AppendConflictError:
        if not await log.exists(intent.branch):  # another opener finished it first
            raise


@dataclass(frozen=True)
class _Fixed:
    """The clock and ids of a branch's first append, fixed in the intent: a rewind
    finished after a crash writes the facts it would have written."""

    us: int
    id: str

    def now_us(self) -> int:
        return self.us

    def new_id(self) -> str:
        return self.id


async def _target(
    storage: Storage,
    root: str,
    current: str,
    own: list[Event],
    to: int | None,
    turn: int | None,
    branch: str | None,
    undo: bool,
) -> tuple[str, list[Event], int]:
    """The branch the prefix is taken from, its own events, and the prefix's end."""
    if sum(x is not None for x in (to, turn)) > 1 or (undo and (branch or to or turn)):
        raise UsageError(
            "give one of --to, --turn or --undo",
            hint="--branch may go with --to or --turn; --undo goes alone",
            code="usage",
        )
    if undo:
        rewound = next((e.body for e in own[:2] if isinstance(e.body, Rewound)), None)
        if rewound is None:
            raise UsageError(
                f"session {root!r} has no rewind to undo: its current branch {current!r} "
                "was not made by one",
                hint="rewind to an offset or a turn instead",
                code="rewind_target",
                session_id=root,
            )
        branch, to = rewound.left.session_id, rewound.left.high_water
    # a branch is named exactly: ``S`` (or ``S..r0``) is the session's first log
    source = current if branch is None else root_of(check_session_id(branch))
    if branch is not None and names_a_branch(branch):
        source = await current_branch(storage.log, branch)
    if root_of(source) != root:
        raise UsageError(
            f"{source!r} is not a branch of session {root!r}",
            hint=f"name {root!r} or one of its branches ({root}..r1, ...)",
            code="rewind_target",
            session_id=root,
        )
    events = own if source == current else await storage.log.read_all(source)
    if not events:
        raise SessionNotFoundError(f"no log for branch {source!r}", session_id=source)
    at = _offset(source, events, to, turn)
    if source == current and at == len(events):
        raise UsageError(
            f"session {root!r} is already at offset {at} of {current!r}",
            hint="rewind to an earlier offset or turn",
            code="rewind_target",
            session_id=root,
        )
    return source, events, at


def _offset(source: str, events: list[Event], to: int | None, turn: int | None) -> int:
    if turn is not None:
        starts = [e.offset for e in events if isinstance(e.body, TurnStarted)]
        if not 1 <= turn <= len(starts):
            raise UsageError(
                f"{source!r} has no turn {turn}: it holds turns 1 to {len(starts)}"
                if starts
                else f"{source!r} holds no turn of its own",
                hint="turns are numbered from 1 as `lodger log show` prints them",
                code="rewind_target",
                session_id=source,
            )
        return starts[turn - 1]
    at = len(events) if to is None else to
    if not 1 <= at <= len(events):
        raise UsageError(
            f"cannot rewind to offset {at} of {source!r}: its log holds offsets 0 to "
            f"{len(events) - 1}",
            hint=f"give an offset from 1 to {len(events)} (the events before it are kept)",
            code="rewind_target",
            session_id=source,
        )
    return at


def _workspace_of(current: str, own: Sequence[Event]) -> Path | None:
    state = SessionState(current, own)
    if state.workspace is None:
        return None
    path = Path(state.workspace)
    if not path.is_dir():
        raise UsageError(
            f"cannot rewind session {current!r}: its workspace {state.workspace} is missing",
            hint="restore or recreate the directory first",
            code="workspace_missing",
            session_id=current,
        )
    return path


async def _plan(
    storage: Storage, workspace: Path, lineage: list[Event], source: list[Event], shared: int
) -> tuple[SnapshotResult, list[Change], list[str], list[Change]]:
    """Snapshot the workspace as it is, and plan the changes to the view at ``[0, shared)``
    of the ``source`` lineage: the snapshot, the changes, the changed paths that were
    edited outside lodger, and the changes that would undo the changes."""
    taken = await snapshot_workspace(workspace, storage.artifacts, exclude=storage.hidden_paths())
    current: WorkspaceView = await read_snapshot(storage.artifacts, taken.ref)
    logged = await view_at(lineage, len(lineage), storage.artifacts)
    wanted = await view_at(source, shared, storage.artifacts)
    changes, outside = await asyncio.to_thread(
        lambda: plan_changes(current=current, logged=logged, target=wanted)
    )
    return taken, changes, outside, reverting(changes, current)


def _changed_outside(session: str, paths: list[str]) -> ResumeBlockedError:
    shown = ", ".join(repr(p) for p in paths[:10]) + (" ..." if len(paths) > 10 else "")
    error = ResumeBlockedError(
        f"cannot rewind session {session!r}: {len(paths)} file(s) changed outside lodger "
        f"since the log last recorded them: {shown}",
        blockers=[f"{p}: changed outside lodger" for p in paths],
        hint="keep a copy of them, or rewind with force to overwrite them (the branch left "
        "behind keeps them: undoing the rewind brings them back)",
        session_id=session,
    )
    error.code = "workspace_changed"
    return error

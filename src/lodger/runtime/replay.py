"""Replay: a recorded session's inputs run again, with another model, prompt or tool set,
on a copy-free fork that never touches the world.

``replay`` forks the source at a turn boundary (``at``, or before turn ``turn``,
default: before its first turn), commits ``replay_started`` with the fork's start, and
runs each of the source's later user inputs as a turn of the fork. The fork binds the
tools the caller gives (the source's, usually) answered as ``lodger.runtime._replay_tools``
says: from the recorded result when the source made the same call, live when the tool only
reads, in a sandbox on a scratch copy of the workspace as the log recorded it at the fork
point when it is confined, else parked. The fork's workspace is that scratch directory,
removed when the replay ends (its turn-end snapshots keep what it held); the source's
workspace is only read, to fill what the log's snapshots do not cover.

The result carries the report (``lodger.runtime.replay_report``): where the trajectories
diverge, the calls added and removed, the answers side by side, tokens and cost.

>>> result = await replay(sessions, "s1", binding=Binding(model="function:candidate", tools=tools))
>>> result.report.diverged_at.step
3
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lodger.engine.loop import TurnResult
from lodger.engine.settings import Hooks, Limits, Services
from lodger.errors import SessionNotFoundError, UsageError
from lodger.events import Event, EventDraft, ReplayStarted, TurnEnded, TurnStarted
from lodger.runtime._replay_tools import ReplayPolicy, replay_tools
from lodger.runtime._restore import apply_changes
from lodger.runtime._workspace_at import Change, view_at
from lodger.runtime.agent import DEFAULT_SYSTEM, Agent
from lodger.runtime.replay_report import ReplayReport, replay_report
from lodger.runtime.rewind import open_branch
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage
from lodger.storage.forks import fork_session, read_lineage
from lodger.tools.mcp import McpServers
from lodger.tools.policy import PermissionPolicy

__all__ = ["ReplayPolicy", "ReplayResult", "replay", "replay_offset"]


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    """A replay: the fork it ran on, its turns, and the report against the source."""

    session_id: str
    source_session: str
    source_offset: int
    turns: tuple[TurnResult, ...]
    report: ReplayReport

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.report.to_dict(),
            "turns": [{"turn_id": t.turn_id, "status": t.status} for t in self.turns],
        }


def _blocked(source: str, why: str, hint: str) -> UsageError:
    return UsageError(
        f"cannot replay session {source!r}: {why}", hint=hint, code="usage", session_id=source
    )


def replay_offset(source: str, events: Sequence[Event], at: int | None, turn: int | None) -> int:
    """The offset a replay forks at: ``at`` (a turn boundary), the start of turn ``turn``
    (from 1), or the start of the source's first turn."""
    if at is not None and turn is not None:
        raise _blocked(source, "both --at and --turn were given", "give one of them")
    starts = [e.offset for e in events if isinstance(e.body, TurnStarted)]
    if not starts:
        raise _blocked(source, "it holds no turn of its own", "replay a session that ran a turn")
    if turn is not None:
        if not 1 <= turn <= len(starts):
            raise _blocked(source, f"it has no turn {turn}", f"give a turn from 1 to {len(starts)}")
        return starts[turn - 1]
    if at is None:
        return starts[0]
    if not 1 <= at < len(events):
        raise _blocked(
            source,
            f"offset {at} is outside its log (offsets 0 to {len(events) - 1})",
            "give the offset of a turn_started fact, as `lodger log show` prints it",
        )
    ended = {e.offset for e in events if isinstance(e.body, TurnEnded)}
    opened = [s for s in starts if s < at]
    if opened and not any(opened[-1] < end < at for end in ended):
        shown = ", ".join(str(s) for s in starts[:10])
        raise _blocked(
            source,
            f"offset {at} is inside a turn (a replay starts where a turn starts)",
            f"give the offset of a turn's start ({shown}) or --turn N",
        )
    return at


async def _scratch_workspace(
    storage: Storage, source: str, at: int, workspace: str | None
) -> Path | None:
    """A temporary directory holding the workspace the log says ``source`` had at ``at``
    (None: the session has no workspace). Files no fact covers come from the source's
    workspace, read, never written."""
    if workspace is None:
        return None
    lineage = (await read_lineage(storage.log, source)).parts
    events = [e for _, part in lineage for e in part]
    shift = len(events) - len(lineage[-1][1])
    view = await view_at(events, shift + at, storage.artifacts)
    root = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="lodger-replay-"))
    if not view.complete:
        await asyncio.to_thread(_copy_workspace, Path(workspace), root, storage.hidden_paths())
    changes = [
        Change(path=path, sha256=None)
        if state is None
        else Change(path=path, sha256=state.sha256, mode=state.mode or 0o644)
        for path, state in sorted(view.files.items())
    ]
    await apply_changes(root, changes, storage.artifacts, ())
    return root


def _copy_workspace(real: Path, root: Path, hidden_paths: Sequence[Path]) -> None:
    """Copy the source's workspace (the state directory left out) into ``root``."""
    if not real.is_dir():
        return
    hidden = {Path(p).resolve() for p in hidden_paths}

    def ignore(directory: str, names: list[str]) -> list[str]:
        return [n for n in names if (Path(directory) / n).resolve() in hidden]

    shutil.copytree(real, root, symlinks=True, ignore=ignore, dirs_exist_ok=True)


def _existing(path: str | None) -> Path | None:
    return Path(path) if path is not None and Path(path).is_dir() else None


async def _fork(
    sessions: Sessions, source: str, at: int, model: str, policy: ReplayPolicy, fork_id: str
) -> None:
    started = ReplayStarted(
        source_session=source, source_offset=at, model=model, policy=policy.describe()
    )
    draft = EventDraft(id=sessions.ids.new_id(), ts=sessions.clock.now_us(), body=started)
    await fork_session(
        sessions.storage.log,
        source,
        fork_id=fork_id,
        at=at,
        clock=sessions.clock,
        ids=sessions.ids,
        then=(draft,),
    )


def _replay_agent(
    sessions: Sessions,
    binding: Binding,
    servers: McpServers,
    source_events: Sequence[Event],
    policy: ReplayPolicy,
    workspace: Path | None,
    scratch: Path | None,
    system: str | None,
) -> Agent:
    tools = replay_tools(
        [*binding.tools, *servers.tools()], source_events, policy, sandboxed=scratch is not None
    )
    return Agent(
        model=binding.model,
        tools=tools,
        system=system if system is not None else DEFAULT_SYSTEM,
        storage=sessions.storage,
        workspace=workspace,
        # nothing asks: an answer has no effect on the world; the deny rules still hold
        permissions=PermissionPolicy(binding.permissions.rules, approve_all=True),
        code_mode=binding.code_mode,
        output_mode=binding.output_mode,
        model_settings=binding.model_settings,
        limits=Limits(max_steps=binding.max_steps, usage=binding.usage, budgets=binding.budgets),
        hooks=Hooks(on_event=binding.on_event, on_text=binding.on_text),
        services=Services(clock=sessions.clock, ids=sessions.ids, turns=sessions.turns),
        compaction=binding.compaction,
    )


async def replay(
    sessions: Sessions,
    source: str,
    *,
    binding: Binding,
    at: int | None = None,
    turn: int | None = None,
    policy: ReplayPolicy | None = None,
    system: str | None = None,
    session: str | None = None,
) -> ReplayResult:
    """Replay ``source``'s inputs from ``at`` (or turn ``turn``) on a new fork (``session``,
    or a fresh id) with ``binding``'s model and tools and ``system`` as the prompt; see the
    module docstring. Subagents are never bound in a replay (a child would run for real)."""
    policy = policy or ReplayPolicy()
    source = await open_branch(sessions.storage, source)
    events = await sessions.storage.log.read_all(source)
    if not events:
        raise SessionNotFoundError(f"no log for session {source!r}", session_id=source)
    at = replay_offset(source, events, at, turn)
    inputs = [e.body.input for e in events[at:] if isinstance(e.body, TurnStarted)]
    fork_id = session if session is not None else sessions.ids.new_id()
    state = await sessions.state(source)
    scratch = (
        await _scratch_workspace(sessions.storage, source, at, state.workspace)
        if policy.sandbox
        else None
    )
    # without a sandbox, live reads read the source's workspace (nothing there is written)
    workspace = scratch or await asyncio.to_thread(_existing, state.workspace)
    try:
        async with McpServers(binding.mcp) as servers:
            agent = _replay_agent(
                sessions, binding, servers, events[at:], policy, workspace, scratch, system
            )
            agent.replaying = True
            async with agent:
                await _fork(sessions, source, at, agent.model.spec, policy, fork_id)
                turns: list[TurnResult] = []
                for text in inputs:
                    result = await agent.run(text, session=fork_id)
                    turns.append(result)
                    if result.status != "completed":
                        break  # the turn did not settle: the rest would not follow it
    finally:
        if scratch is not None:
            await asyncio.to_thread(shutil.rmtree, scratch, True)
    report = replay_report(events, await sessions.storage.log.read_all(fork_id))
    return ReplayResult(
        session_id=fork_id,
        source_session=source,
        source_offset=at,
        turns=tuple(turns),
        report=report,
    )

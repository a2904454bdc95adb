"""The sessions service: what the CLI (and the HTTP host, and workers) do with sessions.

It composes storage, tools and MCP servers into an agent for one operation and runs it:
run a turn, resume an interrupted one (in its workspace, or relocated to another), record
an operator decision, abandon an open turn, compute a recovery plan, list sessions. It
knows nothing of terminals or HTTP: progress goes to callbacks, failures are
``LodgerError``s whose ``next_steps`` say what a caller can do.

>>> sessions = Sessions(Storage.local(".lodger"))
>>> result = await sessions.run("fix the test", binding=Binding(model=model, tools=tools))
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lodger.engine.budgets import Budgets, UsageLimits
from lodger.engine.checkpoint import open_fold
from lodger.engine.compaction import CompactionPolicy
from lodger.engine.control import CancelOutcome, CancelRequest
from lodger.engine.journal import Journal
from lodger.engine.loop import TurnResult
from lodger.engine.permissions import Approver, PermissionPolicy
from lodger.engine.queue import QueuedMessage, Steered
from lodger.engine.resume import Decision, abandon, decide
from lodger.engine.settings import Hooks, Limits, Services
from lodger.engine.state import SessionState
from lodger.engine.steering import RunningTurns
from lodger.errors import UsageError
from lodger.events import Compacted, Event, PermissionMode
from lodger.ids import Clock, IdFactory, SystemClock, Uuid7Factory
from lodger.media import UserInput
from lodger.providers.base import Model, ModelSettings, OutputMode, TextSink
from lodger.recovery.plan import RecoveryPlan
from lodger.runtime import _followups
from lodger.runtime._session_control import (
    ModeOutcome,
    branch_of,
    cancel_turn,
    check_mode,
    commit_cancel,
    commit_mode,
    switch_mode,
)
from lodger.runtime._writers import closing_writer
from lodger.runtime.agent import Agent
from lodger.runtime.rewind import RewindResult, open_branch, rewind_session
from lodger.runtime.subagents import ChildOutcome, SubagentPolicy
from lodger.storage import EventLog, SessionWriter, Storage, check_session_id
from lodger.storage.forks import Fork, fork_session
from lodger.substrates.codemode import Language
from lodger.tools.mcp import McpInput, McpServerConfig, McpServers
from lodger.tools.spec import Elicitor, Tool
from lodger.tools.workspace import workspace_id

__all__ = ["Binding", "FoldCache", "SessionDefaults", "SessionWorkspace", "Sessions"]


class FoldCache(MutableMapping[str, SessionState]):
    """The verified folds a long-lived service keeps, least recently used first out.

    A fold holds every event of its session, so an unbounded cache grows with every session
    a host ever touched. Evicting one loses nothing: the next operation on that session
    reads and verifies its log again (an agent in the middle of a turn keeps its own
    reference to the fold it is feeding).
    """

    def __init__(self, max_sessions: int = 64) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.max_sessions = max_sessions
        self._folds: OrderedDict[str, SessionState] = OrderedDict()

    def __getitem__(self, session_id: str) -> SessionState:
        state = self._folds[session_id]
        self._folds.move_to_end(session_id)
        return state

    def __setitem__(self, session_id: str, state: SessionState) -> None:
        self._folds[session_id] = state
        self._folds.move_to_end(session_id)
        while len(self._folds) > self.max_sessions:
            self._folds.popitem(last=False)

    def __delitem__(self, session_id: str) -> None:
        del self._folds[session_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._folds)

    def __len__(self) -> int:
        return len(self._folds)


@dataclass(frozen=True, kw_only=True)
class Binding:
    """What one run binds: a model, tools, MCP servers, a workspace and a policy.

    ``model`` is a ``Model`` (the caller's to close) or a spec such as
    ``"openai:gpt-4.1"`` (made for each run and closed when it ends)."""

    model: Model | str
    tools: Sequence[Tool] = ()
    mcp: Sequence[McpServerConfig] = ()
    workspace: Path | None = None
    permissions: PermissionPolicy = field(default_factory=PermissionPolicy)
    approver: Approver | None = None
    #: answers an MCP server's questions during a call (None: its policy declines them)
    elicitor: Elicitor | None = None
    max_steps: int = 50
    on_event: Callable[[Event], None] | None = None
    on_text: TextSink | None = None
    #: bind the ``exec`` tool: cells in this language call the nestable tools
    code_mode: Language | None = None
    #: bind the ``delegate`` tool: child sessions under this policy (lodger.runtime.subagents)
    subagents: SubagentPolicy | None = None
    #: model settings each request asks with; a resume takes them over the settings its
    #: turn recorded
    model_settings: ModelSettings | None = None
    #: how the output schema travels (None: the model's own mode)
    output_mode: OutputMode | None = None
    #: per-turn usage limits and money budgets (lodger.engine.budgets): reached, a turn parks
    usage: UsageLimits = field(default_factory=UsageLimits)
    budgets: Budgets = field(default_factory=Budgets)
    #: when and how the context is compacted (``[compaction]`` in lodger.toml)
    compaction: CompactionPolicy | None = None
    #: the permission mode a new turn starts in (None: the session's own)
    permission_mode: str | None = None


@dataclass(frozen=True, kw_only=True)
class SessionDefaults:
    """What a session's log says it ran with: its last model and its workspace."""

    model: str | None
    workspace: str | None


@dataclass(frozen=True, kw_only=True)
class SessionWorkspace:
    """The directory a session works in and whether it is still there: ``present`` (the
    same directory), ``missing`` (moved or deleted), ``replaced`` (another directory under
    that name: recreated, or another mount) or ``none`` (the session has no workspace).
    A missing or replaced workspace blocks a resume until the session is relocated or its
    open turn is abandoned."""

    path: str | None
    state: Literal["none", "present", "missing", "replaced"]

    def to_dict(self) -> dict[str, str | None]:
        return {"path": self.path, "state": self.state}


def _servers(binding: Binding) -> McpServers:
    """The binding's MCP servers, for the life of one turn (roots: its workspace)."""
    return McpServers(binding.mcp, workspace=binding.workspace)


def _workspace_of(path: str | None, recorded_id: str | None) -> SessionWorkspace:
    if path is None or recorded_id is None:
        return SessionWorkspace(path=path, state="none")
    try:
        current = workspace_id(Path(path))
    except OSError:
        return SessionWorkspace(path=path, state="missing")
    return SessionWorkspace(path=path, state="present" if current == recorded_id else "replaced")


class Sessions:
    """Sessions in one ``Storage``."""

    def __init__(
        self,
        storage: Storage,
        *,
        clock: Clock | None = None,
        ids: IdFactory | None = None,
        max_cached_sessions: int = 64,
    ) -> None:
        self.storage = storage
        self.clock = clock or SystemClock()
        self.ids = ids or Uuid7Factory(self.clock)
        # Verified folds this service has read, handed to the agents it makes: a session
        # read for its defaults is not read again to resume it (only its new tail is).
        # Bounded, so a long-lived host does not keep every session it ever touched.
        self._states = FoldCache(max_cached_sessions)
        #: the turns this service's agents run now: steers, queued messages, a cancel and
        #: a mode switch reach them
        self.turns = RunningTurns()

    @classmethod
    def local(cls, state_dir: str | os.PathLike[str]) -> Sessions:
        """Sessions in ``state_dir``, or in the object store ``$LODGER_STORE`` names."""
        return cls(Storage.open(state_dir))

    async def close(self) -> None:
        await self.storage.close()

    async def __aenter__(self) -> Sessions:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ reading

    async def list_sessions(self) -> list[str]:
        return await self.storage.log.list_sessions()

    async def state(self, session_id: str) -> SessionState:
        """The session's verified fold (reads and verifies the log once)."""
        session_id = await open_branch(self.storage, session_id)
        state = await open_fold(self.storage.log, session_id)
        self._states[session_id] = state
        return state

    def cached(self, session_id: str) -> SessionState | None:
        """The fold this service last verified (or its agents fed) for the session, if
        it still holds it. Not checked against the store: a caller compares the stored
        head with it first (``lodger.runtime.worker`` does)."""
        return self._states.get(session_id)

    async def plan(self, session_id: str) -> RecoveryPlan:
        return (await self.state(session_id)).plan()

    async def workspace(self, state: SessionState) -> SessionWorkspace:
        """Whether the directory the session works in is still the one it worked in."""
        return await asyncio.to_thread(_workspace_of, state.workspace, state.workspace_id)

    async def defaults(self, session_id: str) -> SessionDefaults:
        state = await self.state(session_id)
        return SessionDefaults(model=state.last_model, workspace=state.workspace)

    # ------------------------------------------------------------------ acting

    async def run(
        self, task: UserInput | McpInput, *, binding: Binding, session: str | None = None
    ) -> TurnResult:
        """Run one turn (a new session when ``session`` is None); an interrupted turn of
        the session is resumed first. ``task`` may carry images and documents
        (``lodger.media``), or name MCP resources and a prompt (``McpInput``: read once
        the servers are up)."""
        # the servers stop when the turn settles
        async with (
            _servers(binding) as servers,
            self._agent(binding, servers) as agent,
        ):
            if isinstance(task, McpInput):
                task = await servers.expand(task)
            return await agent.run(task, session=session, permission_mode=binding.permission_mode)

    async def resume(
        self, session_id: str, *, binding: Binding, relocate: bool = False
    ) -> TurnResult:
        """Continue the session's interrupted turn as a new run.

        ``relocate`` moves the session to ``binding.workspace`` (a moved or recreated
        directory) after checking every file the log's hashes cover there; a mismatch
        refuses, naming the files.
        """
        check_session_id(session_id)
        async with (
            _servers(binding) as servers,
            self._agent(binding, servers) as agent,
        ):
            return await agent.resume(
                session_id, relocate=relocate, model_settings=binding.model_settings
            )

    async def run_subagent(self, session_id: str, *, binding: Binding) -> ChildOutcome | None:
        """Run (or resume) the one turn of a child session handed off to a worker
        (``lodger.runtime.subagents.detached``); None when it is not a subagent or the binding
        has no subagent policy."""
        from lodger.runtime.subagents.tool import drive_detached_child  # only a worker delegates

        check_session_id(session_id)
        async with (
            _servers(binding) as servers,
            self._agent(binding, servers) as agent,
        ):
            return await drive_detached_child(agent, session_id)

    async def decide(
        self,
        session_id: str,
        call_id: str,
        decision: Decision,
        *,
        result: str | None = None,
        who: str | None = None,
    ) -> list[Event]:
        """Record an operator decision on a parked or indeterminate call, as a fact;
        ``who`` names the operator (``cli:<user>``, ``token:tok_...``)."""
        check_session_id(session_id)
        writer, state = await self._writer_and_fold(session_id)
        async with closing_writer(writer):
            return await decide(
                writer,
                state,
                call_id,
                decision,
                result=result,
                clock=self.clock,
                ids=self.ids,
                who=who,
            )

    async def abandon(
        self, session_id: str, *, reason: str | None = None, who: str | None = None
    ) -> list[Event]:
        """End the session's open turn as abandoned, as facts; needs no workspace, model or
        tools. A new turn on the session starts fresh afterwards. ``who`` names the
        operator, as ``decide`` does."""
        check_session_id(session_id)
        writer, state = await self._writer_and_fold(session_id)
        async with closing_writer(writer):
            return await abandon(
                writer, state, reason=reason, clock=self.clock, ids=self.ids, who=who
            )

    async def fork(self, parent: str, *, at: int | None = None, session: str | None = None) -> Fork:
        """Start a new session (``session``, or a fresh id) from the parent's verified
        prefix ``[0, at)``; nothing is copied. See :mod:`lodger.storage.forks`."""
        return await fork_session(
            self.storage.log,
            await open_branch(self.storage, parent),
            fork_id=session if session is not None else self.ids.new_id(),
            at=at,
            clock=self.clock,
            ids=self.ids,
        )

    async def _writer_and_fold(self, session_id: str) -> tuple[SessionWriter, SessionState]:
        """The session's writer and its verified fold (from its checkpoint when one
        matches; the writer then reads only what was appended since)."""
        log = self.storage.log
        session_id = await open_branch(self.storage, session_id)
        if not await log.exists(session_id):
            writer = await log.open_writer(session_id)  # fails closed as a full read does
            return writer, SessionState(session_id, writer.initial_events)
        state = await open_fold(log, session_id)
        writer = await log.open_writer(session_id, known=state.events)
        try:
            state.feed(writer.initial_events)
        except BaseException:
            await writer.close()
            raise
        return writer, state

    async def rewind(
        self,
        session_id: str,
        *,
        to: int | None = None,
        turn: int | None = None,
        branch: str | None = None,
        undo: bool = False,
        force: bool = False,
        who: str | None = None,
        workspace: Path | None = None,
    ) -> RewindResult:
        """Rewind the session to offset ``to`` (or before turn ``turn``) of its current
        branch (or of ``branch``), conversation and workspace; ``undo`` goes back to the
        branch the last rewind left. ``workspace`` stands in for the recorded one (a
        worker-run session's, restored from its snapshot). See
        :mod:`lodger.runtime.rewind`."""
        return await rewind_session(
            self.storage,
            session_id,
            to=to,
            turn=turn,
            branch=branch,
            undo=undo,
            force=force,
            who=who,
            clock=self.clock,
            ids=self.ids,
            workspace=workspace,
        )

    def _agent(self, binding: Binding, servers: McpServers) -> Agent:
        agent = Agent(
            model=binding.model,
            tools=[*binding.tools, *servers.tools()],
            storage=self.storage,
            workspace=binding.workspace,
            permissions=binding.permissions,
            code_mode=binding.code_mode,
            subagents=binding.subagents,
            output_mode=binding.output_mode,
            model_settings=binding.model_settings,
            limits=Limits(
                max_steps=binding.max_steps, usage=binding.usage, budgets=binding.budgets
            ),
            hooks=Hooks(
                approver=binding.approver,
                on_event=binding.on_event,
                on_text=binding.on_text,
                elicitor=binding.elicitor,
            ),
            services=Services(clock=self.clock, ids=self.ids, folds=self._states, turns=self.turns),
            compaction=binding.compaction,
        )
        agent.registry.add_source(servers)  # a server's list_changed: the next step
        agent.registry.add_prompt_section(servers.updates)  # resources that changed
        return agent

    async def compact(
        self,
        session_id: str,
        *,
        instructions: str | None = None,
        binding: Binding | None = None,
    ) -> Compacted:
        """Compact the session's context now, as a ``compacted`` fact (see
        ``Agent.compact``). The summary is written by ``binding.compaction.model``, else
        ``binding.model``, else the model the session last ran with; refused while a run
        of the session is open."""
        check_session_id(session_id)
        if binding is None:
            state = await self.state(session_id)
            if state.last_model is None:
                raise UsageError(
                    f"session {session_id!r} has never run a model to compact it with",
                    hint="give a binding with the model that should write the summary",
                    code="compaction_refused",
                    session_id=session_id,
                )
            binding = Binding(model=state.last_model)
        async with self._agent(binding, McpServers(())) as agent:
            return await agent.compact(session_id, instructions=instructions)

    # ------------------------------------------------------------------ steering

    @property
    def log(self) -> EventLog:
        return self.storage.log

    @contextlib.asynccontextmanager
    async def open_session(
        self, session_id: str
    ) -> AsyncIterator[tuple[SessionWriter, SessionState]]:
        """The session's writer and verified fold, for facts appended outside a turn."""
        writer, state = await self._writer_and_fold(session_id)
        async with closing_writer(writer):
            yield writer, state

    def journal_for(self, writer: SessionWriter, state: SessionState) -> Journal:
        return Journal(writer, state, clock=self.clock, ids=self.ids)

    def busy(self, session_id: str) -> bool:
        """Whether a turn of the session runs in this process now."""
        control = self.turns.of_session(session_id)  # a rewound one's: on its branch
        return control is not None and control.busy

    async def steer(self, session_id: str, text: str, *, who: str | None = None) -> Steered:
        """``Agent.steer`` for a session this service runs (or a dormant one)."""
        branch = await branch_of(self.turns, self.storage, session_id)
        return await _followups.steer(self, branch, text, who)

    async def enqueue(
        self, session_id: str, text: str, *, policy: str = "enqueue", who: str | None = None
    ) -> QueuedMessage:
        """``Agent.enqueue``: a follow-up message with its policy, as a fact."""
        branch = await branch_of(self.turns, self.storage, session_id)  # a rewound one: its branch
        return await _followups.enqueue(self, branch, text, policy, who)

    async def queue(self, session_id: str) -> list[QueuedMessage]:
        return await _followups.queue_of(
            self, await branch_of(self.turns, self.storage, session_id)
        )

    async def change_queued(
        self,
        session_id: str,
        message_id: str,
        action: _followups.Change,
        *,
        text: str | None = None,
        position: int | None = None,
        who: str | None = None,
    ) -> list[QueuedMessage]:
        """Edit, move or retract a queued message (a ``queue_changed`` fact by ``who``)."""
        branch = await branch_of(self.turns, self.storage, session_id)
        return await _followups.change_queued(
            self, branch, message_id, action, text=text, position=position, who=who
        )

    async def run_queued(self, session_id: str, *, binding: Binding) -> TurnResult | None:
        """Run the session's next queued message as a turn (None: nothing is queued)."""
        check_session_id(session_id)
        async with (
            _servers(binding) as servers,
            self._agent(binding, servers) as agent,
        ):
            return await agent.run_queued(session_id)

    async def cancel(
        self,
        session_id: str,
        *,
        who: str | None = None,
        reason: str = "",
        settle_open: bool = True,
    ) -> CancelOutcome:
        """Cancel the session's running turn, here or in another process sharing this
        state directory (see ``Agent.cancel``); needs no model, tools or workspace. An
        open turn nobody runs is ended cancelled, unless ``settle_open`` is False (a
        worker between its turns: the request waits for the turn about to run)."""
        request = CancelRequest(who=who, reason=reason)
        branch = await branch_of(self.turns, self.storage, session_id)
        idle = self._cancel_idle if settle_open else None
        return await cancel_turn(self.turns, self.storage, branch, request, idle=idle)

    async def _cancel_idle(self, session_id: str, request: CancelRequest) -> CancelOutcome:
        writer, state = await self._writer_and_fold(session_id)
        async with closing_writer(writer):
            return await commit_cancel(writer, state, request, clock=self.clock, ids=self.ids)

    async def set_permission_mode(
        self, session_id: str, mode: str, *, who: str | None = None
    ) -> ModeOutcome:
        """Switch the session's permission mode (see ``Agent.set_permission_mode``)."""
        checked = check_mode(mode)
        branch = await branch_of(self.turns, self.storage, session_id)
        return await switch_mode(
            self.turns, self.storage, branch, checked, who, idle=self._switch_idle
        )

    async def _switch_idle(
        self, session_id: str, mode: PermissionMode, who: str | None
    ) -> ModeOutcome:
        writer, state = await self._writer_and_fold(session_id)
        async with closing_writer(writer):
            return await commit_mode(writer, state, mode, who, clock=self.clock, ids=self.ids)

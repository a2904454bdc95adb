"""The agent: a model, bound tools and a place to keep sessions.

>>> agent = Agent(model=ScriptedModel([{"text": "hello"}]), tools=[add])
>>> result = await agent.run("say hello")
>>> result.answer
'hello'

``Agent`` composes the engine (``lodger.engine``: the loop, the call pipeline, resume)
with storage (``lodger.storage``) and keeps each session's verified fold between turns,
so a new turn on an open session reads only what it has not seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator, Callable, Coroutine, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from lodger.authority import Authorities
from lodger.engine.checkpoint import checkpoint_due, open_fold, save_checkpoint
from lodger.engine.compaction import CompactionPolicy, compact_by_hand
from lodger.engine.control import CancelOutcome, CancelRequest
from lodger.engine.journal import Journal
from lodger.engine.loop import Engine, RunUsage, TurnResult, TurnStatus
from lodger.engine.modelsettings import check_settings
from lodger.engine.output import OutputSpec
from lodger.engine.permissions import PermissionGate
from lodger.engine.queue import QueuedMessage, Steered, StopRequest
from lodger.engine.resume import Decision, abandon, decide
from lodger.engine.settings import Hooks, Limits, Retries, Services
from lodger.engine.state import SessionState
from lodger.engine.steering import RunningTurns, TurnControl
from lodger.errors import SessionNotFoundError, UsageError
from lodger.events import Compacted, Event, PermissionMode
from lodger.ids import Clock, IdFactory
from lodger.media import UserInput
from lodger.providers import make_model
from lodger.providers.base import Model, ModelSettings, OutputMode, TextSink
from lodger.recovery.plan import RecoveryPlan
from lodger.runtime import _followups, _local_control, _session_control
from lodger.runtime._session_control import ModeOutcome
from lodger.runtime._writers import close_after_failure
from lodger.runtime.replay_report import refuse_replay
from lodger.runtime.rewind import RewindResult, open_branch, rewind_session
from lodger.runtime.spend import LogSpend
from lodger.runtime.streaming import TurnStream
from lodger.runtime.subagents.policy import SubagentPolicy
from lodger.storage import EventLog, SessionWriter, Storage, check_session_id
from lodger.storage.artifacts import ArtifactStore, FileArtifactStore
from lodger.storage.forks import read_inherited
from lodger.storage.snapshots import WorkspaceSnapshotter
from lodger.substrates.codemode import CellLimits, CodeMode, Language, exec_tool
from lodger.tools.policy import PermissionPolicy
from lodger.tools.registry import ToolRegistry
from lodger.tools.search import attach_tool_search
from lodger.tools.spec import Tool

__all__ = ["DEFAULT_SYSTEM", "Agent", "RunUsage", "SessionHandle", "TurnResult", "TurnStatus"]

_UNSET: Any = object()

DEFAULT_SYSTEM = (
    "You are a careful software agent working in a workspace. Use the tools to inspect and "
    "change files; prefer small, verifiable steps. Calls you make in one step run in "
    "parallel, so only batch calls that do not depend on each other. When the task is "
    "done, answer with a short summary of what you did."
)


class SessionHandle:
    """Read access to one session's log."""

    def __init__(self, log: EventLog, session_id: str) -> None:
        self.log = log
        self.session_id = session_id

    async def events(self) -> list[Event]:
        return await self.log.read_all(self.session_id)

    async def verify(self) -> tuple[int, str]:
        prefix = await self.log.verify(self.session_id)
        return prefix.high_water, prefix.digest


class Agent:
    """A model, bound tools and a place to keep sessions.

    ``model`` is a ``Model`` (yours to close) or a spec as ``make_model`` reads it
    (``"openai:gpt-4.1"``, ``"test"``, ``"openai:gpt-4.1|anthropic:claude-sonnet-4-5"`` for
    a ``FallbackModel``), which the agent makes and closes with itself; so is a spec given
    as ``subagents.model``.

    ``storage`` is where sessions live: a ``Storage`` (the caller's: the agent does not
    close it), or the state directory of the embedded default (default ``.lodger``: a
    SQLite log and file artifacts, closed with the agent). ``workspace`` is the directory
    file tools work in. ``snapshots`` records a content-addressed, incremental snapshot of
    the workspace with each turn's end (a ``workspace_snapshot`` fact; its files go to
    the artifact store): on by default when there is a workspace (a rewind restores the
    files from them; ``snapshots=False`` turns them off). ``code_mode`` binds the ``exec``
    tool, ``subagents`` the ``delegate`` tool.

    ``model_settings`` (temperature, max_tokens, ...) go with every request; a run's
    ``model_settings`` override them field by field. ``output_mode`` says how the output
    type's schema reaches the model (``"native"``, ``"tool"`` or ``"prompted"``; default:
    the model's own preference).

    The rest comes in groups (``lodger.engine.settings``), each passed whole to the
    engine: ``limits`` (steps, context budget, call timeout, output retries, usage
    limits and money budgets: a turn that reaches one parks, see ``lodger.engine.budgets``),
    ``retries`` (of model requests), ``hooks`` (before and after calls, events, text, the
    approver) and ``services`` (clock and ids, authorities, executor, shared folds).
    Nothing here is global: clocks and ids are injected for tests.

    ``compaction`` (a ``CompactionPolicy``, kept as ``limits.compaction``) summarizes the
    context when it grows past the policy's threshold or budget and offers the ``recall``
    tool; ``compact`` does it by hand (``lodger.engine.compaction``).
    """

    #: this agent drives a replay (``lodger.runtime.replay``): it may run turns on a
    #: replay's session, whose tools it answers without the world
    replaying: bool = False

    def __init__(
        self,
        *,
        model: Model | str,
        tools: Sequence[Tool] = (),
        system: str = DEFAULT_SYSTEM,
        workspace: str | os.PathLike[str] | None = None,
        output_type: Any = None,
        output_mode: OutputMode | None = None,
        model_settings: ModelSettings | None = None,
        deps: Any = None,
        permissions: PermissionPolicy | None = None,
        storage: Storage | str | os.PathLike[str] = ".lodger",
        snapshots: bool | None = None,
        code_mode: Language | CodeMode | None = None,
        subagents: SubagentPolicy | None = None,
        limits: Limits | None = None,
        retries: Retries | None = None,
        hooks: Hooks | None = None,
        services: Services | None = None,
        compaction: CompactionPolicy | None = None,
    ) -> None:
        # A model named by its spec is the agent's: it is made here and closed with it.
        self._owned_models: list[Model] = []
        model = self._own(model)
        if subagents is not None and isinstance(subagents.model, str):
            subagents = dataclasses.replace(subagents, model=self._own(subagents.model))
        self._owns_storage = not isinstance(storage, Storage)
        if not isinstance(storage, Storage):
            storage = Storage.local(storage)
        self.storage = storage
        hooks = hooks or Hooks()
        services = services or Services()
        self.registry = ToolRegistry(tools)
        # Deferred tools are found through tool_search and listed in the system prompt.
        self.tool_search = attach_tool_search(self.registry)
        # Code mode: an ``exec`` tool whose cells call the nestable tools
        # (lodger.substrates.codemode).
        self.code_mode = _code_mode(code_mode, None)
        if self.code_mode is not None:
            self.registry.bind(_exec_tool(self.registry, self.code_mode))
        # Subagents: a ``delegate`` tool whose calls run child sessions (lodger.runtime.subagents).
        self.subagents = subagents
        if subagents is not None:
            from lodger.runtime.subagents.tool import delegate_tool  # loads the engine it drives

            self.registry.bind(delegate_tool(self, subagents))
        self.workspace = Path(workspace).resolve() if workspace is not None else None
        if limits is not None and limits.budgets.any:
            limits.budgets.prices.require(model.spec)  # a model with no price: say so now
        hidden = storage.hidden_paths()
        self.engine = Engine(
            snapshotter=_snapshotter(storage, self.workspace, snapshots),
            model=model,
            registry=self.registry,
            system=system,
            permissions=PermissionGate(permissions or PermissionPolicy(), hooks.approver),
            artifacts=storage.artifacts,
            workspace=self.workspace,
            hidden=hidden,
            limits=limits or Limits(),
            retries=retries or Retries(),
            hooks=hooks,
            services=services,
            output=OutputSpec(output_type) if output_type is not None else None,
            output_mode=_check_mode(output_mode),
            settings=check_settings(model_settings or ModelSettings()),
            deps=deps,
            spend=LogSpend.for_log(storage.log),
        )
        self._compacting(compaction)
        # The verified fold of each session this agent has open, kept between turns
        # (``services.folds`` shares them with whoever made this agent, as ``Sessions`` does).
        self._owns_states = services.folds is None
        self._states: MutableMapping[str, SessionState] = (
            {} if services.folds is None else services.folds
        )
        self._runner: asyncio.Runner | None = None

    @property
    def clock(self) -> Clock:
        return self.engine.services.clock

    @property
    def ids(self) -> IdFactory:
        return self.engine.services.ids

    @property
    def authorities(self) -> Authorities:
        """File leases, actors and capacity for this agent's calls; give every agent that
        shares a workspace the same one so their calls meet on the same leases."""
        return self.engine.services.authorities

    @authorities.setter
    def authorities(self, value: Authorities) -> None:
        self.engine.services = dataclasses.replace(self.engine.services, authorities=value)

    @property
    def model(self) -> Model:
        return self.engine.model

    @property
    def log(self) -> EventLog:
        return self.storage.log

    @property
    def artifacts(self) -> ArtifactStore:
        return self.storage.artifacts

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _compacting(self, policy: CompactionPolicy | None) -> None:
        """Put ``policy`` (or the one in ``limits``) in the engine's limits, its summary
        model made when it is named by a spec; a policy offers the ``recall`` tool,
        which fetches summarized facts back from the log."""
        engine = self.engine
        policy = policy if policy is not None else engine.limits.compaction
        if policy is None:
            return
        if isinstance(policy.model, str):
            policy = dataclasses.replace(policy, model=self._own(policy.model))
        engine.limits = dataclasses.replace(engine.limits, compaction=policy)
        from lodger.tools.recall import recall_tool  # only a compacting agent offers it

        self.registry.bind(
            recall_tool(self.storage.log, self.storage.artifacts, known=self._known_events)
        )

    def _known_events(self, session_id: str) -> Sequence[Event] | None:
        """The events of a session this agent holds the fold of (inherited ones first)."""
        state = self._states.get(session_id)
        if state is None:
            return None
        inherited = state.inherited or ()
        return [*inherited, *state.events] if inherited else state.events

    def _own(self, model: Model | str) -> Model:
        if not isinstance(model, str):
            return model
        made = make_model(model)  # a bad spec is make_model's ConfigError
        self._owned_models.append(made)
        return made

    async def close(self) -> None:
        if self._owns_states:
            self._states.clear()
        try:
            while self._owned_models:
                await self._owned_models.pop().aclose()
        finally:
            if self._owns_storage:
                await self.storage.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_sync()

    def close_sync(self) -> None:
        """``close`` for code that uses ``run_sync``: also ends the agent's event loop."""
        runner = self._sync_runner()
        try:
            runner.run(self.close())
        finally:
            runner.close()
            self._runner = None

    def _sync_runner(self) -> asyncio.Runner:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise UsageError(
                "run_sync was called from inside a running event loop",
                hint="inside async code, await agent.run(...) instead",
                code="sync_in_async",
            )
        if self._runner is None:
            # One loop for every sync call: model clients and stores stay bound to it.
            self._runner = asyncio.Runner()
        return self._runner

    def run_sync(
        self,
        task: UserInput,
        *,
        session: str | None = None,
        deps: Any = _UNSET,
        output_type: Any = _UNSET,
        output_mode: OutputMode | None = None,
        model_settings: ModelSettings | None = None,
    ) -> TurnResult:
        """``run`` for code that is not async: ``Agent(...).run_sync("task").output``.

        The agent keeps one event loop for its sync calls; ``with Agent(...) as agent:``
        (or ``agent.close_sync()``) closes it and the agent's storage.
        """
        return self._sync_runner().run(
            self.run(
                task,
                session=session,
                deps=deps,
                output_type=output_type,
                output_mode=output_mode,
                model_settings=model_settings,
            )
        )

    def _engine_for(
        self,
        *,
        deps: Any = _UNSET,
        output_type: Any = _UNSET,
        on_event: Callable[[Event], None] | None = None,
        on_text: TextSink | None = None,
        code_mode: Any = _UNSET,
        output_mode: OutputMode | None = None,
        model_settings: ModelSettings | None = None,
    ) -> Engine:
        """This agent's engine with one call's deps, output type and mode, model
        settings, code mode and sinks."""
        changes: dict[str, Any] = {}
        if output_mode is not None:
            changes["output_mode"] = _check_mode(output_mode)
        if model_settings is not None:
            changes["run_settings"] = check_settings(model_settings)
        if code_mode is not _UNSET:
            # one run's code mode: its own registry, with the exec tool added, replaced
            # (another language) or left out (None)
            registry = self.registry.copy(without=("exec",))
            mode = _code_mode(code_mode, self.code_mode)
            if mode is not None:
                registry.bind(_exec_tool(registry, mode))
            changes["registry"] = registry
        if deps is not _UNSET:
            changes["deps"] = deps
        if output_type is not _UNSET:
            changes["output"] = OutputSpec(output_type) if output_type is not None else None
        hooks = self.engine.hooks
        if on_event is not None:
            hooks = dataclasses.replace(hooks, on_event=_both(hooks.on_event, on_event))
        if on_text is not None:
            hooks = dataclasses.replace(hooks, on_text=_both(hooks.on_text, on_text))
        if hooks is not self.engine.hooks:
            changes["hooks"] = hooks
        return dataclasses.replace(self.engine, **changes) if changes else self.engine

    def stream(
        self,
        task: UserInput,
        *,
        session: str | None = None,
        deps: Any = _UNSET,
        output_type: Any = _UNSET,
        output_mode: OutputMode | None = None,
        model_settings: ModelSettings | None = None,
    ) -> TurnStream:
        """Run one turn as an async iterator of ``TextDelta``, ``FactCommitted`` and
        finally ``TurnFinished`` items (see ``lodger.runtime.streaming``); the stream's
        ``steer`` sends the running turn a message, its ``cancel`` ends the turn cancelled."""
        session_id = session if session is not None else self.ids.new_id()

        async def start(
            on_event: Callable[[Event], None], on_text: Callable[[str], None]
        ) -> TurnResult:
            engine = self._engine_for(
                deps=deps,
                output_type=output_type,
                on_event=on_event,
                on_text=on_text,
                output_mode=output_mode,
                model_settings=model_settings,
            )
            return await self._run(engine, task, session_id)

        async def steer(text: str, who: str | None) -> Steered:
            return await self.steer(session_id, text, who=who)

        async def cancel(who: str | None, reason: str) -> CancelOutcome:
            return await self.cancel(session_id, who=who, reason=reason)

        return TurnStream(start, session_id=session_id, steer=steer, cancel=cancel)

    def session(self, session_id: str) -> SessionHandle:
        return SessionHandle(self.log, session_id)

    # ------------------------------------------------------------------ sessions

    async def _open(self, session_id: str) -> tuple[SessionWriter, SessionState]:
        """The session's writer and its fold; reads only events this agent has not seen."""
        cached = self._states.get(session_id)
        try:
            if cached is None and await self.log.exists(session_id):
                # a session this agent has not read: open its fold (from its checkpoint
                # when one matches); the writer then reads only what was appended since
                cached = await open_fold(self.log, session_id)
                self._states[session_id] = cached
            writer = await self.log.open_writer(
                session_id, known=cached.events if cached is not None else ()
            )
        except BaseException:
            self._states.pop(session_id, None)
            raise
        if cached is None:
            cached = SessionState(session_id)
            self._states[session_id] = cached
        try:
            cached.feed(writer.initial_events)
            if cached.needs_inheritance:
                # a fork: the model's context starts with the parent's history
                cached.inherit(await read_inherited(self.log, session_id, cached.events))
        except BaseException:
            self._states.pop(session_id, None)
            await writer.close()
            raise
        return writer, cached

    @contextlib.asynccontextmanager
    async def open_session(
        self, session_id: str
    ) -> AsyncIterator[tuple[SessionWriter, SessionState]]:
        """The session's writer and its verified fold, for a block that drives the engine
        on it (each turn here does; so does the ``delegate`` tool for a child session).
        The writer is closed after the block; the fold is kept for the next turn, unless
        the block fails: it may then hold less than the log (a failed commit), so it is
        read again next time."""
        session_id = await open_branch(self.storage, session_id)
        writer, state = await self._open(session_id)
        try:
            yield writer, state
        except BaseException as first:
            self._states.pop(session_id, None)
            await close_after_failure(writer, first)
            raise
        await writer.close()

    async def run(
        self,
        task: UserInput,
        *,
        session: str | None = None,
        deps: Any = _UNSET,
        output_type: Any = _UNSET,
        code_mode: Language | CodeMode | None = _UNSET,
        output_mode: OutputMode | None = None,
        model_settings: ModelSettings | None = None,
        permission_mode: str | None = None,
    ) -> TurnResult:
        """Run one turn of ``task`` on ``session`` (a new session when None).

        ``task`` is text, or a list of text and media (``BinaryContent``, ``ImageUrl``,
        ``DocumentUrl``; see ``lodger.media``): the texts are the input, the media are
        stored as artifacts and listed in the turn's ``turn_started`` fact.
        ``deps`` reaches tools as ``ToolContext.deps`` (and hooks as ``CallInfo.deps``);
        ``output_type`` overrides the agent's for this turn; ``code_mode`` binds the
        ``exec`` tool for this turn only ("javascript" or "python"; None leaves it out).
        ``output_mode`` and ``model_settings`` override the agent's for this turn (the
        settings field by field). ``permission_mode`` is the mode the turn starts in (a
        ``permission_mode_changed`` committed with its start when the session is in
        another; see ``set_permission_mode``). The result's ``output`` is the validated
        value, ``usage`` the tokens, ``commits`` the durable appends.
        """
        engine = self._engine_for(
            deps=deps,
            output_type=output_type,
            code_mode=code_mode,
            output_mode=output_mode,
            model_settings=model_settings,
        )
        mode = None if permission_mode is None else _session_control.check_mode(permission_mode)
        return await self._run(engine, task, session, mode)

    async def _run(
        self,
        engine: Engine,
        task: UserInput,
        session: str | None,
        mode: PermissionMode | None = None,
    ) -> TurnResult:
        session_id = session if session is not None else self.ids.new_id()
        async with self._turn(session_id) as (writer, state, control):
            journal = engine.journal(writer, state)
            started = engine.start_turn(journal, task, mode=mode)
            result = await self._controlled(control, journal, started)
            if checkpoint_due(state):  # while this writer holds the session: nothing feeds it
                await save_checkpoint(self.log, state)
            return result

    @contextlib.asynccontextmanager
    async def _turn(
        self, session_id: str
    ) -> AsyncIterator[tuple[SessionWriter, SessionState, TurnControl]]:
        """``open_session`` for a block that drives a turn: steers and queued messages
        sent meanwhile, a cancel and a mode switch reach it through its ``TurnControl``
        (``lodger.engine.steering``), registered under the branch the session's name
        leads to (a rewound session's current one), as the engine finds it."""
        session_id = await open_branch(self.storage, session_id)
        control = self.turns.begin(session_id)
        try:
            async with self.open_session(session_id) as (writer, state):
                if not self.replaying:
                    refuse_replay(session_id, state.events)  # its tools would be real ones
                try:
                    yield writer, state, control
                finally:
                    await control.seal()  # before the writer closes: nothing more through it
        finally:
            self.turns.end(control)

    async def resume(
        self,
        session_id: str,
        *,
        relocate: bool = False,
        deps: Any = _UNSET,
        model_settings: ModelSettings | None = None,
    ) -> TurnResult:
        """Resume the session's interrupted turn as a new run.

        The run asks the model with the settings the turn was asked with (its last
        ``step_started.settings``), with ``model_settings`` over them.

        With ``relocate``, the session may move to this agent's workspace (another
        directory than the one it worked in) when every file the log's hashes cover
        holds what the log says; the new run records the move.
        Raises ``ResumeBlockedError`` naming every parked operation or failed invariant.
        """
        async with self._turn(session_id) as (writer, state, control):
            if not state.events:
                raise SessionNotFoundError(
                    f"no log for session {session_id!r}", session_id=session_id
                )
            engine = self._engine_for(deps=deps, model_settings=model_settings)
            journal = engine.journal(writer, state)
            result = await self._controlled(
                control, journal, engine.resume(journal, relocate=relocate)
            )
            if checkpoint_due(state):
                await save_checkpoint(self.log, state)
            return result

    async def _controlled(
        self, control: TurnControl, journal: Journal, work: Coroutine[Any, Any, TurnResult]
    ) -> TurnResult:
        """Run ``work`` as the session's running turn, under its ``control``: a cancel or
        a mode switch reaches it from this process (``turns``) or, through the state
        directory, from another."""
        state_dir = self.storage.control_dir
        if state_dir is None:
            return await control.run(journal, work)
        turns, session_id = self.turns, control.session_id

        def handler(token: str) -> _local_control.Handler:
            return _session_control.request_handler(turns, session_id, token)

        async with _local_control.announced(state_dir, session_id, handler):
            return await control.run(journal, work)

    async def cancel(
        self, session_id: str, *, who: str | None = None, reason: str = ""
    ) -> CancelOutcome:
        """Cancel the session's running turn: queued calls never start, calls past T1
        settle and are recorded, and the turn ends ``cancelled`` (``cancel_requested``,
        ``run_ended`` and ``turn_ended`` cancelled, committed together). The turn may
        run in this process or, sharing this state directory, in another; this waits
        until it ended. Idempotent: a second cancel (``already_cancelling``) or one of a
        session that runs nothing (``not_running``, ``unknown_session``) writes nothing.
        """
        check_session_id(session_id)
        request = CancelRequest(who=who, reason=reason)
        branch = await _session_control.branch_of(self.turns, self.storage, session_id)
        return await _session_control.cancel_turn(
            self.turns, self.storage, branch, request, idle=self._cancel_idle
        )

    async def _cancel_idle(self, session_id: str, request: CancelRequest) -> CancelOutcome:
        async with self.open_session(session_id) as (writer, state):
            return await _session_control.commit_cancel(
                writer, state, request, clock=self.clock, ids=self.ids
            )

    async def set_permission_mode(
        self, session_id: str, mode: str, *, who: str | None = None
    ) -> ModeOutcome:
        """Switch the session's permission mode (``plan``, ``ask``, ``accept_edits``,
        ``full_auto``; see ``lodger.engine.permissions``) as a ``permission_mode_changed``
        fact, committed by whoever writes the session now; it applies from the next step.
        The project's deny rules hold in every mode. The same mode again writes nothing
        (``unchanged``)."""
        check_session_id(session_id)
        checked = _session_control.check_mode(mode)
        branch = await _session_control.branch_of(self.turns, self.storage, session_id)
        return await _session_control.switch_mode(
            self.turns, self.storage, branch, checked, who, idle=self._switch_idle
        )

    async def _switch_idle(
        self, session_id: str, mode: PermissionMode, who: str | None
    ) -> ModeOutcome:
        async with self.open_session(session_id) as (writer, state):
            return await _session_control.commit_mode(
                writer, state, mode, who, clock=self.clock, ids=self.ids
            )

    async def recovery_plan(self, session_id: str) -> RecoveryPlan:
        """What resume would do now: every call of the open turn, its status and action."""
        session_id = await open_branch(self.storage, session_id)
        events = await self.log.read_all(session_id)
        return SessionState(session_id, events).plan()

    async def decide(
        self,
        session_id: str,
        call_id: str,
        decision: Decision,
        *,
        result: str | None = None,
    ) -> list[Event]:
        """Record an operator decision on a parked (or indeterminate) call."""
        async with self.open_session(session_id) as (writer, state):
            return await decide(
                writer, state, call_id, decision, result=result, clock=self.clock, ids=self.ids
            )

    async def abandon(self, session_id: str, *, reason: str | None = None) -> list[Event]:
        """End the session's open turn as abandoned by the operator, as facts."""
        async with self.open_session(session_id) as (writer, state):
            return await abandon(writer, state, reason=reason, clock=self.clock, ids=self.ids)

    async def compact(self, session_id: str, *, instructions: str | None = None) -> Compacted:
        """Compact the session's context now (``lodger.engine.compaction``): a summary of
        its projection, recorded as a ``compacted`` fact, under the agent's compaction
        policy (the default one when it has none). ``instructions`` go to the summarizer.
        Refused while a run is open; a failed summary raises ``ProviderError``
        (``compaction_failed``) after its ``compaction_failed`` fact is committed."""
        engine = self.engine
        async with self.open_session(session_id) as (writer, state):
            if not state.events:
                raise SessionNotFoundError(
                    f"no log for session {session_id!r}", session_id=session_id
                )
            policy = engine.limits.compaction or CompactionPolicy()
            return await compact_by_hand(
                engine.journal(writer, state),
                policy.summarizer(engine.model),
                policy,
                instructions=instructions,
                ask=engine.ask_unlogged,
            )

    # ------------------------------------------------------------------ steering

    @property
    def turns(self) -> RunningTurns:
        """The turns this agent (and whoever shares its ``services.turns``) runs now."""
        return self.engine.services.turns

    def journal_for(self, writer: SessionWriter, state: SessionState) -> Journal:
        """A journal for facts this agent appends outside a turn (a queue change)."""
        return self.engine.journal(writer, state)

    def busy(self, session_id: str) -> bool:
        """Whether a turn of the session runs here now (and has not begun to end)."""
        control = self.turns.of_session(session_id)  # a rewound one's: on its branch
        return control is not None and control.busy

    async def steer(self, session_id: str, text: str, *, who: str | None = None) -> Steered:
        """Send ``text`` to the session's running turn: committed now as
        ``steer_received``, read by the model at the next provider boundary (the step
        that carries it records ``steer_delivered``). With no turn running here, or
        after its last step, it is queued as the session's next turn (``status``
        ``queued``; ``run_queued`` runs it)."""
        branch = await _session_control.branch_of(self.turns, self.storage, session_id)
        return await _followups.steer(self, branch, text, who)

    async def enqueue(
        self, session_id: str, text: str, *, policy: str = "enqueue", who: str | None = None
    ) -> QueuedMessage:
        """Queue ``text`` as a later turn of the session (``message_queued``), with its
        policy: ``enqueue`` waits for the running turn; ``reject`` raises
        ``HostConflictError`` (``session_busy``) while one runs; ``interrupt`` stops the
        running turn at its next step boundary (its calls settle) and runs next;
        ``rollback`` abandons it before its next calls start and runs next."""
        branch = await _session_control.branch_of(self.turns, self.storage, session_id)
        return await _followups.enqueue(self, branch, text, policy, who)

    async def queue(self, session_id: str) -> list[QueuedMessage]:
        """The session's follow-up queue, in the order it runs (read from its log)."""
        return await _followups.queue_of(
            self, await _session_control.branch_of(self.turns, self.storage, session_id)
        )

    async def edit_queued(
        self,
        session_id: str,
        message_id: str,
        *,
        text: str | None = None,
        position: int | None = None,
        who: str | None = None,
    ) -> list[QueuedMessage]:
        """Change a queued message's text and/or move it to ``position`` (0: next),
        each change a ``queue_changed`` fact naming ``who``; the queue after it."""
        if text is None and position is None:
            raise UsageError("nothing to change: give text, position or both", code="usage")
        session_id = await _session_control.branch_of(self.turns, self.storage, session_id)
        queue: list[QueuedMessage] = []
        if text is not None:
            queue = await _followups.change_queued(
                self, session_id, message_id, "edit", text=text, who=who
            )
        if position is not None:
            queue = await _followups.change_queued(
                self, session_id, message_id, "move", position=position, who=who
            )
        return queue

    async def retract_queued(
        self, session_id: str, message_id: str, *, who: str | None = None
    ) -> list[QueuedMessage]:
        """Take a message out of the queue before it is delivered; the queue after it."""
        branch = await _session_control.branch_of(self.turns, self.storage, session_id)
        return await _followups.change_queued(self, branch, message_id, "retract", who=who)

    async def run_queued(self, session_id: str) -> TurnResult | None:
        """Run the next queued message of the session as a turn (None: the queue is
        empty). Its delivery (``queue_changed`` delivered) commits with the turn's
        start, so a message runs once. An ``interrupt`` or ``rollback`` message abandons
        an open turn first (one a stop left parked or interrupted); any other resumes it."""
        async with self._turn(session_id) as (writer, state, control):
            if not state.queue:
                return None
            head = state.queue[0]
            if head.policy in ("interrupt", "rollback") and state.open_turn is not None:
                reason = StopRequest(message_id=head.message_id, policy=head.policy).reason
                await abandon(writer, state, reason=reason, clock=self.clock, ids=self.ids)
            engine = self.engine
            journal = engine.journal(writer, state)
            started = engine.start_turn(journal, head.text, queued=head)
            result = await self._controlled(control, journal, started)
            if checkpoint_due(state):
                await save_checkpoint(self.log, state)
            return result

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
    ) -> RewindResult:
        """Rewind the session, conversation and workspace, to offset ``to`` or before turn
        ``turn`` of its current branch (or ``branch``); ``undo`` undoes the last rewind.
        The session's name then leads to the new branch (see :mod:`lodger.runtime.rewind`)."""
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
        )


_MODES = ("native", "tool", "prompted")


def _check_mode(mode: OutputMode | None) -> OutputMode | None:
    if mode is not None and mode not in _MODES:
        raise UsageError(
            f"unknown output_mode {mode!r}",
            hint="use 'native', 'tool' or 'prompted' (or None for the model's own)",
            code="output_mode",
        )
    return mode


def _code_mode(value: Language | CodeMode | None, agent: CodeMode | None) -> CodeMode | None:
    """A code mode given by its language takes the agent's cell limits (or the default)."""
    if value is None or isinstance(value, CodeMode):
        return value
    return CodeMode(language=value, limits=agent.limits if agent is not None else CellLimits())


def _exec_tool(registry: ToolRegistry, mode: CodeMode) -> Tool:
    return exec_tool(registry, language=mode.language, limits=mode.limits)


def _snapshotter(
    storage: Storage, workspace: Path | None, enabled: bool | None
) -> WorkspaceSnapshotter | None:
    """Snapshots at each turn's end, on by default for every session with a workspace:
    a worker elsewhere wakes an object store's sessions from them, and a rewind restores
    a local session's files from them (``snapshots=False`` turns them off)."""
    if enabled is None:
        enabled = workspace is not None
    if not enabled:
        return None
    if workspace is None:
        raise UsageError(
            "workspace snapshots need a workspace",
            hint="pass workspace=... to the agent, or leave snapshots off",
            code="usage",
        )
    # the stat cache lives beside a local state's file artifacts (never in an object store)
    local = isinstance(storage.artifacts, FileArtifactStore) and storage.state_dir is not None
    cache = storage.state_dir / "snapcache" if local and storage.state_dir else None
    return WorkspaceSnapshotter(storage.artifacts, cache_dir=cache)


def _both(first: Callable[[Any], None] | None, second: Callable[[Any], None]) -> Any:
    if first is None:
        return second

    def both(item: Any) -> None:
        first(item)
        second(item)

    return both

"""The engine: Reason -> Act -> Observe over turns, runs and steps, and resume.

A turn is one user input and everything until the agent answers, fails, hits its step
limit or is stopped. Each step fixes its visible tools, asks the model for the next
output from a projection of the committed log, and runs the proposed calls as one
batch through the call pipeline. Every fact is committed before anything acts on it.
Resume is a mode of the same driver: it claims the prefix, applies the recovery plan
(``lodger.engine.resume``) and then drives the turn on as a new run.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from lodger._core.records import record
from lodger.engine.bodies import model_output, proposed_call, step_started
from lodger.engine.bounding import storable_text
from lodger.engine.budgets import SpendReader, check_before_calls, check_before_request, describe
from lodger.engine.compaction import compact_if_over, elision_budget, request_overhead
from lodger.engine.context import RunContext
from lodger.engine.control import CancelRequest
from lodger.engine.envelope import Envelope, streaming_at
from lodger.engine.journal import Journal
from lodger.engine.media import load_media, unsupported_media
from lodger.engine.modelsettings import settings_from_mapping
from lodger.engine.output import OutputInvalid, OutputSpec
from lodger.engine.permissions import PermissionGate
from lodger.engine.pipeline import CallPipeline, StepScope
from lodger.engine.queue import QueuedMessage, StopRequest, pending_steers
from lodger.engine.resume import resume_run
from lodger.engine.retries import complete
from lodger.engine.settings import Hooks, Limits, Retries, Services
from lodger.engine.state import SessionState
from lodger.engine.steering import TurnControl, current_control, requested_cancel
from lodger.errors import CommitFailedError, ProviderError
from lodger.events import (
    BudgetReached,
    CancelRequested,
    ContextCompacted,
    Event,
    ModelOutput,
    ModelSwitched,
    OutputRejected,
    PermissionMode,
    PermissionModeChanged,
    ProposedCall,
    ProviderRetried,
    QueueChanged,
    RunEnded,
    RunStarted,
    SessionStarted,
    StepStarted,
    ToolRef,
    TurnEnded,
    TurnStarted,
    Usage,
    WorkspaceSnapshot,
)
from lodger.ids import IdFactory
from lodger.media import UserInput, split_input, store_media
from lodger.providers.base import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ModelSettings,
    OutputMode,
    ToolSchema,
    is_context_length_error,
    take_output_call,
)
from lodger.storage import SessionWriter
from lodger.storage.artifacts import ArtifactStore
from lodger.storage.snapshots import WorkspaceSnapshotter
from lodger.substrates.background import reconcile, turn_ending
from lodger.tools.registry import ToolRegistry
from lodger.tools.spec import Tool
from lodger.tools.workspace import workspace_id

__all__ = ["Engine", "RunUsage", "TurnResult", "TurnStatus"]

#: ``waiting``: the run ended with calls suspended (their work runs elsewhere); the turn
#: stays open and a resume settles them when the session is woken. ``parked``: a usage
#: limit or budget was reached (``TurnResult.budget``); the turn stays open, and a resume
#: with the limit raised continues it
TurnStatus = Literal[
    "completed", "failed", "cancelled", "step_limit", "abandoned", "waiting", "parked"
]


@dataclass(frozen=True, kw_only=True)
class RunUsage:
    """Tokens of a turn: ``requests`` holds one ``Usage`` per model call (zeros when the
    provider reported none), in order; the totals add them up, cached input tokens
    (read and written) too, with the cache's hit rate. Read from the log's
    ``model_output`` facts, so a resumed turn counts its earlier runs too."""

    requests: tuple[Usage, ...] = ()

    @property
    def input_tokens(self) -> int:
        return sum(u.input_tokens for u in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(u.output_tokens for u in self.requests)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def cache_read_tokens(self) -> int:
        """Input tokens the provider read from its prompt cache (part of ``input_tokens``)."""
        return sum(u.cache_read_tokens for u in self.requests)

    @property
    def cache_write_tokens(self) -> int:
        """Input tokens the provider wrote to its prompt cache (part of ``input_tokens``)."""
        return sum(u.cache_write_tokens for u in self.requests)

    @property
    def cache_hit_rate(self) -> float | None:
        """``cache_read_tokens / input_tokens`` (None when there was no input)."""
        total = self.input_tokens
        return self.cache_read_tokens / total if total else None


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    """How a turn settled.

    ``answer`` is the final text; ``output`` the value validated against the output type
    (the answer itself without one). ``usage`` counts tokens per model call and in total;
    ``commits`` is the cost of durability: how many atomic, synced appends this call made;
    ``messages`` is the conversation as the model would see it next (an immutable view
    of the projection: taking it copies nothing, however long the session). ``budget``
    is the limit a ``parked`` turn reached; ``error`` then says how to raise it.
    """

    session_id: str
    turn_id: str
    run_id: str
    status: TurnStatus
    answer: str | None = None
    error: str | None = None
    output: Any = None
    usage: RunUsage = dataclasses.field(default_factory=RunUsage)
    commits: int = 0
    messages: Sequence[Message] = ()
    budget: BudgetReached | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class _StepTools:
    """The visible tools of a step, and what the step records and shows of them."""

    tools: tuple[Tool, ...]  # held, so the ids in the cache's key stay theirs
    refs: tuple[ToolRef, ...]
    names: frozenset[str]
    schemas: tuple[ToolSchema, ...]


@dataclass(kw_only=True)
class Engine:
    """Everything a run needs besides its session: model, tools, policy and substrates,
    and the settings groups (``lodger.engine.settings``) as they were given."""

    model: Model
    registry: ToolRegistry
    system: str
    permissions: PermissionGate
    artifacts: ArtifactStore
    workspace: Path | None = None
    hidden: tuple[Path, ...] = ()
    limits: Limits
    retries: Retries
    hooks: Hooks
    services: Services
    #: the type the final answer is validated against (None: free text)
    output: OutputSpec | None = None
    #: how the output type's schema travels; None: the model's own ``output_mode``
    #: (``"prompted"`` when it declares none)
    output_mode: OutputMode | None = None
    #: the agent's model settings, sent with every request
    settings: ModelSettings = dataclasses.field(default_factory=ModelSettings)
    #: one run's settings over the agent's (``run(..., model_settings=...)``); a resume
    #: takes them over the settings the turn's last step recorded
    run_settings: ModelSettings | None = None
    #: handed to tools as ``ToolContext.deps`` and to hooks; never logged
    deps: Any = None
    #: takes the workspace snapshot each turn's end records (None: no snapshots)
    snapshotter: WorkspaceSnapshotter | None = None
    #: reads other sessions' spend for tree and daily budgets (``lodger.runtime.spend``)
    spend: SpendReader | None = None
    #: what a step records and shows of each set of visible tools, by the tools' identity
    _step_tools: dict[tuple[int, ...], _StepTools] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    # ------------------------------------------------------------------ composition

    def journal(self, writer: SessionWriter, state: SessionState) -> Journal:
        services = self.services
        return Journal(
            writer, state, clock=services.clock, ids=services.ids, on_event=self.hooks.on_event
        )

    def run_context(self, journal: Journal, *, turn_id: str, run_id: str) -> RunContext:
        return RunContext(
            session_id=journal.session_id,
            turn_id=turn_id,
            run_id=run_id,
            clock=self.services.clock,
            ids=self.services.ids,
            journal=journal,
            workspace=self.workspace,
            hidden=self.hidden,
            # what steers the turn and asks it to stop (``lodger.engine.steering``): the
            # agent registers it for the session before the writer opens
            control=self.services.turns.get(journal.session_id),
        )

    def pipeline(self, ctx: RunContext) -> CallPipeline:
        return CallPipeline(
            ctx,
            registry=self.registry,
            permissions=self.permissions,
            artifacts=self.artifacts,
            limits=self.limits,
            hooks=self.hooks,
            services=self.services,
            deps=self.deps,
        )

    # ------------------------------------------------------------------ turns

    async def start_turn(
        self,
        journal: Journal,
        task: UserInput,
        *,
        queued: QueuedMessage | None = None,
        mode: PermissionMode | None = None,
    ) -> TurnResult:
        """A new turn of ``task`` (text, or text and media: ``lodger.media``); an
        interrupted turn is resumed (never retried) first. Media that break the limits
        raise ``UsageError`` before anything is written. ``queued``: the follow-up
        message this turn delivers (its ``queue_changed`` commits with the turn's start).
        ``mode``: the permission mode the turn runs in (a switch commits with its start
        when the session is in another).
        """
        text, items = split_input(task, self.limits.media)
        state = journal.state
        if not state.events:
            # Committed with the turn's first facts: a session never exists without
            # its first turn, even if the process dies right here.
            journal.defer(
                journal.draft(
                    SessionStarted(
                        workspace=str(self.workspace) if self.workspace else None,
                        workspace_id=workspace_id(self.workspace) if self.workspace else None,
                    )
                )
            )
        elif state.open_turn is not None:
            resumed = await self.resume(journal)
            if resumed.status != "completed":
                return resumed
        await self._compact(journal, Envelope(), "threshold")  # before the turn, if over
        if mode is not None and mode != state.permission_mode:
            switch = PermissionModeChanged(mode=mode, previous=state.permission_mode)
            journal.defer(journal.draft(switch))  # committed with the turn's start, before it
        ids = self.services.ids
        turn_id, run_id = ids.new_id(), ids.new_id()
        env = Envelope(turn_id=turn_id, run_id=run_id)
        # the bytes are stored before the fact that lists them
        attachments = await store_media(items, self.artifacts, state.media)
        delivered = (
            ()
            if queued is None
            else (journal.draft(QueueChanged(message_id=queued.message_id, action="delivered")),)
        )
        await journal.record(
            journal.draft(
                TurnStarted(input=text, attachments=attachments), Envelope(turn_id=turn_id)
            ),
            *delivered,
            journal.draft(
                RunStarted(model=self.model.spec, tools=tuple(self.registry.names())), env
            ),
            # processes kept for the session that a crash between turns left behind
            *(journal.draft(e, env) for e in reconcile(journal.session_id, state.events)),
        )
        ctx = self.run_context(journal, turn_id=turn_id, run_id=run_id)
        return await self.drive(ctx, settings=self.settings.merged(self.run_settings))

    async def resume(self, journal: Journal, *, relocate: bool = False) -> TurnResult:
        """Continue the open turn as a new run (see ``lodger.engine.resume``); with
        ``relocate``, in this engine's workspace once its files match the log. The run
        asks with the settings the turn's last step recorded (the agent's when it has no
        step yet), with this run's ``run_settings`` over them."""
        still = await self._still_parked(journal)
        if still is not None:
            return still  # nothing written: the next run would park before any request
        ctx, pending = await resume_run(self, journal, relocate=relocate)
        if pending:
            return await self.wait(ctx, pending)
        asked = _recorded_settings(journal.state.events, ctx.turn_id)
        base = self.settings if asked is None else asked
        return await self.drive(ctx, settings=base.merged(self.run_settings))

    async def wait(self, ctx: RunContext, call_ids: Sequence[str]) -> TurnResult:
        """End the run with ``call_ids`` suspended (dispatched, no T2, their work running
        elsewhere): ``run_ended`` says the run stopped, the turn stays open, and the
        caller learns the turn is ``waiting``. A resume probes the calls again."""
        error = f"waiting for {len(call_ids)} suspended call(s) to settle elsewhere: " + ", ".join(
            call_ids
        )
        _stop_driving()
        await ctx.journal.fact(RunEnded(status="interrupted", error=error), ctx.envelope)
        state = ctx.journal.state
        start = state.open_turn_offset
        return TurnResult(
            session_id=ctx.session_id,
            turn_id=ctx.turn_id,
            run_id=ctx.run_id,
            status="waiting",
            error=error,
            usage=RunUsage(requests=_turn_usage(state.events, ctx.turn_id, start)),
            commits=ctx.journal.commits,
            messages=await self._messages(state),
        )

    async def _messages(self, state: SessionState) -> Sequence[Message]:
        """The context a result hands back, its media read first: a result made before any
        step of this run loaded them (a parked or step-limited resume) needs them too."""
        await load_media(state, self.artifacts)
        return state.projector.project().messages

    async def park(self, ctx: RunContext, reached: BudgetReached) -> TurnResult:
        """End the run ``parked`` on a reached limit or budget: a ``budget_reached`` fact
        and ``run_ended`` parked, atomically; the turn stays open for a resume."""
        error = describe(reached)
        _stop_driving()
        journal = ctx.journal
        await journal.record(
            journal.draft(reached, ctx.envelope),
            journal.draft(RunEnded(status="parked", error=error), ctx.envelope),
        )
        state = journal.state
        return TurnResult(
            session_id=ctx.session_id,
            turn_id=ctx.turn_id,
            run_id=ctx.run_id,
            status="parked",
            error=error,
            usage=RunUsage(requests=_turn_usage(state.events, ctx.turn_id, state.open_turn_offset)),
            commits=journal.commits,
            messages=await self._messages(state),
            budget=reached,
        )

    async def _still_parked(self, journal: Journal) -> TurnResult | None:
        """A turn whose last run parked on a budget that is still reached: the result,
        without claiming a run (a worker looking again every minute writes nothing)."""
        state = journal.state
        events = state.events
        turn_id = state.open_turn
        if turn_id is None or state.run_open or len(events) < 2:
            return None
        reached, ended = events[-2].body, events[-1].body
        if not (isinstance(ended, RunEnded) and ended.status == "parked"):
            return None
        if not isinstance(reached, BudgetReached):
            return None
        now = await self._budget_reached(state)
        if now is None:
            return None
        return TurnResult(
            session_id=journal.session_id,
            turn_id=turn_id,
            run_id=state.last_run_id or "",
            status="parked",
            error=describe(now),
            usage=RunUsage(requests=_turn_usage(events, turn_id, state.open_turn_offset)),
            commits=journal.commits,
            messages=await self._messages(state),
            budget=now,
        )

    async def _budget_reached(self, state: SessionState) -> BudgetReached | None:
        limits = self.limits
        return await check_before_request(
            state,
            usage=limits.usage,
            budgets=limits.budgets,
            spend=self.spend,
            now_us=self.services.clock.now_us(),
            model=self.model.spec,
        )

    async def drive(self, ctx: RunContext, *, settings: ModelSettings | None = None) -> TurnResult:
        """Run steps of an open turn until it settles, asking with ``settings`` (the
        agent's merged with the run's when None)."""
        if settings is None:
            settings = self.settings.merged(self.run_settings)
        recorded = settings.record()
        mode = self.mode()
        journal, state = ctx.journal, ctx.journal.state
        ctx, control = _steerable(ctx)
        pipeline = self.pipeline(ctx)
        run_env = ctx.envelope
        calls_seen = _CallIds(state.call_ids)
        try:
            while True:
                steps_done = state.turn_steps
                if steps_done >= self.limits.max_steps:
                    return await self._end(
                        ctx, "step_limit", error=f"stopped after {self.limits.max_steps} steps"
                    )
                # a stop, a cancel, a budget; long-running calls' results that came get a T2
                stopped = await self._before_step(ctx, control, pipeline)
                if stopped is not None:
                    return stopped
                visible = self.visible_tools(state.turn_activated)
                step_id = self.services.ids.new_id()
                env = run_env.at_step(step_id)
                journal.defer(
                    journal.draft(
                        step_started(
                            index=steps_done,
                            model=self.model.spec,
                            tools=visible.refs,
                            settings=recorded,
                        ),
                        env,
                    )
                )
                await control.deliver(steps_done, env)  # steers that came: this request's
                await load_media(state, self.artifacts)
                request = await self._request(journal, visible, env, settings, mode)
                refused = unsupported_media(self.model, state)
                if refused is not None:  # before anything is sent
                    return await self._end(ctx, "failed", error=refused)
                response = await self._complete_or_compact(journal, request, env)
                response = _answer_call(_storable(response), request)
                calls = calls_seen.unique(response.calls, self.services.ids)
                _defer_output(journal, response, calls, env)
                if not calls:
                    settled = await self._answer(ctx, response.text, env)
                    if settled is not None:
                        return settled
                    continue  # the answer failed the output type: the model tries again
                stop = control.stopping(before_calls=True)
                if stop is not None:  # a rollback: none of the proposed calls starts
                    return await self._stopped(ctx, stop)
                reached = check_before_calls(state, usage=self.limits.usage, proposed=len(calls))
                if reached is not None:
                    return await self.park(ctx, reached)  # commits the proposal with it
                scope = StepScope(step_id=step_id, visible=visible.names)
                suspended = await self._act(ctx, pipeline, calls, scope)
                if suspended:
                    return await self.wait(ctx, suspended)
        except ProviderError as exc:
            return await self._end(ctx, "failed", error=str(exc))
        except asyncio.CancelledError:
            # Stopped from outside (Ctrl-C, SIGTERM, a caller's cancel): every call has
            # settled and recorded what it did. The run ends; the turn stays open, so it
            # resumes with the same plan as after a crash (a cancel request ends the turn).
            if (cancel := _cancel_of(journal)) is not None:
                return await self._cancelled(ctx, cancel)
            if journal.failure is None:
                await journal.fact(
                    RunEnded(status="interrupted", error="stopped from outside"), ctx.envelope
                )
            raise
        except CommitFailedError:
            raise  # the turn stays open in the log; recovery takes it from here

    async def _act(
        self,
        ctx: RunContext,
        pipeline: CallPipeline,
        calls: Sequence[ProposedCall],
        scope: StepScope,
    ) -> list[str]:
        """Run a step's calls batch by batch; the ids of the calls left suspended."""
        suspended: list[str] = []
        for batch in self.registry.batches(calls):
            outcomes = await pipeline.run_batch(batch, scope)
            suspended += [o.call_id for o in outcomes if o.suspended]
            if pipeline.hook_failure is not None:  # the developer's, not the model's
                await self._end(ctx, "failed", error=pipeline.hook_failure.message)
                raise pipeline.hook_failure
        return suspended

    async def _before_step(
        self, ctx: RunContext, control: TurnControl, pipeline: CallPipeline
    ) -> TurnResult | None:
        """The turn's end before a step: stopped by a queued message (an interrupt or a
        rollback), cancelled by a request that came meanwhile (or before the engine drove
        it), or parked on a reached limit or budget."""
        stop = control.stopping()
        if stop is not None:  # between steps: every call of the last one settled
            return await self._stopped(ctx, stop)
        # Other tasks get the loop once per step (with a store and a model that answer
        # without waiting, nothing else here suspends); long-running calls' results that
        # came meanwhile are committed as their T2.
        await pipeline.between_steps()
        running = current_control()  # a turn the agent runs (TurnControl.run): ``control``
        if running is not None:
            running.start_driving(ctx.turn_id)  # from now on a cancel stops the task
        cancel = requested_cancel()
        if cancel is not None:
            return await self._cancelled(ctx, cancel)
        reached = await self._budget_reached(ctx.journal.state)
        if reached is not None:
            return await self.park(ctx, reached)
        return None

    async def _cancelled(self, ctx: RunContext, request: CancelRequest) -> TurnResult:
        """End the turn on a cancel request: the request, ``run_ended`` and
        ``turn_ended`` cancelled, committed together (every call has settled)."""
        by = f" by {request.who}" if request.who else ""
        why = f": {request.reason}" if request.reason else ""
        return await self._end(
            ctx,
            "cancelled",
            error=f"cancelled{by}{why}",
            reason=request.reason or None,
            lead=CancelRequested(who=request.who, reason=request.reason),
        )

    async def _answer(self, ctx: RunContext, text: str, env: Envelope) -> TurnResult | None:
        """End the turn on a final answer ``text``, validated against the output type if
        there is one; None when it failed the type and the model may try again (the
        rejection is a fact of the step)."""
        if self.output is None:
            return await self._end(ctx, "completed", answer=text, output=text)
        try:
            value, dumped = self.output.validate(text, self.mode())
        except OutputInvalid as exc:
            attempt = _output_rejections(ctx.journal.state.events, ctx.turn_id) + 1
            if attempt > self.limits.output_retries:
                return await self._end(
                    ctx,
                    "failed",
                    error=f"the final answer failed the output type "
                    f"{attempt} times; last: {exc.message}",
                )
            await ctx.journal.fact(OutputRejected(message=exc.message, attempt=attempt), env)
            return None
        return await self._end(ctx, "completed", answer=text, output=value, logged=dumped)

    async def _stopped(self, ctx: RunContext, stop: StopRequest) -> TurnResult:
        """End the turn for a queued message that asked it to stop: ``cancelled`` for an
        interrupt, ``abandoned`` for a rollback; the message runs next."""
        status: TurnStatus = "abandoned" if stop.policy == "rollback" else "cancelled"
        return await self._end(ctx, status, error=stop.reason, reason=stop.reason)

    async def _end(
        self,
        ctx: RunContext,
        status: TurnStatus,
        *,
        answer: str | None = None,
        error: str | None = None,
        output: Any = None,
        logged: Any = None,
        reason: str | None = None,
        lead: CancelRequested | None = None,
    ) -> TurnResult:
        _stop_driving()
        journal, env = ctx.journal, ctx.envelope
        drafts = [] if lead is None else [journal.draft(lead, env)]
        if self.snapshotter is not None and self.workspace is not None:
            # the workspace the turn leaves, committed with the turn's end; if it cannot
            # be stored the turn stays open (a resume ends it), never ends without it
            taken = await self.snapshotter.take(self.workspace, exclude=self.hidden)
            drafts.append(
                journal.draft(
                    WorkspaceSnapshot(ref=taken.ref, files=taken.files, size=taken.size), env
                )
            )
        # background processes kept for the turn stop with it; their ends commit with it
        drafts += [journal.draft(e, env) for e in await turn_ending(ctx.session_id)]
        start = journal.state.open_turn_offset  # forgotten once the turn has ended
        assert ctx.control is not None
        async with ctx.control.ending() as late:  # steers no step carried: the next turn
            await journal.record(
                *drafts,
                journal.draft(RunEnded(status=status, error=error), env),
                journal.draft(
                    TurnEnded(status=status, answer=answer, output=logged, reason=reason), env
                ),
                *(journal.draft(m) for m in late),
            )
        state = journal.state
        return TurnResult(
            session_id=ctx.session_id,
            turn_id=ctx.turn_id,
            run_id=ctx.run_id,
            status=status,
            answer=answer,
            error=error,
            output=output,
            usage=RunUsage(requests=_turn_usage(state.events, ctx.turn_id, start)),
            commits=journal.commits,
            messages=await self._messages(state),
        )

    def visible_tools(self, activated: Sequence[str]) -> _StepTools:
        """The tools a step shows (``ToolRegistry.visible``) with their refs, names and
        schemas, made once per distinct set of tool objects (a tool's schema and digest
        never change: both are cached on the frozen tool)."""
        tools = self.registry.visible(activated)
        key = tuple(map(id, tools))
        found = self._step_tools.get(key)
        if found is None:  # (the entry holds its tools, so no other object has their ids)
            if len(self._step_tools) >= 64:
                self._step_tools.clear()
            found = self._step_tools[key] = _StepTools(
                tools=tuple(tools),
                refs=tuple(ToolRef(name=t.name, schema_digest=t.schema_digest()) for t in tools),
                names=frozenset(t.name for t in tools),
                schemas=tuple(t.schema() for t in tools),
            )
        return found

    def mode(self) -> OutputMode:
        """How the output type's schema travels this run: the engine's ``output_mode``,
        else the model's own, else ``"prompted"``."""
        if self.output_mode is not None:
            return self.output_mode
        return cast(OutputMode, getattr(self.model, "output_mode", "prompted"))

    async def _request(
        self,
        journal: Journal,
        visible: _StepTools,
        env: Envelope,
        settings: ModelSettings,
        mode: OutputMode,
    ) -> ModelRequest:
        state = journal.state
        await self._compact(journal, env, "overflow", visible)  # if the request would not fit
        budget = elision_budget(self.limits.context_budget, self.limits.compaction)
        projection = state.projector.project(budget_tokens=budget)
        if projection.elided_call_ids and projection.elided_call_ids != state.last_elided:
            assert budget is not None
            await journal.fact(
                ContextCompacted(
                    elided_call_ids=projection.elided_call_ids,
                    budget_tokens=budget,
                    estimated_tokens=projection.estimated_tokens,
                ),
                env,
            )
        system = self.registry.system_prompt(self.system)
        schema = None
        if self.output is not None:
            system = f"{system}\n\n{self.output.instructions(mode)}"
            schema = self.output.schema_for(mode)
        request: ModelRequest = record(
            ModelRequest,
            {
                "system": system,
                "messages": projection.messages,
                "tools": visible.schemas,
                "max_output_tokens": settings.max_tokens,
                "output_schema": schema,
                "output_mode": mode,
                "settings": settings,
            },
        )
        return request

    async def _compact(
        self,
        journal: Journal,
        env: Envelope,
        trigger: Literal["threshold", "overflow", "context_error"],
        visible: _StepTools | None = None,
    ) -> bool:
        """Compact the context when ``trigger``'s condition holds (``lodger.engine.
        compaction``); whether a ``compacted`` fact was committed."""
        policy = self.limits.compaction
        if policy is None:
            return False
        overhead = 0
        if visible is not None:
            overhead = request_overhead(self.registry.system_prompt(self.system), visible.schemas)
        outcome = await compact_if_over(
            journal,
            env,
            policy.summarizer(self.model),
            policy,
            trigger=trigger,
            overhead=overhead,
            ask=self.ask_unlogged,
        )
        return outcome is not None and outcome.kind == "compacted"

    async def ask_unlogged(self, model: Model, request: ModelRequest) -> ModelResponse:
        """A request outside the steps (a summary), with this engine's retries; its retries
        are not facts (a compaction is one fact: ``lodger.engine.compaction``)."""

        async def unrecorded(body: ProviderRetried | ModelSwitched) -> None:
            return None

        return await complete(model, request, retries=self.retries, record=unrecorded)

    async def _complete_or_compact(
        self, journal: Journal, request: ModelRequest, env: Envelope
    ) -> ModelResponse:
        """The step's answer; on a provider's context-length error, compact once and ask
        again with the compacted context (the error is raised if that cannot be done)."""
        try:
            return await self._complete(journal, request, env)
        except ProviderError as exc:
            if not is_context_length_error(exc) or not await self._compact(
                journal, env, "context_error"
            ):
                raise
        budget = elision_budget(self.limits.context_budget, self.limits.compaction)
        projection = journal.state.projector.project(budget_tokens=budget)
        retried = dataclasses.replace(request, messages=projection.messages)
        return await self._complete(journal, retried, env)

    async def _complete(
        self, journal: Journal, request: ModelRequest, env: Envelope
    ) -> ModelResponse:
        async def record(body: ProviderRetried | ModelSwitched) -> None:
            await journal.fact(body, env)

        with streaming_at(env):  # a text sink labels its deltas with the step
            return await complete(
                self.model, request, retries=self.retries, record=record, on_text=self.hooks.on_text
            )


def _steerable(ctx: RunContext) -> tuple[RunContext, TurnControl]:
    """``ctx`` with a control attached to its journal (a control of its own when nobody
    steers the turn: the steers the log holds for it still arrive)."""
    control = ctx.control
    if control is None:
        control = TurnControl(ctx.session_id)
        ctx = dataclasses.replace(ctx, control=control)
    state = ctx.journal.state
    control.attach(ctx.journal, ctx.envelope, pending_steers(state.events, state.open_turn_offset))
    return ctx, control


def _stop_driving() -> None:
    control = current_control()  # before the run's end is committed (see stop_driving)
    if control is not None:
        control.stop_driving()


def _cancel_of(journal: Journal) -> CancelRequest | None:
    """In a stopped turn: the cancel request that stopped it, its one cancellation taken
    back; None when there is none, the journal failed, or the task was also stopped by
    other means (its caller was cancelled: that goes on)."""
    cancel = requested_cancel()
    if cancel is None or journal.failure is not None:
        return None
    task = asyncio.current_task()
    return cancel if task is not None and task.uncancel() == 0 else None


def _recorded_settings(events: Sequence[Event], turn_id: str) -> ModelSettings | None:
    """The settings the last step of ``turn_id`` asked with (None: it has no step)."""
    for e in reversed(events):
        if e.turn_id != turn_id:
            continue
        if isinstance(e.body, StepStarted):
            recorded = e.body.settings or {}
            return settings_from_mapping(recorded, where="step_started.settings")
        if isinstance(e.body, TurnStarted):
            return None
    return None


def _answer_call(response: ModelResponse, request: ModelRequest) -> ModelResponse:
    """In tool mode, a lone call of the output tool as the answer's text (adapters do
    this themselves; scripted and function models may answer with the call)."""
    if request.output_mode != "tool" or not response.calls:
        return response
    answer, calls = take_output_call(response.calls, request)
    if answer is None:
        # an answer beside other calls waits for a later step, as adapters leave it
        return response if calls == response.calls else dataclasses.replace(response, calls=calls)
    return dataclasses.replace(response, text=answer, calls=calls)


def _defer_output(
    journal: Journal, response: ModelResponse, calls: tuple[ProposedCall, ...], env: Envelope
) -> None:
    """The step's ``model_output``, deferred: it commits atomically with the first fact of
    its batch (the first T1 or rejection) or with the end of the turn, saving one sync."""
    journal.defer(
        journal.draft(
            model_output(
                text=response.text,
                reasoning=response.reasoning,
                calls=calls,
                usage=response.usage,
                finish_reason=response.finish_reason,
                provider_state=response.provider_state,
            ),
            env.with_origin("provider"),
        )
    )


def _this_turn(events: Sequence[Event], turn_id: str) -> list[Event]:
    """The events of ``turn_id``, read back from the end of the log to its start."""
    found: list[Event] = []
    for e in reversed(events):
        if e.turn_id == turn_id:
            found.append(e)
            if isinstance(e.body, TurnStarted):
                break
    found.reverse()
    return found


_NO_USAGE = Usage()


def _turn_usage(
    events: Sequence[Event], turn_id: str, start: int | None = None
) -> tuple[Usage, ...]:
    """The usage of each model request of ``turn_id``; ``start``, the offset of its
    ``turn_started`` when known, saves walking back to it (and the list of its events)."""
    this = _this_turn(events, turn_id) if start is None else events[start:]
    return tuple(
        e.body.usage or _NO_USAGE
        for e in this
        if e.origin == "provider" and isinstance(e.body, ModelOutput) and e.turn_id == turn_id
    )


def _output_rejections(events: Sequence[Event], turn_id: str) -> int:
    return sum(1 for e in _this_turn(events, turn_id) if isinstance(e.body, OutputRejected))


class _CallIds:
    """Call ids unique in the session: results pair by id for the whole session, so an
    id a server reuses (some OpenAI-compatible servers number calls per response) or
    leaves empty gets a fresh one; the model sees the renamed id from then on."""

    def __init__(self, taken: set[str]) -> None:
        self._taken = taken  # the session state's set: it grows as outputs commit

    def unique(self, calls: Sequence[ProposedCall], ids: IdFactory) -> tuple[ProposedCall, ...]:
        out: list[ProposedCall] = []
        here: set[str] = set()
        for call in calls:
            if not call.call_id or call.call_id in self._taken or call.call_id in here:
                call = proposed_call(
                    call_id=f"call-{ids.new_id()}", name=call.name, arguments=call.arguments
                )
            here.add(call.call_id)
            out.append(call)
        return tuple(out)


def _storable(response: ModelResponse) -> ModelResponse:
    """The response with text the log can store (lone surrogates become U+FFFD); the
    same object when it already is (the common case costs one check per string)."""
    texts = [response.text, response.reasoning]
    for c in response.calls:
        texts += (c.call_id, c.name, c.arguments)
    try:
        # one encode of them all: it fails iff one of them holds a lone surrogate
        "".join(texts).encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return response
    calls = tuple(
        c.model_copy(
            update={
                "call_id": storable_text(c.call_id),
                "name": storable_text(c.name),
                "arguments": storable_text(c.arguments),
            }
        )
        for c in response.calls
    )
    return dataclasses.replace(
        response,
        text=storable_text(response.text),
        reasoning=storable_text(response.reasoning),
        calls=calls,
    )

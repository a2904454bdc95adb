"""The path of one call (DESIGN section 4), as one chain of stages, and the batch of one step.

    binding -> visibility -> arguments -> before_call -> claims          (prepare)
        -> permission -> resources -> expectations
        -> T1 -> execute (the tool's Executor) -> after_call -> bound -> T2   (run)

``CALL_STAGES`` names them in this order. A first dispatch (a call of a model step or of
a code cell), an approval asked again and a recovery re-dispatch all enter the same chain
(``_prepare`` then ``_run_prepared``) and differ only in what enters it: a re-dispatch
has no proposing step, so visibility does not apply (the step's check was a fact of the
log, and nothing read from the log grants anything: binding, arguments and permission
are checked again against what is bound now, DESIGN L10); its permission cannot park
(recovery decides then); its T1 links to the one it re-runs; and a refusal is raised
to recovery (which parks the operation) instead of recorded as a ``call_rejected``.

Each failed check of a proposed call becomes a ``call_rejected`` fact and an error result
the model sees on its next step; nothing raises out of here except a failed commit (which
stops the turn) and cancellation. A call's result reaches the model only through the
projection of committed events, so "T2 before the model sees it" holds by construction.

The before-call hooks run before permission: what is asked about (and what T1 records)
is what will run, a rewrite included, and a vetoed call asks no one.

Resources: a call's claims are computed with the synchronous checks and reserved with the
authorities (``lodger.authority``) in the model's emission order before any call of the
batch runs; each call acquires them after its permission and holds them until its T2 is
committed, so conflicting calls run in emission order and independent ones never wait.

Execute: the pipeline picks the tool's Executor (``lodger.substrates.select``): in
process, a sandboxed process, a code cell or remote work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from lodger._core.records import record
from lodger.authority import AuthorityStatistics, Reservation, ResourceClaim
from lodger.engine.batch import Batch, Slot
from lodger.engine.bodies import tool_dispatched, tool_responded
from lodger.engine.bounding import ResultBounder
from lodger.engine.callruntime import RunCalls
from lodger.engine.checks import (
    Rejection,
    check_binding,
    check_visibility,
    decode_arguments,
    invalid_arguments,
    schema_problems_from_loop,
)
from lodger.engine.context import RunContext
from lodger.engine.envelope import Envelope
from lodger.engine.filecheckpoints import file_checkpoints
from lodger.engine.hooks import (
    CallInfo,
    CallResult,
    Rewrite,
    Veto,
    call_after,
    call_before,
)
from lodger.engine.longcalls import (
    Polled,
    PollSpacing,
    poll_once,
    running_calls,
    running_note,
    wait_for_result,
    wait_polls,
)
from lodger.engine.media import store_tool_media
from lodger.engine.permissions import ApprovalParked, PermissionGate
from lodger.engine.settings import Hooks, Limits, Services
from lodger.errors import AuthorityMisuseError, CommitFailedError, HookError, ToolCallError
from lodger.events import (
    ArtifactRef,
    CallAccepted,
    CallRejected,
    FileExpectation,
    Origin,
    ProposedCall,
    ResultStatus,
    ToolDispatched,
    ToolResponded,
    ToolsActivated,
    Visibility,
    canonical_json,
)
from lodger.recovery.classify import CallState
from lodger.storage.artifacts import ArtifactStore
from lodger.substrates.select import Executors
from lodger.tools.registry import ToolRegistry
from lodger.tools.spec import (
    CannotTell,
    Execution,
    NestedResult,
    Tool,
    ToolContext,
    idempotency_key,
)

__all__ = ["CALL_STAGES", "CallOutcome", "CallPipeline", "CallStage", "StepScope"]

CallStage = Literal[
    "binding",
    "visibility",
    "arguments",
    "before_call",
    "claims",
    "permission",
    "resources",
    "expectations",
    "T1",
    "execute",
    "after_call",
    "bound",
    "T2",
]
CALL_STAGES: tuple[CallStage, ...] = get_args(CallStage)
"""The stages of one call, in the order every call takes them (a stage that does not
apply is skipped: visibility on a re-dispatch, the hooks when there are none)."""


@dataclass
class StepScope:
    """What the proposing step allowed: its visible names, fixed when the step started,
    and what its calls activated so far. Tools get it as their ``ToolContext.step``."""

    step_id: str
    visible: frozenset[str]
    activated_here: set[str] = field(default_factory=set)

    def shown(self) -> frozenset[str]:
        return self.visible | self.activated_here


@dataclass
class _CallStep:
    """The step handle one call sees: activations are facts of that call."""

    scope: StepScope
    journal_env: Envelope
    pipeline: CallPipeline

    @property
    def step_id(self) -> str:
        return self.scope.step_id

    def shown(self) -> frozenset[str]:
        return self.scope.shown()

    async def activate(self, query: str, names: Sequence[str]) -> None:
        # The fact first: a name is activated only once the log says so.
        await self.pipeline.ctx.journal.fact(
            ToolsActivated(query=query, names=tuple(names)), self.journal_env
        )
        self.scope.activated_here.update(names)


@dataclass
class _CellCalls:
    """How a code cell's nested calls reach the pipeline (``ToolContext.nested``).

    Each nested call runs the whole path of a top-level call (``CallPipeline.run_call``)
    with a fresh session-unique call id, linked to the cell. After a failed commit no
    further nested call starts (``halt``); the caller lets running ones settle.
    """

    scope: StepScope
    cell_call_id: str
    pipeline: CallPipeline
    halt: asyncio.Event = field(default_factory=asyncio.Event)

    def callable_tools(self) -> list[Tool]:
        shown = self.scope.visible
        return [t for t in self.pipeline.registry if t.nestable and t.name in shown]

    def tool(self, name: str) -> Tool | None:
        return self.pipeline.registry.get(name)

    def bound_names(self) -> list[str]:
        return self.pipeline.registry.names()

    async def call(self, name: str, arguments: dict[str, Any]) -> NestedResult:
        ctx = self.pipeline.ctx
        if ctx.journal.failure is not None or self.halt.is_set():
            self.halt.set()
            raise CommitFailedError(
                "the cell stopped after a failed commit; this nested call was not started",
                session_id=ctx.session_id,
                call_id=self.cell_call_id,
            )
        call_id = f"call-{ctx.ids.new_id()}"
        nestable = frozenset(t.name for t in self.callable_tools())
        nested_scope = StepScope(
            step_id=self.scope.step_id,
            visible=nestable,
            activated_here=self.scope.activated_here,
        )
        call = ProposedCall(call_id=call_id, name=name, arguments=json.dumps(arguments))
        try:
            outcome = await self.pipeline.run_call(
                call,
                scope=nested_scope,
                halt=self.halt,
                parent_call_id=self.cell_call_id,
                origin="code_mode",
                visibility="hidden",
            )
        except CommitFailedError:
            self.halt.set()
            raise
        return NestedResult(call_id=call_id, status=outcome.status, content=outcome.content)


@dataclass(frozen=True, kw_only=True)
class CallOutcome:
    call_id: str
    name: str
    status: ResultStatus | None  # None: rejected before dispatch, or suspended
    content: str
    dispatched: bool
    #: dispatched and handed off (``Suspended``), or not dispatched and waiting for an
    #: approval (``awaiting_approval``): no T2; the run ends waiting for it
    suspended: bool = False
    awaiting_approval: bool = False

    @property
    def is_error(self) -> bool:
        return self.status != "ok"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Rerun:
    """What makes a call a re-dispatch: the operation it runs again, and which attempt."""

    retry_of: str
    attempt: int


# _Rejected and _Ready are made once per call and never changed: plain slotted records
# (a frozen dataclass sets each field through object.__setattr__, 1 us a call)
@dataclass(slots=True, kw_only=True)
class _Rejected:
    """A call that failed a synchronous check; its rejection is recorded when it runs."""

    call: ProposedCall
    env: Envelope
    rejection: Rejection
    #: set for a re-dispatch (None: a call a step or a cell proposed)
    rerun: _Rerun | None = None


@dataclass(slots=True, kw_only=True)
class _Ready:
    """A call that passed the synchronous checks, with its claims reserved."""

    call: ProposedCall
    env: Envelope
    tool: Tool
    arguments: dict[str, Any]
    ctx: ToolContext
    reservation: Reservation
    rerun: _Rerun | None = None


class CallPipeline:
    """Runs calls for one run of one turn; all facts go through the run's journal."""

    def __init__(
        self,
        ctx: RunContext,
        *,
        registry: ToolRegistry,
        permissions: PermissionGate,
        artifacts: ArtifactStore,
        limits: Limits,
        hooks: Hooks,
        services: Services,
        result_limit: int = 16_000,
        deps: Any = None,
        calls: RunCalls | None = None,
    ) -> None:
        self.ctx = ctx
        #: what a running call may ask of this run (``ToolContext.runtime``)
        self.calls = calls
        self.before_call = tuple(hooks.before_call)
        self.after_call = tuple(hooks.after_call)
        self.deps = deps
        self.registry = registry
        self.permissions = permissions
        self.bounder = ResultBounder(artifacts, limit=result_limit)
        self.authorities = services.authorities
        #: which executor runs each tool's calls (``services.executor``: the in-process one)
        self.executors = Executors(in_process=services.executor)
        self.default_timeout = limits.default_timeout
        #: when each call running remotely may be polled again between steps
        self.spacing = PollSpacing()
        #: the first hook of the user's that raised in this run: the calls it touched
        #: settle (rejected, or run with their result withheld), then the loop fails the
        #: turn with it (``HookError``)
        self.hook_failure: HookError | None = None
        self.media_limits = limits.media

    # ------------------------------------------------------------ batch

    async def run_batch(self, calls: Sequence[ProposedCall], scope: StepScope) -> list[CallOutcome]:
        """Run one step's calls concurrently; outcomes come back in emission order.

        A failed commit in any call stops the calls that have not reached T1, lets running
        calls settle, and then raises ``CommitFailedError``. Cancellation never abandons a
        call past T1: it settles and its outcome is recorded first.
        """
        # Every call is checked and its claims reserved, in emission order, before any
        # call runs: conflicting calls then acquire in the order the model emitted them,
        # however long each one's permission takes.
        env = self.ctx.envelope.at_step(scope.step_id)
        prepared: list[_Ready | _Rejected] = []
        try:
            for call in calls:
                prepared.append(await self._prepare(call, env.for_call(call.call_id), scope=scope))
        except BaseException:  # cancelled inside a hook: nothing ran, nothing stays reserved
            for entry in prepared:
                if isinstance(entry, _Ready):
                    entry.reservation.close()
            raise
        if len(prepared) == 1:  # a batch of one needs no tasks of its own
            return [await self._run_prepared(prepared[0])]
        batch: Batch[CallOutcome] = Batch([call.call_id for call in calls])

        async def one(slot: Slot[CallOutcome]) -> CallOutcome:
            return await self._run_prepared(prepared[slot.index], halt=batch.halt, slot=slot)

        try:
            return await batch.run(one)
        finally:
            for entry in prepared:  # a task cancelled before it started never closed its own
                if isinstance(entry, _Ready):
                    entry.reservation.close()

    def authority_stats(self) -> tuple[AuthorityStatistics, ...]:
        """Who holds and who waits for which resources now, and counters so far."""
        return self.authorities.statistics()

    # ------------------------------------------------------------ one call

    async def run_call(
        self,
        call: ProposedCall,
        *,
        scope: StepScope,
        halt: asyncio.Event | None = None,
        parent_call_id: str | None = None,
        origin: Origin = "provider",
        visibility: Visibility = "model",
    ) -> CallOutcome:
        """Run one call on its own (a batch of one, or a nested call of a code cell)."""
        env = self.ctx.envelope.at_step(scope.step_id).for_call(
            call.call_id, parent_call_id=parent_call_id, origin=origin, visibility=visibility
        )
        return await self._run_prepared(await self._prepare(call, env, scope=scope), halt=halt)

    async def ask_again(self, call: ProposedCall, *, scope: StepScope) -> CallOutcome:
        """Recovery of a call that waited for an approval (the plan's ``ask_permission``):
        the whole path again, checks and permission first, as a call of this run. The
        log proves what was asked, never that it may run (DESIGN L10)."""
        env = self.ctx.envelope.for_call(call.call_id, origin="provider", visibility="model")
        return await self._run_prepared(await self._prepare(call, env, scope=scope))

    def _tool_context(
        self,
        call_id: str,
        parent_call_id: str | None,
        step: _CallStep | None,
        rerun: _Rerun | None = None,
        env: Envelope | None = None,
    ) -> ToolContext:
        ctx = self.ctx
        operation_id = ctx.ids.new_id()
        # the key of the call's first attempt: a re-dispatch sends the same one
        first = operation_id if rerun is None else self._first_operation(call_id, rerun)
        # every field, in declaration order (see lodger._core.records)
        tool_context: ToolContext = record(
            ToolContext,
            {
                "session_id": ctx.session_id,
                "turn_id": ctx.turn_id,
                "run_id": ctx.run_id,
                "call_id": call_id,
                "operation_id": operation_id,
                "workspace": ctx.workspace,
                "parent_call_id": parent_call_id,
                "hidden": ctx.hidden,
                "step": step,
                "nested": None if step is None else _CellCalls(step.scope, call_id, self),
                "extras": {},
                "deps": self.deps,
                "idempotency_key": idempotency_key(ctx.session_id, first),
                "runtime": None if self.calls is None or env is None else self.calls.for_call(env),
            },
        )
        return tool_context

    def _first_operation(self, call_id: str, rerun: _Rerun) -> str:
        state = self.ctx.journal.state.calls.get(call_id)
        if state is None or not state.operations:
            return rerun.retry_of
        return state.operations[0].operation_id

    async def _prepare(
        self,
        call: ProposedCall,
        env: Envelope,
        *,
        scope: StepScope | None,
        rerun: _Rerun | None = None,
    ) -> _Ready | _Rejected:
        """binding -> visibility -> arguments -> before_call -> claims.

        ``scope`` is the step that proposed the call (None for a re-dispatch, which no step
        proposes now: visibility does not apply). Claims are pure functions of the valid
        arguments, so they are computed now and reserved with the authorities at once: a
        batch prepares its calls in emission order, which is the order conflicting calls
        will acquire in. Nothing is granted here; that waits for permission.
        """
        try:
            # binding, visibility, arguments
            t = check_binding(
                self.registry, call.name, shown=None if scope is None else scope.visible
            )
            if scope is not None:
                check_visibility(
                    call.name, visible=scope.visible, activated_here=scope.activated_here
                )
            arguments = decode_arguments(call.name, call.arguments)
            problems = await schema_problems_from_loop(t, arguments, size=len(call.arguments))
            if problems:
                if rerun is not None:
                    raise Rejection(
                        "invalid_arguments",
                        f"the recorded arguments of {t.name} fail its schema now: "
                        + "; ".join(problems),
                    )
                raise invalid_arguments(call.name, problems)
            # before_call
            if self.before_call:
                arguments = await self._before(t, arguments, call.call_id, env)
            # claims
            step = None if scope is None else _CallStep(scope, env, self)
            tctx = self._tool_context(call.call_id, env.parent_call_id, step, rerun, env)
            claims = _claims(t, arguments, tctx)
            try:
                reservation = self.authorities.reserve(self._owner(call.call_id), claims)
            except AuthorityMisuseError:
                raise Rejection(
                    "duplicate_call",
                    f"call id {call.call_id!r} is already in use by a running call; "
                    "give every call its own id",
                ) from None
        except Rejection as rejection:
            return _Rejected(call=call, env=env, rejection=rejection, rerun=rerun)
        return _Ready(
            call=call,
            env=env,
            tool=t,
            arguments=arguments,
            ctx=tctx,
            reservation=reservation,
            rerun=rerun,
        )

    def _info(self, t: Tool, arguments: dict[str, Any], call_id: str, env: Envelope) -> CallInfo:
        return CallInfo(
            session_id=self.ctx.session_id,
            turn_id=self.ctx.turn_id,
            call_id=call_id,
            tool=t.name,
            arguments=dict(arguments),
            origin=env.origin,
            deps=self.deps,
        )

    async def _before(
        self, t: Tool, arguments: dict[str, Any], call_id: str, env: Envelope
    ) -> dict[str, Any]:
        """Run the before-call hooks in order: the arguments to go on with, or a Rejection."""
        for hook in self.before_call:
            try:
                verdict = await call_before(hook, self._info(t, arguments, call_id, env))
            except Exception as exc:  # noqa: BLE001 - the developer's failure: the turn fails
                failure = self._hook_failed(hook, "before-call", t, call_id, exc)
                raise Rejection("vetoed", failure.message) from None
            if isinstance(verdict, Veto):
                raise Rejection("vetoed", f"{t.name} was vetoed: {verdict.reason}")
            if isinstance(verdict, Rewrite):
                arguments = dict(verdict.arguments)
                problems = await schema_problems_from_loop(t, arguments)
                if problems:
                    raise Rejection(
                        "invalid_arguments",
                        f"a before-call hook rewrote the arguments of {t.name} into ones its "
                        "schema refuses: " + "; ".join(problems),
                    )
        return arguments

    async def _after(
        self,
        t: Tool,
        arguments: dict[str, Any],
        tctx: ToolContext,
        env: Envelope,
        status: ResultStatus,
        content: str,
    ) -> tuple[ResultStatus, str]:
        """Run the after-call hooks in order on an outcome, before T2 records it."""
        for hook in self.after_call:
            info = self._info(t, arguments, tctx.call_id, env)
            try:
                rewritten = await call_after(hook, info, CallResult(status=status, content=content))
            except Exception as exc:  # noqa: BLE001 - the call ran; say so and what failed
                failure = self._hook_failed(hook, "after-call", t, tctx.call_id, exc)
                return "error", (
                    f"{t.name} ran ({status}), then {failure.message}; its result is withheld"
                )
            if rewritten is not None:
                content = rewritten
        return status, content

    def _hook_failed(
        self, hook: object, stage: str, t: Tool, call_id: str, exc: Exception
    ) -> HookError:
        """Keep the first hook failure of the run (the turn fails on it once its calls
        have settled) and say what failed."""
        name = getattr(hook, "__qualname__", None) or type(hook).__qualname__
        module = getattr(hook, "__module__", None)
        where = f"{module}.{name}" if module else name
        failure = HookError(
            f"the {stage} hook {where} raised on {t.name} (call {call_id}): "
            f"{type(exc).__name__}: {exc}",
            hook=where,
            tool=t.name,
            call_id=call_id,
        )
        failure.__cause__ = exc
        if self.hook_failure is None:
            self.hook_failure = failure
        return failure

    async def _run_prepared(
        self,
        prepared: _Ready | _Rejected,
        *,
        halt: asyncio.Event | None = None,
        slot: Slot[CallOutcome] | None = None,
    ) -> CallOutcome:
        """permission -> resources -> expectations -> T1 -> execute -> after_call -> bound
        -> T2; leases end with the call."""
        call, env = prepared.call, prepared.env
        try:
            if isinstance(prepared, _Rejected):
                rejection = prepared.rejection
            else:
                t, arguments, tctx = prepared.tool, prepared.arguments, prepared.ctx
                try:
                    # permission: a re-dispatch cannot park (recovery parks it instead)
                    await self.permissions.permit(
                        self.ctx.journal, t, arguments, env, may_park=prepared.rerun is None
                    )
                    self._stop_if_halted(call, halt)
                    # resources: after permission, before T1 (and before the expectations,
                    # which hash the files the leases protect)
                    await prepared.reservation.acquire()
                    # expectations
                    expectations = (
                        await _expectations(t, arguments, tctx)
                        if t.expectations is not None
                        else ()
                    )
                except Rejection as exc:
                    rejection = exc
                except ApprovalParked as parked:
                    # not dispatched, nothing reserved is held: the run ends waiting
                    return CallOutcome(
                        call_id=call.call_id,
                        name=call.name,
                        status=None,
                        content=parked.message,
                        dispatched=False,
                        suspended=True,
                        awaiting_approval=True,
                    )
                else:
                    self._stop_if_halted(call, halt)
                    if slot is not None:
                        slot.dispatch()
                    return await self._dispatch(
                        t,
                        arguments,
                        tctx,
                        env,
                        resources=prepared.reservation.resources(),
                        expectations=tuple(expectations),
                        rerun=prepared.rerun,
                    )
            if prepared.rerun is not None:
                # Not run again: the call stays as it was (indeterminate); recovery parks it.
                raise ToolCallError(rejection.message, code=rejection.reason)
            await self.ctx.journal.fact(
                CallRejected(tool=call.name, reason=rejection.reason, message=rejection.message),
                env,
            )
            return CallOutcome(
                call_id=call.call_id,
                name=call.name,
                status=None,
                content=rejection.message,
                dispatched=False,
            )
        finally:
            if isinstance(prepared, _Ready):
                prepared.reservation.close()  # after T2, or wherever the call ended

    def _stop_if_halted(self, call: ProposedCall, halt: asyncio.Event | None) -> None:
        if halt is not None and halt.is_set():
            raise CommitFailedError(
                "the batch stopped after a failed commit; this call was not dispatched",
                session_id=self.ctx.session_id,
                call_id=call.call_id,
            )

    async def redispatch(
        self,
        *,
        previous: ToolDispatched,
        call_id: str,
        parent_call_id: str | None,
        origin: Origin,
        visibility: Visibility,
        attempt: int,
    ) -> CallOutcome:
        """Recovery of an ``idempotent`` operation: run it again under a new, linked T1.

        The log proves what was asked, not that it may run again (DESIGN L10): the call
        takes the chain of a first dispatch (binding, arguments against the bound tool's
        schema, the before-call hooks, claims, permission, resources, expectations, T1,
        execute, after-call hooks, T2), all against what is bound now; only visibility
        does not apply, since no step of this run proposed it. The recovery policy is
        the bound tool's, never the one recorded. A refusal raises ``ToolCallError``
        (recovery parks the operation).
        """
        env = self.ctx.envelope.for_call(
            call_id, parent_call_id=parent_call_id, origin=origin, visibility=visibility
        )
        call = ProposedCall(
            call_id=call_id,
            name=previous.tool,
            arguments=canonical_json(previous.arguments).decode(),
        )
        rerun = _Rerun(retry_of=previous.operation_id, attempt=attempt)
        return await self._run_prepared(await self._prepare(call, env, scope=None, rerun=rerun))

    async def _dispatch(
        self,
        t: Tool,
        arguments: dict[str, Any],
        tctx: ToolContext,
        env: Envelope,
        *,
        resources: tuple[str, ...],
        expectations: tuple[FileExpectation, ...],
        rerun: _Rerun | None = None,
    ) -> CallOutcome:
        """T1 -> execute -> after_call -> bound -> T2. From T1 on the call is never
        abandoned. ``rerun``: the operation a re-dispatch's T1 links to."""
        journal = self.ctx.journal
        await self._commit_t1(
            t, arguments, tctx, env, resources=resources, expectations=expectations, rerun=rerun
        )
        execution, cancelled = await self._execute(t, arguments, tctx)
        if execution is not None and execution.accepted is not None:
            running, execution = await self._accepted(t, tctx, env, execution, cancelled)
            if running is not None:
                return running
        if execution is not None and execution.suspended:
            # Suspended: T1 stays without a T2. The call's work runs elsewhere; the run
            # ends waiting and resume's probe of the call settles it when woken.
            if cancelled:
                raise asyncio.CancelledError
            return CallOutcome(
                call_id=tctx.call_id,
                name=t.name,
                status=None,
                content=execution.content,
                dispatched=True,
                suspended=True,
            )
        if execution is None:
            status: ResultStatus = "cancelled"
            content = f"{t.name} was cancelled while running; its effect may be partial"
        else:
            status, content = execution.status, execution.content
            if self.after_call:
                status, content = await self._after(t, arguments, tctx, env, status, content)
        media: tuple[ArtifactRef, ...] = ()
        if execution is not None and execution.parts:
            # stored before T2, which lists them; the projection reads them from the state
            media, note = await store_tool_media(
                execution.parts,
                self.bounder.artifacts,
                journal.state.media,
                tool=t.name,
                limits=self.media_limits,
            )
            content = f"{content}\n{note}" if note else content
        bounded = await self.bounder.bound(content)
        # T2: only after this commit may the outcome reach the model; with it, the
        # facts the call established (a background process it started or saw end).
        t2 = tool_responded(
            operation_id=tctx.operation_id,
            status=status,
            content=bounded.content,
            truncated=bounded.truncated,
            artifacts=bounded.artifacts + media,
        )
        facts = execution.facts if execution is not None else ()
        await journal.record(*(journal.draft(f, env) for f in (*facts, t2)))
        if cancelled:
            raise asyncio.CancelledError
        outcome: CallOutcome = record(
            CallOutcome,
            {
                "call_id": tctx.call_id,
                "name": t.name,
                "status": status,
                "content": bounded.content,
                "dispatched": True,
                "suspended": False,
                "awaiting_approval": False,
            },
        )
        return outcome

    async def _commit_t1(
        self,
        t: Tool,
        arguments: dict[str, Any],
        tctx: ToolContext,
        env: Envelope,
        *,
        resources: tuple[str, ...],
        expectations: tuple[FileExpectation, ...],
        rerun: _Rerun | None,
    ) -> None:
        """T1: the call is dispatched once this commits. Cancelled as it commits, the call
        is past T1 all the same, and T2 records that it never started."""
        journal = self.ctx.journal
        t1 = journal.draft(
            tool_dispatched(
                operation_id=tctx.operation_id,
                tool=t.name,
                arguments=arguments,
                attempt=1 if rerun is None else rerun.attempt,
                retry_of=None if rerun is None else rerun.retry_of,
                recovery=t.recovery,
                resources=resources,
                expectations=expectations,
            ),
            env,
        )
        # the files' old bytes, committed with T1 so a rewind can restore any edit
        checkpoints = await file_checkpoints(self.bounder.artifacts, tctx, expectations)
        try:
            await journal.record(*(journal.draft(c, env) for c in checkpoints), t1)
        except asyncio.CancelledError:
            if not journal.committed(t1):
                raise  # T1 is not in the log: the call was never dispatched
            # T1 committed as the cancellation arrived: the call is past T1, so it is not
            # abandoned; it never started, and that is what T2 records.
            await journal.fact(
                ToolResponded(
                    operation_id=tctx.operation_id,
                    status="cancelled",
                    content=f"{t.name} was cancelled before it started; it did not run",
                ),
                env,
            )
            raise

    async def _execute(
        self, t: Tool, arguments: dict[str, Any], tctx: ToolContext
    ) -> tuple[Execution | None, bool]:
        """Run the call on its tool's executor: how it ended (None: the executor did not
        settle) and whether this task was cancelled meanwhile."""
        timeout = t.timeout if t.timeout is not None else self.default_timeout
        # The executor is awaited in this task (no task and shield of its own): it settles
        # on cancellation by contract and says how the call ended. Whether this task was
        # cancelled meanwhile is read from its cancellation count, and the cancellation
        # goes on after T2 records the outcome.
        task = asyncio.current_task()
        assert task is not None
        cancels = task.cancelling()
        execution: Execution | None
        try:
            execution = await self.executors.for_tool(t).execute(
                tool=t, arguments=arguments, context=tctx, time_limit=timeout
            )
        except asyncio.CancelledError:
            execution = None  # an executor that did not settle: recorded as cancelled
        cancelled = execution is None or task.cancelling() > cancels
        return execution, cancelled

    def _owner(self, call_id: str) -> str:
        # Authorities may be shared by sessions; call ids are only unique in one session.
        return f"{self.ctx.session_id}/{call_id}"

    # ------------------------------------------------------------ long-running calls

    async def _accepted(
        self, t: Tool, tctx: ToolContext, env: Envelope, execution: Execution, cancelled: bool
    ) -> tuple[CallOutcome | None, Execution]:
        """A call the remote side accepted: ``call_accepted`` with its handle (before the
        model sees anything), then, for ``wait``, its polled result. The outcome of a
        call left running (None when a result, or an error, goes on to T2)."""
        accepted = execution.accepted
        assert accepted is not None
        if t.poll is None:
            return None, Execution(
                "error",
                f"{t.name} returned Accepted but declares no poll; the remote work it "
                "started cannot be followed (declare poll=... on the tool)",
            )
        fact = CallAccepted(
            operation_id=tctx.operation_id, handle=dict(accepted.handle), wait=accepted.wait
        )
        await self.ctx.journal.fact(fact, env)
        if cancelled:
            raise asyncio.CancelledError  # it runs remotely; its handle settles it later
        if accepted.wait == "wait":
            timeout = t.timeout if t.timeout is not None else self.default_timeout
            result = await wait_for_result(t, fact.handle, tctx, time_limit=timeout)
            if result is not None:
                return None, result
        running = CallOutcome(
            call_id=tctx.call_id,
            name=t.name,
            status="ok",
            content=running_note(t.name, fact),
            dispatched=True,
        )
        return running, execution

    async def between_steps(self) -> None:
        """Give other tasks the loop once, then settle the running calls whose results
        came (``settle_running``)."""
        await asyncio.sleep(0)
        if self.ctx.journal.state.accepted_open:
            await self.settle_running()

    async def settle_running(self) -> int:
        """Poll the calls still running remotely whose spacing says they are due
        (``PollSpacing``) and commit the results that came as their T2: how many
        settled."""
        settled = 0
        for state in running_calls(list(self.ctx.journal.state.accepted_open.values())):
            if not self.spacing.due(state.call_id):
                continue
            if isinstance(await self.settle_accepted(state), Execution):
                settled += 1
            else:
                self.spacing.polled(state.call_id)
        return settled

    async def settle_accepted(self, state: CallState, *, wait: bool = False) -> Polled:
        """Poll the running call ``state`` once (with ``wait``, with backoff until its
        time limit, as a ``wait`` call does); a result is committed as its T2."""
        record = state.latest
        assert record is not None and record.accepted is not None
        t = self.registry.get(record.dispatched.tool)
        if t is None:
            return CannotTell(reason=f"{record.dispatched.tool} is not bound in this run")
        tctx = dataclasses.replace(
            self._tool_context(state.call_id, state.parent_call_id, None),
            operation_id=record.operation_id,
            idempotency_key=idempotency_key(self.ctx.session_id, state.operations[0].operation_id),
        )
        if wait:
            limit = t.timeout if t.timeout is not None else self.default_timeout
            polled = await wait_polls(t, record.accepted.handle, tctx, time_limit=limit)
        else:
            polled = await poll_once(t, record.accepted.handle, tctx)
        if isinstance(polled, Execution):
            env = self.ctx.envelope.for_call(
                state.call_id,
                parent_call_id=state.parent_call_id,
                origin=state.origin,
                visibility="hidden" if state.parent_call_id is not None else "model",
            )
            bounded = await self.bounder.bound(polled.content)
            await self.ctx.journal.fact(
                tool_responded(
                    operation_id=record.operation_id,
                    status=polled.status,
                    content=bounded.content,
                    truncated=bounded.truncated,
                    artifacts=bounded.artifacts,
                ),
                env,
            )
        return polled


# ---------------------------------------------------------------- tool hooks as stages


def _claims(t: Tool, arguments: dict[str, Any], ctx: ToolContext) -> tuple[ResourceClaim, ...]:
    """The resources a call touches, from the tool's ``claims`` hook."""
    if t.claims is None:
        return ()
    try:
        claims = tuple(t.claims(arguments, ctx))
    except ToolCallError as exc:
        raise Rejection("invalid_arguments", str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a broken hook fails the call, not the turn
        raise Rejection(
            "claims_failed",
            f"{t.name} could not declare its resources ({type(exc).__name__}: {exc}); report this",
        ) from None
    for claim in claims:
        if not isinstance(claim, ResourceClaim):
            raise Rejection(
                "claims_failed",
                f"{t.name} declared {claim!r} as a resource, not a ResourceClaim; report this",
            )
    return claims


async def _expectations(
    t: Tool, arguments: dict[str, Any], ctx: ToolContext
) -> Sequence[FileExpectation]:
    """What the tool expects of the world before and after (hashes recorded in T1)."""
    if t.expectations is None:
        return ()
    try:
        return await t.expectations(arguments, ctx)
    except ToolCallError as exc:
        raise Rejection("precondition", str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a broken hook fails the call, not the turn
        raise Rejection(
            "precondition",
            f"{t.name} could not check its preconditions ({type(exc).__name__}: {exc})",
        ) from None

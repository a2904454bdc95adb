"""Resume and operator decisions: acting on a recovery plan, by appending facts only.

Resume is not retry. It verifies the prefix (opening the writer verifies every event),
checks the environment invariants, claims the prefix with a ``run_started`` fact at the
prefix's high-water mark (only one append can ever land there), applies each call's
recovery policy, and then either continues the turn as a new run that replays history
or stops and says exactly what blocks it and the ways out. Tools are never re-run to
rebuild history.

Every blocked state has an operator way out: a parked call is decided (``decide``); a
moved or recreated workspace is relocated (a resume with ``relocate`` checks the files the
log's hashes cover, see ``lodger.engine.relocation``); and any open turn can be ended as
abandoned (``abandon``), which needs neither a parked call nor the workspace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from lodger.engine.context import RunContext
from lodger.engine.envelope import Envelope
from lodger.engine.journal import Journal
from lodger.engine.pipeline import CallPipeline, StepScope
from lodger.engine.relocation import Relocation, expected_files, find_mismatches
from lodger.engine.settings import Services
from lodger.errors import (
    AppendConflictError,
    NextStep,
    ResumeBlockedError,
    SessionNotFoundError,
    ToolCallError,
    UsageError,
)
from lodger.events import (
    CancelRequested,
    Event,
    EventDraft,
    ModelOutput,
    OperatorDecision,
    ProposedCall,
    RecoveryDecided,
    RecoveryObserved,
    RunEnded,
    RunStarted,
    StepStarted,
    ToolResponded,
    ToolsActivated,
    TurnEnded,
)
from lodger.ids import Clock, IdFactory
from lodger.providers.base import Model
from lodger.recovery.classify import CallState
from lodger.recovery.plan import PlannedCall, RecoveryPlan
from lodger.substrates.background import reconcile, unconverged
from lodger.tools.registry import ToolRegistry
from lodger.tools.spec import CannotTell, ProbeResult, ToolContext, idempotency_key
from lodger.tools.workspace import workspace_id

if TYPE_CHECKING:
    from lodger.engine.state import SessionState
    from lodger.storage import SessionWriter

__all__ = [
    "Decision",
    "Invariants",
    "ResumableEngine",
    "abandon",
    "cancel_open",
    "cell_interrupted_report",
    "check_invariants",
    "decide",
    "resume_run",
]

Decision = Literal["completed", "not_applied", "abandon"]

NOT_DISPATCHED = (
    "the run stopped before this call was dispatched; it never ran. "
    "Call it again if it is still needed."
)


class ResumableEngine(Protocol):
    """What a resume needs of the engine that drives the turn on: ``Engine``
    (``lodger.engine.loop``) is one. A protocol, so the loop imports this module and not
    the other way round."""

    @property
    def model(self) -> Model: ...

    @property
    def registry(self) -> ToolRegistry: ...

    @property
    def workspace(self) -> Path | None: ...

    @property
    def services(self) -> Services: ...

    @property
    def deps(self) -> Any: ...

    def run_context(self, journal: Journal, *, turn_id: str, run_id: str) -> RunContext: ...

    def pipeline(self, ctx: RunContext) -> CallPipeline: ...


@dataclass(frozen=True, kw_only=True)
class Invariants:
    """What the environment checks found: one line per violation, by topic, and the
    relocation a resume records when it moves the session to another workspace."""

    workspace: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    relocation: Relocation | None = None
    #: background processes the log says are live that reconciling left neither adopted
    #: nor ended ("no unconverged background work", DESIGN's resume invariant)
    background: tuple[str, ...] = ()

    @property
    def problems(self) -> list[str]:
        return [*self.workspace, *self.files, *self.tools, *self.background]


async def check_invariants(
    engine: ResumableEngine, state: SessionState, *, relocate: bool = False
) -> Invariants:
    """Environment invariants a resume needs.

    The workspace must be the one the session works in (the same directory identity).
    With ``relocate``, another directory is accepted when every file the log's hashes
    cover holds what the log says it holds now (``lodger.engine.relocation``).
    """
    workspace, files, relocation = await asyncio.to_thread(
        _check_workspace,
        state.workspace,
        state.workspace_id,
        engine.workspace,
        expected_files(state.events) if relocate else None,
    )
    missing = [name for name in state.used_tools() if name not in engine.registry]
    tools = (
        ("tools: the history used tools that are not bound now: " + ", ".join(missing),)
        if missing
        else ()
    )
    return Invariants(workspace=workspace, files=files, tools=tools, relocation=relocation)


def _check_workspace(
    recorded: str | None,
    recorded_id: str | None,
    current: Path | None,
    allowed: Mapping[str, frozenset[str | None]] | None,
) -> tuple[tuple[str, ...], tuple[str, ...], Relocation | None]:
    """Workspace lines, file lines and the relocation; ``allowed`` (the files the log's
    hashes cover) is given only to relocate. Blocking (stats and hashes): in a thread."""
    if recorded_id is None:
        return (), (), None
    if current is None:
        return (f"workspace: the session works in {recorded!r} and this run has none",), (), None
    here = str(current)
    try:
        current_id: str | None = workspace_id(current)
    except OSError:  # gone (or unreadable): it cannot be the session's workspace
        current_id = None
    if current_id == recorded_id:
        return (), (), None
    if current_id is None:
        if here == recorded:
            line = f"workspace: the session's workspace {here!r} does not exist (moved or deleted)"
        else:
            line = f"workspace: {here!r} does not exist"
        return (line,), (), None
    if allowed is None:
        if here == recorded:
            line = (
                f"workspace: {here!r} is not the directory the session worked in "
                "(it was deleted and created again, or is another mount)"
            )
        else:
            gone = recorded is not None and not os.path.isdir(recorded)
            line = (
                f"workspace: the session works in {recorded!r}"
                + (", which does not exist any more," if gone else "")
                + f" and this run has {here!r} (not the same directory)"
            )
        return (line,), (), None
    mismatches = find_mismatches(current, allowed)
    if mismatches:
        return (), tuple(m.describe() for m in mismatches), None
    return (), (), Relocation(workspace=here, workspace_id=current_id)


def _refusal(session_id: str, found: Invariants, target: Path | None) -> ResumeBlockedError:
    """The error for failed invariants, naming every way out there is."""
    abandon = NextStep(action="abandon", session_id=session_id)
    relocate = NextStep(action="relocate", session_id=session_id)
    if found.files:
        message = (
            f"session {session_id!r} cannot move to {str(target)!r}: {len(found.files)} file(s) "
            "differ from what its log recorded: " + "; ".join(found.files)
        )
        hint = (
            "restore those files (or relocate to a directory that holds them) and resume "
            "again, or abandon the turn"
        )
    else:
        message = f"session {session_id!r} cannot resume: " + "; ".join(found.problems)
        hint = (
            "resume in the workspace the session works in; if it moved, relocate the "
            "session to the new directory (its files are checked against the log's hashes "
            "first); or abandon the turn"
            if found.workspace
            else "bind the tools the session used (`lodger resume --tools FILE.py` for @tool "
            "functions, `--mcp NAME=CMD|URL` for an MCP server's; `Agent(tools=...)` in "
            "Python), or abandon the turn"
        )
    steps = (relocate, abandon) if found.workspace or found.files else (abandon,)
    return ResumeBlockedError(
        message,
        blockers=found.problems,
        hint=hint,
        session_id=session_id,
        next_steps=steps,
    )


def _no_log(session_id: str) -> SessionNotFoundError:
    return SessionNotFoundError(
        f"no log for session {session_id!r}",
        session_id=session_id,
        next_steps=(NextStep(action="list_sessions"),),
    )


def _open_turn_plan(
    state: SessionState, session_id: str, *, missing: str, hint: str, code: str
) -> RecoveryPlan:
    """The recovery plan of the session's open turn, or the error that there is none."""
    if not state.events:
        raise _no_log(session_id)
    plan = state.plan()
    if plan.turn_id is None:
        raise UsageError(
            missing,
            hint=hint,
            code=code,
            session_id=session_id,
            next_steps=(NextStep(action="run", session_id=session_id),),
        )
    return plan


async def resume_run(
    engine: ResumableEngine, journal: Journal, *, relocate: bool = False
) -> tuple[RunContext, tuple[str, ...]]:
    """Claim the open turn's prefix for a new run and apply its recovery plan.

    With ``relocate``, the run may move the session to ``engine.workspace`` when the files
    the log's hashes cover match there; its claim records the new workspace.
    Returns the new run's context, ready to drive, and the calls whose probe said
    ``pending`` (suspended work still running elsewhere: the run should end waiting, not
    drive); raises ``ResumeBlockedError`` naming every parked operation or failed
    invariant and the ways out.
    """
    state = journal.state
    session_id = journal.session_id
    plan = _open_turn_plan(
        state,
        session_id,
        missing=f"session {session_id!r} has no interrupted turn to resume",
        hint="start a new turn on the session instead",
        code="nothing_to_resume",
    )
    if relocate and engine.workspace is None:
        raise UsageError(
            f"session {session_id!r} cannot be relocated without a workspace to move to",
            hint="name the directory that now holds the session's files",
            code="no_workspace",
            session_id=session_id,
        )
    found = await check_invariants(engine, state, relocate=relocate)
    # background processes the log says are live: adopted if they still run, else ended;
    # one left neither (unconverged) refuses the resume before any run starts
    ended = reconcile(session_id, state.events)
    left = unconverged(session_id, state.events, ended)
    if left:
        found = dataclasses.replace(found, background=left)
    if found.problems:
        raise _refusal(session_id, found, engine.workspace)
    actionable = [c for c in plan.calls if c.action not in ("none", "wait_operator")]
    if plan.blocked and not actionable:
        raise _blocked(session_id, plan.blocked)

    ctx = await _claim(engine, journal, plan, found.relocation)
    if ended:
        await journal.record(*(journal.draft(e, ctx.envelope) for e in ended))
    pipeline = engine.pipeline(ctx)
    parked: list[PlannedCall] = []
    pending: list[str] = []
    # Code cells last: their nested calls follow their own policies first, so the fact
    # that settles a cell lists what each nested call finally did.
    for planned in sorted(plan.calls, key=lambda c: c.action == "report"):
        call_state = state.calls[planned.call_id]
        applied = await _apply(engine, ctx, pipeline, planned, call_state)
        if applied == "parked":
            parked.append(planned)
        elif applied == "pending":
            pending.append(planned.call_id)
    if parked:
        await journal.fact(
            RunEnded(status="parked", error=f"{len(parked)} operation(s) wait for a decision"),
            ctx.envelope,
        )
        raise _blocked(session_id, tuple(parked))
    return ctx, tuple(pending)


async def _claim(
    engine: ResumableEngine, journal: Journal, plan: RecoveryPlan, moved: Relocation | None
) -> RunContext:
    """Claim the plan's prefix with the new run's ``run_started`` (naming the workspace it
    moves to, if any): the new run's context, or ``ResumeBlockedError`` if another run
    claimed it first."""
    session_id = journal.session_id
    turn_id = plan.turn_id
    assert turn_id is not None  # the plan of an open turn (resume_run: _open_turn_plan)
    run_id = engine.services.ids.new_id()
    claim = journal.draft(
        RunStarted(
            model=engine.model.spec,
            parent_run_id=plan.last_run_id,
            resumed_from=plan.prefix,
            tools=tuple(engine.registry.names()),
            workspace=moved.workspace if moved else None,
            workspace_id=moved.workspace_id if moved else None,
        ),
        Envelope(turn_id=turn_id, run_id=run_id),
    )
    try:
        # The claim: one append at the prefix's high-water mark; a second resume of the
        # same prefix can never also land there.
        await journal.claim(claim)
    except AppendConflictError as exc:
        raise ResumeBlockedError(
            f"another run already continues session {session_id!r} from offset "
            f"{plan.prefix.high_water}",
            blockers=["another run claimed this prefix"],
            hint="look at the recovery plan again to see the new state",
            session_id=session_id,
            next_steps=(NextStep(action="recover", session_id=session_id),),
        ) from exc
    return engine.run_context(journal, turn_id=turn_id, run_id=run_id)


async def _apply(
    engine: ResumableEngine,
    ctx: RunContext,
    pipeline: CallPipeline,
    planned: PlannedCall,
    state: CallState,
) -> Literal["settled", "parked", "pending"]:
    """Carry out one call's action: settled, (still) parked, or pending (a suspended
    call whose work still runs elsewhere: nothing is recorded, the run waits again)."""
    nested = state.parent_call_id is not None
    env = ctx.envelope.for_call(
        state.call_id,
        parent_call_id=state.parent_call_id,
        origin="runtime",
        visibility="hidden" if nested else "model",
    )
    journal = ctx.journal
    if planned.action == "none":
        return "settled"
    if planned.action == "wait_operator":
        return "parked"
    if planned.action == "ask_permission":
        # its approval was parked: the whole path again; the approver finds the answer
        # (the call runs or is denied) or parks it again (the run waits once more)
        call, scope = _proposed(journal.state.events, state, journal.state.open_turn_offset)
        outcome = await pipeline.ask_again(call, scope=scope)
        return "pending" if outcome.awaiting_approval else "settled"
    if planned.action == "poll":  # running remotely: its handle settles it
        return await _poll_running(ctx, pipeline, state, env)
    if planned.action == "tell_model":
        await journal.fact(
            RecoveryObserved(
                operation_id="",
                status="not_applied",
                reason="not_dispatched",
                observation=NOT_DISPATCHED,
            ),
            env,
        )
        return "settled"
    return await _recover(engine, ctx, pipeline, state, env)


async def _recover(
    engine: ResumableEngine,
    ctx: RunContext,
    pipeline: CallPipeline,
    state: CallState,
    env: Envelope,
) -> Literal["settled", "parked", "pending"]:
    """Settle an indeterminate call (T1 without T2) by the bound tool's recovery policy:
    a cell is reported, an idempotent call runs again, a queryable one is probed, and
    what cannot be proven is parked for an operator."""
    nested = state.parent_call_id is not None
    journal = ctx.journal
    record = state.latest
    assert record is not None
    bound = engine.registry.get(record.dispatched.tool)
    # The policy is the bound tool's, never the one the log records (DESIGN L10).
    policy = bound.recovery if bound is not None else "never_retry"
    why = f"{policy}: the outcome cannot be proven from here"
    if policy == "report":  # a code cell: never run again, whatever it did
        await _settle_cell(ctx, state, env)
        return "settled"
    if policy == "idempotent":
        try:
            await pipeline.redispatch(
                previous=record.dispatched,
                call_id=state.call_id,
                parent_call_id=state.parent_call_id,
                origin=state.origin,
                visibility="hidden" if nested else "model",
                attempt=record.dispatched.attempt + 1,
            )
            return "settled"
        except ToolCallError as exc:  # refused now: binding, schema or permission
            why = f"not run again: {exc.message}"
    elif policy == "queryable":
        seen = await _probe(engine, ctx, state)
        if seen.pending:
            return "pending"
        if seen.applied is True:
            observed = RecoveryObserved(
                operation_id=record.operation_id,
                status="completed",
                reason="probe_applied",
                observation=seen.content or seen.observation,
            )
        elif seen.applied is False:
            observed = RecoveryObserved(
                operation_id=record.operation_id,
                status="not_applied",
                reason="probe_not_applied",
                observation=seen.observation,
            )
        else:
            observed = RecoveryObserved(
                operation_id=record.operation_id,
                status="unknown",
                reason="probe_unknown",
                observation=seen.observation,
            )
        await journal.fact(observed, env)
        if seen.applied is not None:
            return "settled"
    # never_retry, a refused re-run, or a probe that could not tell: park for an operator
    await journal.fact(
        RecoveryDecided(operation_id=record.operation_id, action="park", reason=why), env
    )
    return "parked"


async def _poll_running(
    ctx: RunContext, pipeline: CallPipeline, state: CallState, env: Envelope
) -> Literal["settled", "parked"]:
    """A call the remote side accepted before the crash: its result through the tool's
    poll (its T2), or left running (the model was told; a later poll settles it), or
    parked for a person only when the poll cannot tell. A ``wait`` call waits again, with
    backoff within its time limit, as it did before the crash."""
    record = state.latest
    assert record is not None
    waits = record.accepted is not None and record.accepted.wait == "wait"
    polled = await pipeline.settle_accepted(state, wait=waits)
    if not isinstance(polled, CannotTell):
        return "settled"
    await ctx.journal.fact(
        RecoveryDecided(
            operation_id=record.operation_id,
            action="park",
            reason=f"the poll of its handle cannot tell: {polled.reason}",
        ),
        env,
    )
    return "parked"


def _proposed(
    events: Sequence[Event], state: CallState, turn_offset: int | None
) -> tuple[ProposedCall, StepScope]:
    """The call as the model proposed it, and what its step showed (its recorded tool
    set and what that step activated): a pure reading of the open turn's events."""
    proposing = events[state.offset]
    body = proposing.body
    assert isinstance(body, ModelOutput)  # a top-level call's offset is its model output
    call = next(c for c in body.calls if c.call_id == state.call_id)
    step_id = proposing.step_id or ""
    visible: set[str] = set()
    activated: set[str] = set()
    for e in events[turn_offset or 0 :]:
        if e.step_id != step_id:
            continue
        if isinstance(e.body, StepStarted):
            visible.update(ref.name for ref in e.body.tools)
        elif isinstance(e.body, ToolsActivated):
            activated.update(e.body.names)
    return call, StepScope(step_id=step_id, visible=frozenset(visible), activated_here=activated)


async def _settle_cell(ctx: RunContext, cell: CallState, env: Envelope) -> bool:
    """Settle an interrupted code cell without running it again: one ``recovery_observed``
    fact (status ``interrupted``, reason ``cell_interrupted``) that lists each nested
    call's outcome, which the model sees as the cell's result. A cell whose nested calls
    still wait for an operator stays open until they are decided."""
    journal = ctx.journal
    record = cell.latest
    assert record is not None
    state = journal.state
    children = [c for c in state.calls.values() if c.parent_call_id == cell.call_id]
    if any(c.status()[0] in ("indeterminate", "parked") for c in children):
        return True  # the parked nested call blocks the resume; the cell waits for it
    observation = cell_interrupted_report(state.events, cell.call_id, children)
    await journal.fact(
        RecoveryObserved(
            operation_id=record.operation_id,
            status="interrupted",
            reason="cell_interrupted",
            observation=observation,
        ),
        env,
    )
    return True


_RESULT_PREVIEW = 2000


def cell_interrupted_report(
    events: Sequence[Event], cell_call_id: str, children: Sequence[CallState]
) -> str:
    """What the model is told about an interrupted cell, as JSON text: each nested call
    in start order with its tool, arguments, outcome and (bounded) result."""
    nested: list[dict[str, object]] = []
    known = {c.call_id for c in children}
    for child in sorted(children, key=lambda c: c.offset):
        status, _ = child.status()
        entry: dict[str, object] = {"call_id": child.call_id, "tool": child.tool}
        op = child.latest
        if op is not None:
            entry["arguments"] = op.dispatched.arguments
            if op.decision is not None and op.decision.result is not None:
                entry["result"] = op.decision.result[:_RESULT_PREVIEW]
            elif op.responded_at is not None:
                body = events[op.responded_at].body
                if isinstance(body, ToolResponded):
                    entry["status"] = body.status
                    entry["result"] = body.content[:_RESULT_PREVIEW]
            elif op.observed is not None:
                entry["result"] = op.observed.observation[:_RESULT_PREVIEW]
            if op.dispatched.attempt > 1:
                entry["attempts"] = op.dispatched.attempt
        entry["outcome"] = status
        nested.append(entry)
    # Calls the cell asked for that never reached a T1 or a rejection (a permission was
    # still pending, say): they never ran.
    for e in events:
        if e.parent_call_id == cell_call_id and e.call_id and e.call_id not in known:
            known.add(e.call_id)
            tool = getattr(e.body, "tool", "")
            nested.append({"call_id": e.call_id, "tool": tool, "outcome": "not_dispatched"})
    return json.dumps(
        {
            "cell": "interrupted",
            "message": "this code cell was interrupted and is never run again; its nested "
            "tool calls are listed with what each one did. Decide what to do next: run "
            "a new cell for what is still missing, or answer.",
            "nested": nested,
        },
        ensure_ascii=False,
    )


async def _probe(engine: ResumableEngine, ctx: RunContext, state: CallState) -> ProbeResult:
    record = state.latest
    assert record is not None
    t = engine.registry.get(record.dispatched.tool)
    if t is None or t.probe is None:
        return ProbeResult(applied=None, observation="the tool has no probe in this run")
    tctx = ToolContext(
        session_id=ctx.session_id,
        turn_id=ctx.turn_id,
        run_id=ctx.run_id,
        call_id=state.call_id,
        operation_id=record.operation_id,
        workspace=ctx.workspace,
        parent_call_id=state.parent_call_id,
        hidden=ctx.hidden,
        deps=engine.deps,
        idempotency_key=idempotency_key(ctx.session_id, state.operations[0].operation_id),
    )
    try:
        return await t.probe(record.dispatched, tctx)
    except Exception as exc:  # noqa: BLE001 - a failing probe proves nothing: park
        return ProbeResult(applied=None, observation=f"the probe failed: {exc}")


#: the call states an operator may decide (and an abandoned turn decides): their outcome
#: is not known (a running call's remote side may still answer; a decision ends that)
_UNDECIDED = ("indeterminate", "parked", "running")


def _blocked(session_id: str, calls: Sequence[PlannedCall]) -> ResumeBlockedError:
    lines = [
        f"call {c.call_id} ({c.tool}, operation {c.operation_id}) is parked: {c.reason}"
        for c in calls
    ]
    return ResumeBlockedError(
        f"session {session_id!r} waits for a decision on {len(calls)} operation(s): "
        + "; ".join(lines),
        blockers=lines,
        hint="decide each parked call: completed (with its result), not applied, or "
        "abandon the turn",
        session_id=session_id,
        next_steps=(
            *(NextStep(action="decide", session_id=session_id, call_id=c.call_id) for c in calls),
            NextStep(action="abandon", session_id=session_id),
        ),
    )


class _OperatorFacts:
    """Drafts of the facts an operator's command appends, with injected ids and clock."""

    def __init__(self, clock: Clock, ids: IdFactory) -> None:
        self.clock, self.ids = clock, ids
        self.drafts: list[EventDraft] = []

    def add(
        self, body: OperatorDecision | RunEnded | TurnEnded | CancelRequested, where: Envelope
    ) -> None:
        self.drafts.append(
            EventDraft(
                id=self.ids.new_id(),
                ts=self.clock.now_us(),
                body=body,
                turn_id=where.turn_id,
                run_id=where.run_id,
                call_id=where.call_id,
                parent_call_id=where.parent_call_id,
                origin=where.origin,
                visibility=where.visibility,
            )
        )

    def decision(self, planned: PlannedCall, turn_id: str | None, body: OperatorDecision) -> None:
        env = Envelope(
            turn_id=turn_id,
            call_id=planned.call_id,
            parent_call_id=planned.parent_call_id,
            origin="operator",
            visibility="hidden" if planned.parent_call_id else "model",
        )
        self.add(body, env)

    def end_turn(self, plan: RecoveryPlan, reason: str | None) -> None:
        if plan.run_open:
            error = "abandoned by the operator" + (f": {reason}" if reason else "")
            self.add(
                RunEnded(status="abandoned", error=error),
                Envelope(turn_id=plan.turn_id, run_id=plan.last_run_id),
            )
        self.add(
            TurnEnded(status="abandoned", reason=reason),
            Envelope(turn_id=plan.turn_id, origin="operator"),
        )


async def decide(
    writer: SessionWriter,
    state: SessionState,
    call_id: str,
    decision: Decision,
    *,
    result: str | None = None,
    clock: Clock,
    ids: IdFactory,
    by: str = "operator",
    who: str | None = None,
) -> list[Event]:
    """Record an operator decision on an indeterminate or parked call of the open turn
    (``who``: the operator, ``operator_decision.who``)."""
    session_id = writer.session_id
    if not state.events:
        raise _no_log(session_id)
    plan: RecoveryPlan = state.plan()
    planned = next((c for c in plan.calls if c.call_id == call_id), None)
    if planned is None:
        raise UsageError(
            f"call {call_id!r} is not part of an interrupted turn of session {session_id!r}",
            hint="the recovery plan lists the calls that need a decision",
            code="no_such_call",
            session_id=session_id,
            call_id=call_id,
            next_steps=(NextStep(action="recover", session_id=session_id),),
        )
    if planned.status not in _UNDECIDED or planned.operation_id is None:
        raise UsageError(
            f"call {call_id!r} is {planned.status}; only indeterminate, parked or running "
            "calls take a decision",
            code="nothing_to_decide",
            session_id=session_id,
            call_id=call_id,
        )
    facts = _OperatorFacts(clock, ids)
    facts.decision(
        planned,
        plan.turn_id,
        OperatorDecision(
            operation_id=planned.operation_id, decision=decision, result=result, by=by, who=who
        ),
    )
    if decision == "abandon":
        facts.end_turn(plan, None)
    events = await writer.append(facts.drafts, expected_offset=plan.prefix.high_water)
    state.feed(events)
    return events


async def abandon(
    writer: SessionWriter,
    state: SessionState,
    *,
    reason: str | None = None,
    clock: Clock,
    ids: IdFactory,
    by: str = "operator",
    who: str | None = None,
) -> list[Event]:
    """End the session's open turn as abandoned by an operator (``who``), whatever blocks it.

    Needs no parked call and no workspace: every call whose outcome is unknown gets an
    ``abandon`` decision, an open run ends ``abandoned``, and ``turn_ended`` (origin
    ``operator``) says the turn was abandoned and why. The session can then start a new
    turn; nothing of the abandoned one is run again.
    """
    session_id = writer.session_id
    plan = _open_turn_plan(
        state,
        session_id,
        missing=f"session {session_id!r} has no open turn to abandon",
        hint="its last turn has ended; start a new turn on the session instead",
        code="nothing_to_abandon",
    )
    facts = _OperatorFacts(clock, ids)
    for planned in plan.calls:
        if planned.status in _UNDECIDED and planned.operation_id is not None:
            facts.decision(
                planned,
                plan.turn_id,
                OperatorDecision(
                    operation_id=planned.operation_id, decision="abandon", by=by, who=who
                ),
            )
    facts.end_turn(plan, reason)
    events = await writer.append(facts.drafts, expected_offset=plan.prefix.high_water)
    state.feed(events)
    return events


async def cancel_open(
    writer: SessionWriter,
    state: SessionState,
    *,
    who: str | None,
    reason: str,
    clock: Clock,
    ids: IdFactory,
) -> list[Event]:
    """End the session's open turn ``cancelled`` when nobody runs it (interrupted by a
    crash, parked, or waiting for an approval nobody will answer): what a cancel of a
    running turn commits, ``cancel_requested``, ``run_ended`` and ``turn_ended``
    cancelled, in one append. Nothing runs: a call whose outcome is unknown gets an
    ``abandon`` decision (``by="cancel"``), as ``abandon`` gives it, so no resume runs it
    later. ``[]`` when no turn is open (a second cancel writes nothing)."""
    if state.open_turn is None:
        return []
    plan = state.plan()
    facts = _OperatorFacts(clock, ids)
    facts.add(
        CancelRequested(who=who, reason=reason),
        Envelope(turn_id=plan.turn_id, run_id=plan.last_run_id if plan.run_open else None),
    )
    for planned in plan.calls:
        if planned.status in _UNDECIDED and planned.operation_id is not None:
            facts.decision(
                planned,
                plan.turn_id,
                OperatorDecision(
                    operation_id=planned.operation_id, decision="abandon", by="cancel", who=who
                ),
            )
    if plan.run_open:
        facts.add(
            RunEnded(status="cancelled", error="cancelled" + (f": {reason}" if reason else "")),
            Envelope(turn_id=plan.turn_id, run_id=plan.last_run_id),
        )
    facts.add(
        TurnEnded(status="cancelled", reason=reason or None),
        Envelope(turn_id=plan.turn_id, origin="operator"),
    )
    events = await writer.append(facts.drafts, expected_offset=plan.prefix.high_water)
    state.feed(events)
    return events

"""Resume and operator decisions: acting on a recovery plan, by appending facts only.

Resume is not retry. It verifies the prefix (opening the writer verifies every event),
checks the environment invariants, claims the prefix with a ``run_started`` fact at the
prefix's high-water mark (only one append can ever land there), applies each call's
recovery policy, and then either continues the turn as a new run that replays history
or stops and says exactly what blocks it. Tools are never re-run to rebuild history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from lodger.engine.context import Envelope, RunContext
from lodger.engine.journal import Journal
from lodger.engine.pipeline import CallPipeline
from lodger.errors import (
    AppendConflictError,
    NextStep,
    ResumeBlockedError,
    SessionNotFoundError,
    ToolCallError,
    UsageError,
)
from lodger.events import (
    Event,
    EventDraft,
    OperatorDecision,
    RecoveryDecided,
    RecoveryObserved,
    RunEnded,
    RunStarted,
    TurnEnded,
)
from lodger.ids import Clock, IdFactory
from lodger.recovery.classify import CallState
from lodger.recovery.plan import PlannedCall, RecoveryPlan
from lodger.tools.spec import ProbeResult, ToolContext
from lodger.tools.workspace import workspace_id

if TYPE_CHECKING:
    from lodger.engine.loop import Engine
    from lodger.engine.state import SessionState
    from lodger.storage import SessionWriter

__all__ = ["Decision", "check_invariants", "decide", "resume_run"]

Decision = Literal["completed", "not_applied", "abandon"]

NOT_DISPATCHED = (
    "the run stopped before this call was dispatched; it never ran. "
    "Call it again if it is still needed."
)


def check_invariants(engine: Engine, state: SessionState) -> list[str]:
    """Environment invariants a resume needs; one line per violation."""
    problems: list[str] = []
    if state.workspace_id is not None:
        current = workspace_id(engine.workspace) if engine.workspace is not None else None
        if current != state.workspace_id:
            problems.append(
                f"workspace: the session ran in {state.workspace!r} and this run has "
                f"{str(engine.workspace) if engine.workspace else 'no workspace'!r} "
                "(not the same directory)"
            )
    missing = [name for name in state.used_tools() if name not in engine.registry]
    if missing:
        problems.append(
            "tools: the history used tools that are not bound now: " + ", ".join(missing)
        )
    return problems


async def resume_run(engine: Engine, journal: Journal) -> RunContext:
    """Claim the open turn's prefix for a new run and apply its recovery plan.

    Returns the new run's context, ready to drive; raises ``ResumeBlockedError`` naming
    every parked operation or failed invariant.
    """
    state = journal.state
    session_id = journal.session_id
    if not state.events:
        raise SessionNotFoundError(
            f"no log for session {session_id!r}",
            session_id=session_id,
            next_steps=(NextStep(action="list_sessions"),),
        )
    plan = state.plan()
    if plan.turn_id is None:
        raise UsageError(
            f"session {session_id!r} has no interrupted turn to resume",
            hint="start a new turn on the session instead",
            code="nothing_to_resume",
            session_id=session_id,
            next_steps=(NextStep(action="run", session_id=session_id),),
        )
    problems = check_invariants(engine, state)
    if problems:
        raise ResumeBlockedError(
            f"session {session_id!r} cannot resume: " + "; ".join(problems),
            blockers=problems,
            hint="resume with the same workspace and tools the session used, or fork it",
            session_id=session_id,
        )
    actionable = [c for c in plan.calls if c.action not in ("none", "wait_operator")]
    if plan.blocked and not actionable:
        raise _blocked(session_id, plan.blocked)

    turn_id = plan.turn_id
    run_id = engine.ids.new_id()
    claim = journal.draft(
        RunStarted(
            model=engine.model.spec,
            parent_run_id=plan.last_run_id,
            resumed_from=plan.prefix,
            tools=tuple(engine.registry.names()),
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
    ctx = engine.run_context(journal, turn_id=turn_id, run_id=run_id)
    pipeline = engine.pipeline(ctx)
    parked: list[PlannedCall] = []
    for planned in plan.calls:
        call_state = state.calls[planned.call_id]
        if not await _apply(engine, ctx, pipeline, planned, call_state):
            parked.append(planned)
    if parked:
        await journal.fact(
            RunEnded(status="parked", error=f"{len(parked)} operation(s) wait for a decision"),
            ctx.envelope,
        )
        raise _blocked(session_id, tuple(parked))
    return ctx


async def _apply(
    engine: Engine,
    ctx: RunContext,
    pipeline: CallPipeline,
    planned: PlannedCall,
    state: CallState,
) -> bool:
    """Carry out one call's action; False when it is (still) parked."""
    nested = state.parent_call_id is not None
    env = ctx.envelope.for_call(
        state.call_id,
        parent_call_id=state.parent_call_id,
        origin="runtime",
        visibility="hidden" if nested else "model",
    )
    journal = ctx.journal
    record = state.latest
    if planned.action == "none":
        return True
    if planned.action == "wait_operator":
        return False
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
        return True
    assert record is not None
    bound = engine.registry.get(record.dispatched.tool)
    # The policy is the bound tool's, never the one the log records (DESIGN L10).
    policy = bound.recovery if bound is not None else "never_retry"
    why = f"{policy}: the outcome cannot be proven from here"
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
            return True
        except ToolCallError as exc:  # refused now: binding, schema or permission
            why = f"not run again: {exc.message}"
    elif policy == "queryable":
        seen = await _probe(engine, ctx, state)
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
            return True
    # never_retry, a refused re-run, or a probe that could not tell: park for an operator
    await journal.fact(
        RecoveryDecided(operation_id=record.operation_id, action="park", reason=why), env
    )
    return False


async def _probe(engine: Engine, ctx: RunContext, state: CallState) -> ProbeResult:
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
    )
    try:
        return await t.probe(record.dispatched, tctx)
    except Exception as exc:  # noqa: BLE001 - a failing probe proves nothing: park
        return ProbeResult(applied=None, observation=f"the probe failed: {exc}")


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
        next_steps=tuple(
            NextStep(action="decide", session_id=session_id, call_id=c.call_id) for c in calls
        ),
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
) -> list[Event]:
    """Record an operator decision on an indeterminate or parked call of the open turn."""
    session_id = writer.session_id
    if not state.events:
        raise SessionNotFoundError(f"no log for session {session_id!r}", session_id=session_id)
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
    if planned.status not in ("indeterminate", "parked") or planned.operation_id is None:
        raise UsageError(
            f"call {call_id!r} is {planned.status}; only indeterminate or parked calls "
            "need a decision",
            code="nothing_to_decide",
            session_id=session_id,
            call_id=call_id,
        )
    env = Envelope(
        turn_id=plan.turn_id,
        call_id=call_id,
        parent_call_id=planned.parent_call_id,
        origin="operator",
        visibility="hidden" if planned.parent_call_id else "model",
    )

    def draft(body: OperatorDecision | RunEnded | TurnEnded, where: Envelope) -> EventDraft:
        return EventDraft(
            id=ids.new_id(),
            ts=clock.now_us(),
            body=body,
            turn_id=where.turn_id,
            run_id=where.run_id,
            call_id=where.call_id,
            parent_call_id=where.parent_call_id,
            origin=where.origin,
            visibility=where.visibility,
        )

    drafts = [
        draft(
            OperatorDecision(
                operation_id=planned.operation_id, decision=decision, result=result, by=by
            ),
            env,
        )
    ]
    if decision == "abandon":
        if plan.run_open:
            drafts.append(
                draft(
                    RunEnded(status="abandoned", error="abandoned by the operator"),
                    Envelope(turn_id=plan.turn_id, run_id=plan.last_run_id),
                )
            )
        drafts.append(
            draft(TurnEnded(status="abandoned"), Envelope(turn_id=plan.turn_id, origin="operator"))
        )
    events = await writer.append(drafts, expected_offset=plan.prefix.high_water)
    state.feed(events)
    return events

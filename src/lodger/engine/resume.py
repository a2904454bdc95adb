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

from lodger.engine.journal import Journal
from lodger.engine.pipeline import ToolRuntime
from lodger.errors import (
    AppendConflictError,
    ResumeBlockedError,
    SessionNotFoundError,
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
    SessionStarted,
    ToolDispatched,
    TurnEnded,
)
from lodger.ids import Clock, IdFactory
from lodger.recovery.classify import CallState, classify_calls
from lodger.recovery.plan import PlannedCall, RecoveryPlan, plan_recovery
from lodger.storage import EventLog, SessionWriter
from lodger.tools.spec import ProbeResult, ToolContext
from lodger.tools.workspace import workspace_id

if TYPE_CHECKING:
    from lodger.agent import Agent, TurnResult

__all__ = ["Decision", "decide", "resume_locked"]

Decision = Literal["completed", "not_applied", "abandon"]

NOT_DISPATCHED = (
    "the run stopped before this call was dispatched; it never ran. "
    "Call it again if it is still needed."
)


def _decide_hint(session_id: str, call_id: str) -> str:
    return (
        f"lodger decide {session_id} {call_id} --completed [--result JSON] | "
        "--not-applied | --abandon"
    )


def check_invariants(agent: Agent, events: Sequence[Event], plan: RecoveryPlan) -> list[str]:
    """Environment invariants a resume needs; one line per violation."""
    problems: list[str] = []
    started = events[0].body if events else None
    if isinstance(started, SessionStarted) and started.workspace_id is not None:
        current = workspace_id(agent.workspace) if agent.workspace is not None else None
        if current != started.workspace_id:
            problems.append(
                f"workspace: the session ran in {started.workspace!r} and this run has "
                f"{str(agent.workspace) if agent.workspace else 'no workspace'!r} "
                "(not the same directory)"
            )
    used = sorted({e.body.tool for e in events if isinstance(e.body, ToolDispatched)})
    missing = [name for name in used if name not in agent.registry]
    if missing:
        problems.append(
            "tools: the history used tools that are not bound now: " + ", ".join(missing)
        )
    return problems


async def resume_locked(agent: Agent, writer: SessionWriter) -> TurnResult:
    """Resume the open turn of the session ``writer`` holds (the writer lock is ours)."""
    session_id = writer.session_id
    events = writer.initial_events
    if not events:
        raise SessionNotFoundError(
            f"no log for session {session_id!r}",
            hint="run `lodger sessions` to list sessions",
            session_id=session_id,
        )
    plan = plan_recovery(events)
    if plan.turn_id is None:
        raise UsageError(
            f"session {session_id!r} has no interrupted turn to resume",
            hint=f'start a new turn with `lodger run "TASK" --session {session_id}`',
            code="nothing_to_resume",
            session_id=session_id,
        )
    problems = check_invariants(agent, events, plan)
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
    run_id = agent.ids.new_id()
    claim = EventDraft(
        id=agent.ids.new_id(),
        ts=agent.clock.now_us(),
        turn_id=turn_id,
        run_id=run_id,
        body=RunStarted(
            model=agent.model.spec,
            parent_run_id=plan.last_run_id,
            resumed_from=plan.prefix,
            tools=tuple(agent.registry.names()),
        ),
    )
    try:
        # The claim: one append at the prefix's high-water mark; a second resume of the
        # same prefix can never also land there.
        claimed = await writer.append([claim], expected_offset=plan.prefix.high_water)
    except AppendConflictError as exc:
        raise ResumeBlockedError(
            f"another run already continues session {session_id!r} from offset "
            f"{plan.prefix.high_water}",
            blockers=["another run claimed this prefix"],
            hint="re-run `lodger recover` to see the new state",
            session_id=session_id,
        ) from exc
    journal = Journal(
        writer, [*events, *claimed], clock=agent.clock, ids=agent.ids, on_event=agent.on_event
    )
    if agent.on_event is not None:
        agent.on_event(claimed[0])
    runtime = agent.tool_runtime(journal, turn_id=turn_id, run_id=run_id)
    states = classify_calls(events)
    parked: list[PlannedCall] = []
    for planned in plan.calls:
        state = states[planned.call_id]
        if not await _apply(agent, journal, runtime, planned, state, turn_id, run_id):
            parked.append(planned)
    if parked:
        await journal.fact(
            RunEnded(status="parked", error=f"{len(parked)} operation(s) wait for a decision"),
            turn_id=turn_id,
            run_id=run_id,
        )
        raise _blocked(session_id, tuple(parked))
    return await agent.drive(journal, turn_id=turn_id, run_id=run_id)


async def _apply(
    agent: Agent,
    journal: Journal,
    runtime: ToolRuntime,
    planned: PlannedCall,
    state: CallState,
    turn_id: str,
    run_id: str,
) -> bool:
    """Carry out one call's action; False when it is (still) parked."""
    nested = state.parent_call_id is not None
    env = {
        "turn_id": turn_id,
        "run_id": run_id,
        "call_id": state.call_id,
        "parent_call_id": state.parent_call_id,
        "visibility": "hidden" if nested else "model",
        "origin": "runtime",
    }
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
            **env,
        )
        return True
    assert record is not None
    if planned.action == "redispatch":
        await runtime.redispatch(
            previous=record.dispatched,
            call_id=state.call_id,
            parent_call_id=state.parent_call_id,
            origin=state.origin,
            visibility="hidden" if nested else "model",
            attempt=record.dispatched.attempt + 1,
        )
        return True
    if planned.action == "probe":
        seen = await _probe(agent, journal, state, turn_id, run_id)
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
        await journal.fact(observed, **env)
        if seen.applied is not None:
            return True
    # never_retry, or a probe that could not tell: park, for an operator to decide
    await journal.fact(
        RecoveryDecided(
            operation_id=record.operation_id,
            action="park",
            reason=f"{record.dispatched.recovery}: the outcome cannot be proven from here",
        ),
        **env,
    )
    return False


async def _probe(
    agent: Agent, journal: Journal, state: CallState, turn_id: str, run_id: str
) -> ProbeResult:
    record = state.latest
    assert record is not None
    t = agent.registry.get(record.dispatched.tool)
    if t is None or t.probe is None:
        return ProbeResult(applied=None, observation="the tool has no probe in this run")
    ctx = ToolContext(
        session_id=journal.session_id,
        turn_id=turn_id,
        run_id=run_id,
        call_id=state.call_id,
        operation_id=record.operation_id,
        workspace=agent.workspace,
        parent_call_id=state.parent_call_id,
        hidden=(agent.state_dir.resolve(),),
    )
    try:
        return await t.probe(record.dispatched, ctx)
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
        hint="decide each with `" + _decide_hint(session_id, calls[0].call_id) + "`",
        session_id=session_id,
    )


async def decide(
    log: EventLog,
    session_id: str,
    call_id: str,
    decision: Decision,
    *,
    result: str | None = None,
    clock: Clock,
    ids: IdFactory,
    by: str = "operator",
) -> list[Event]:
    """Record an operator decision on an indeterminate or parked call of the open turn."""
    writer = await log.open_writer(session_id)
    try:
        events = writer.initial_events
        if not events:
            raise SessionNotFoundError(f"no log for session {session_id!r}", session_id=session_id)
        plan = plan_recovery(events)
        planned = next((c for c in plan.calls if c.call_id == call_id), None)
        if planned is None:
            raise UsageError(
                f"call {call_id!r} is not part of an interrupted turn of session {session_id!r}",
                hint=f"run `lodger recover {session_id}` to list the calls that need a decision",
                code="no_such_call",
                session_id=session_id,
                call_id=call_id,
            )
        if planned.status not in ("indeterminate", "parked") or planned.operation_id is None:
            raise UsageError(
                f"call {call_id!r} is {planned.status}; only indeterminate or parked calls "
                "need a decision",
                code="nothing_to_decide",
                session_id=session_id,
                call_id=call_id,
            )
        env = {
            "turn_id": plan.turn_id,
            "call_id": call_id,
            "parent_call_id": planned.parent_call_id,
            "origin": "operator",
            "visibility": "hidden" if planned.parent_call_id else "model",
        }
        drafts = [
            EventDraft(
                id=ids.new_id(),
                ts=clock.now_us(),
                body=OperatorDecision(
                    operation_id=planned.operation_id, decision=decision, result=result, by=by
                ),
                **env,
            )
        ]
        if decision == "abandon":
            if plan.run_open:
                drafts.append(
                    EventDraft(
                        id=ids.new_id(),
                        ts=clock.now_us(),
                        turn_id=plan.turn_id,
                        run_id=plan.last_run_id,
                        body=RunEnded(status="abandoned", error="abandoned by the operator"),
                    )
                )
            drafts.append(
                EventDraft(
                    id=ids.new_id(),
                    ts=clock.now_us(),
                    turn_id=plan.turn_id,
                    origin="operator",
                    body=TurnEnded(status="abandoned"),
                )
            )
        return await writer.append(drafts, expected_offset=plan.prefix.high_water)
    finally:
        await writer.close()

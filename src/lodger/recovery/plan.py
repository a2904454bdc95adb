"""The recovery plan: for an interrupted turn, what resume will do with every call.

A pure function of the committed prefix (``plan_recovery``); computed twice on the same
prefix it gives the same plan. Actions per call of the open turn:

    none            settled: completed, rejected, not applied, or already told
    tell_model      never dispatched: record that it never ran, so the model knows
    ask_permission  never dispatched, its approval parked: run the call's path again
                    from its checks; the approver finds the answer (or parks it again)
    redispatch      idempotent and indeterminate: run again under a new, linked T1
    probe           queryable and indeterminate: observe the world, record what was seen
    poll            running (the remote side accepted it): query its handle through the
                    tool's poll; a result is its T2, still running leaves it running,
                    and only a poll that cannot tell parks it
    park            never_retry and indeterminate: wait for an operator decision
    wait_operator   parked earlier: resume is blocked until an operator decides
    report          a code cell (policy ``report``) that was interrupted: never re-run;
                    once its nested calls are settled, record what they did and tell
                    the model (``cell_interrupted``)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from lodger._core.bulk import cycle_collector_paused
from lodger.events import EMPTY_PREFIX, Event, Prefix, RunEnded, RunStarted, TurnEnded, TurnStarted
from lodger.recovery.classify import CallState, CallStatus, classify_calls

__all__ = [
    "Action",
    "PlannedCall",
    "RecoveryPlan",
    "open_turn_of",
    "plan_calls",
    "plan_recovery",
]

Action = Literal[
    "none",
    "tell_model",
    "ask_permission",
    "redispatch",
    "probe",
    "poll",
    "park",
    "wait_operator",
    "report",
]


@dataclass(frozen=True, kw_only=True)
class PlannedCall:
    call_id: str
    tool: str
    status: CallStatus
    reason: str
    action: Action
    recovery: str
    offset: int
    operation_id: str | None = None
    parent_call_id: str | None = None
    attempts: int = 0


@dataclass(frozen=True, kw_only=True)
class RecoveryPlan:
    session_id: str
    prefix: Prefix
    turn_id: str | None
    last_run_id: str | None
    run_open: bool
    calls: tuple[PlannedCall, ...]

    @property
    def blocked(self) -> tuple[PlannedCall, ...]:
        return tuple(c for c in self.calls if c.action == "wait_operator")

    @property
    def interrupted(self) -> bool:
        return self.turn_id is not None

    def to_dict(self) -> dict[str, object]:
        return {
            "session_id": self.session_id,
            "high_water": self.prefix.high_water,
            "digest": self.prefix.digest,
            "open_turn": self.turn_id,
            "last_run": self.last_run_id,
            "blocked": bool(self.blocked),
            "calls": [asdict(c) for c in self.calls],
        }


def _action(state: CallState, status: CallStatus) -> Action:
    if status == "not_dispatched":
        if state.awaiting_approval:
            return "ask_permission"
        return "none" if state.noted_not_dispatched else "tell_model"
    if status == "indeterminate":
        policy = state.recovery
        if policy == "idempotent":
            return "redispatch"
        if policy == "queryable":
            return "probe"
        if policy == "report":
            return "report"
        return "park"
    if status == "running":
        return "poll"
    if status == "parked":
        return "wait_operator"
    return "none"


def open_turn_of(events: Sequence[Event]) -> tuple[str | None, str | None, bool]:
    """The open turn's id, its last run's id and whether that run is still open."""
    turn_id: str | None = None
    last_run: str | None = None
    run_open = False
    for e in events:
        body = e.body
        if isinstance(body, TurnStarted):
            turn_id, last_run, run_open = e.turn_id, None, False
        elif isinstance(body, RunStarted):
            last_run, run_open = e.run_id, True
        elif isinstance(body, RunEnded):
            run_open = False
        elif isinstance(body, TurnEnded):
            turn_id, last_run, run_open = None, None, False
    return turn_id, last_run, run_open


def plan_recovery(events: Sequence[Event]) -> RecoveryPlan:
    """Classify every call of the session's open turn and choose what resume does."""
    session_id = events[0].session_id if events else ""
    prefix = Prefix(high_water=len(events), digest=events[-1].digest) if events else EMPTY_PREFIX
    with cycle_collector_paused(len(events)):
        calls = classify_calls(events)  # the whole prefix: corruption anywhere fails closed
    turn_id, last_run, run_open = open_turn_of(events)
    return plan_calls(
        session_id=session_id,
        prefix=prefix,
        turn_id=turn_id,
        last_run_id=last_run,
        run_open=run_open,
        calls=calls,
    )


def plan_calls(
    *,
    session_id: str,
    prefix: Prefix,
    turn_id: str | None,
    last_run_id: str | None,
    run_open: bool,
    calls: Mapping[str, CallState],
) -> RecoveryPlan:
    """The plan from an already classified prefix (``SessionState`` keeps one folded)."""
    planned: list[PlannedCall] = []
    if turn_id is not None:
        for state in calls.values():
            if state.turn_id != turn_id:
                continue
            status, reason = state.status()
            latest = state.latest
            planned.append(
                PlannedCall(
                    call_id=state.call_id,
                    tool=state.tool,
                    status=status,
                    reason=reason,
                    action=_action(state, status),
                    recovery=state.recovery,
                    offset=state.offset,
                    operation_id=latest.operation_id if latest else None,
                    parent_call_id=state.parent_call_id,
                    attempts=len(state.operations),
                )
            )
    return RecoveryPlan(
        session_id=session_id,
        prefix=prefix,
        turn_id=turn_id,
        last_run_id=last_run_id,
        run_open=run_open,
        calls=tuple(planned),
    )

"""Classification: a pure function from a committed prefix to the state of every call.

One pass over the events builds, per call, the chain of operations (T1 attempts) and
what became of each: a response (T2), an observation by recovery, a decision by recovery
or by the operator. From that each call gets one status and a stable reason code:

    not_dispatched   proposed, never dispatched (no T1): it never ran (reason
                     ``awaiting_approval`` when its approval was parked: a resume asks
                     for the answer again)
    rejected         refused before dispatch (validation, permission ...)
    completed        T1 and T2, or recovery/operator proved the outcome
    not_applied      recovery or the operator proved the effect did not happen
    running          T1 and ``call_accepted`` without T2: the remote side runs it; its
                     handle settles it (the tool's poll), never a person unless the
                     poll cannot tell
    indeterminate    T1 without T2 and nothing decided yet: the recovery policy applies
    parked           indeterminate and waiting for an operator decision
    interrupted      a code cell recovery settled as interrupted (never re-run; the model
                     was told what its nested calls did)
    abandoned        the operator abandoned the turn

Inconsistent ids or order (a response without a dispatch, a second response, a dispatch
of a call nobody proposed, a retry link to nowhere ...) fail closed with
``CorruptLogError`` naming the offset. Nothing here reads the clock or the world: the
same prefix always gives the same plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from lodger.errors import CorruptLogError
from lodger.events import (
    ArtifactStored,
    CallAccepted,
    CallRejected,
    CallReplayed,
    CancelRequested,
    Compacted,
    CompactionFailed,
    ContextCompacted,
    ElicitationAnswered,
    ElicitationRequested,
    EvalScored,
    Event,
    FileCheckpoint,
    MessageQueued,
    ModelOutput,
    OperatorDecision,
    Origin,
    OutputRejected,
    PermissionDecided,
    PermissionModeChanged,
    PermissionRequested,
    Prefix,
    ProcessEnded,
    ProcessStarted,
    ProviderRetried,
    QueueChanged,
    RecoveryDecided,
    RecoveryObserved,
    ReplayStarted,
    Rewound,
    RunEnded,
    RunStarted,
    SamplingAnswered,
    SamplingRequested,
    SessionStarted,
    SteerDelivered,
    SteerReceived,
    StepStarted,
    ToolDispatched,
    ToolResponded,
    ToolsActivated,
    ToolsChanged,
    TurnEnded,
    TurnStarted,
    WorkspaceSnapshot,
)

__all__ = [
    "CallClassifier",
    "CallState",
    "CallStatus",
    "OperationRecord",
    "classify_calls",
]

#: body classes that say nothing about a call's state (exact classes: a subclass goes
#: through the checks of ``CallClassifier.feed`` as before)
_NO_CALL_STATE: frozenset[type] = frozenset(
    {
        SessionStarted,
        TurnStarted,
        StepStarted,
        ProviderRetried,
        PermissionRequested,
        ToolsActivated,
        ArtifactStored,
        WorkspaceSnapshot,
        ContextCompacted,
        Compacted,
        CompactionFailed,
        SteerReceived,
        SteerDelivered,
        MessageQueued,
        QueueChanged,
        CancelRequested,
        PermissionModeChanged,
        Rewound,
        FileCheckpoint,
        ProcessStarted,
        ProcessEnded,
        ElicitationRequested,
        ElicitationAnswered,
        SamplingRequested,
        SamplingAnswered,
        ToolsChanged,
        ReplayStarted,
        CallReplayed,
        EvalScored,
        OutputRejected,
        RunEnded,
        TurnEnded,
    }
)

CallStatus = Literal[
    "not_dispatched",
    "rejected",
    "completed",
    "not_applied",
    "indeterminate",
    "running",
    "parked",
    "abandoned",
    "interrupted",
]


@dataclass(eq=False)
class OperationRecord:
    """One dispatch attempt (T1) of a call and what is known about its outcome.

    ``dispatched`` is the body of the T1 event at ``offset``; a fold restored from a
    checkpoint (``lodger.engine.checkpoint``) decodes it from the log when it is read.
    """

    operation_id: str
    offset: int
    dispatched: ToolDispatched
    run_id: str | None
    responded_at: int | None = None
    observed: RecoveryObserved | None = None
    parked: bool = False
    decision: OperatorDecision | None = None
    #: the remote side accepted it (``call_accepted``): running with this handle
    accepted: CallAccepted | None = None

    def _key(self) -> tuple[object, ...]:
        return (
            self.operation_id,
            self.offset,
            self.dispatched,
            self.run_id,
            self.responded_at,
            self.observed,
            self.parked,
            self.decision,
            self.accepted,
        )

    def __eq__(self, other: object) -> bool:
        # by value, whichever way the record was made (folded or restored)
        if not isinstance(other, OperationRecord):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable, as a dataclass with eq


@dataclass
class CallState:
    call_id: str
    tool: str
    turn_id: str | None
    offset: int  # where the call was proposed (or first dispatched, for nested calls)
    parent_call_id: str | None = None
    origin: Origin = "provider"
    rejected: bool = False
    noted_not_dispatched: bool = False
    #: its approval was parked (``permission_decided`` ``park``): it waits, undispatched,
    #: for an answer given outside the run
    awaiting_approval: bool = False
    operations: list[OperationRecord] = field(default_factory=list)

    @property
    def latest(self) -> OperationRecord | None:
        return self.operations[-1] if self.operations else None

    @property
    def recovery(self) -> str:
        return self.latest.dispatched.recovery if self.latest else "never_retry"

    def status(self) -> tuple[CallStatus, str]:
        """The call's status and a stable reason code."""
        if self.rejected:
            return "rejected", "rejected_before_dispatch"
        op = self.latest
        if op is None:
            return "not_dispatched", "awaiting_approval" if self.awaiting_approval else "no_t1"
        if op.decision is not None:
            kind = op.decision.decision
            if kind == "completed":
                return "completed", "operator_completed"
            if kind == "not_applied":
                return "not_applied", "operator_not_applied"
            return "abandoned", "operator_abandoned"
        if op.responded_at is not None:
            return "completed", "t1_and_t2"
        if op.observed is not None and op.observed.status == "completed":
            return "completed", op.observed.reason
        if op.observed is not None and op.observed.status == "not_applied":
            return "not_applied", op.observed.reason
        if op.observed is not None and op.observed.status == "interrupted":
            return "interrupted", op.observed.reason
        if op.parked:
            return "parked", f"parked_{op.dispatched.recovery}"
        if op.accepted is not None:
            return "running", "accepted_with_handle"
        return "indeterminate", "t1_without_t2"


def _corrupt(session_id: str, offset: int, code: str, why: str) -> CorruptLogError:
    return CorruptLogError(
        f"log for session {session_id!r} is inconsistent at offset {offset}: {why}",
        hint="recovery refuses to act on an inconsistent log; fork the session from an "
        f"offset before {offset} or restore it from a backup",
        code=code,
        session_id=session_id,
        offset=offset,
    )


class CallClassifier:
    """The call states of a log, folded one event at a time (``classify_calls`` folds a
    whole prefix). ``digest_at(offset)`` gives the digest of an earlier event, to check
    the prefix a resumed run names."""

    def __init__(self, session_id: str, digest_at: Callable[[int], str]) -> None:
        self.session_id = session_id
        self.calls: dict[str, CallState] = {}
        self._operations: dict[str, tuple[CallState, OperationRecord]] = {}
        #: every tool name a T1 dispatched, so far
        self.dispatched_tools: set[str] = set()
        #: calls the remote side accepted, by operation id, until something settles them
        self.accepted_open: dict[str, CallState] = {}
        self._digest_at = digest_at

    def restore(self, calls: dict[str, CallState], dispatched_tools: set[str]) -> None:
        """Continue from call states folded earlier (a checkpoint's), as if fed."""
        self.calls = calls
        self._operations = {
            op.operation_id: (state, op) for state in calls.values() for op in state.operations
        }
        self.dispatched_tools = dispatched_tools
        self.accepted_open = {
            op.operation_id: state
            for state in calls.values()
            for op in state.operations
            if op.accepted is not None and state.status()[0] == "running"
        }

    def feed(self, e: Event) -> None:
        body = e.body
        if type(body) in _NO_CALL_STATE:
            return
        if isinstance(body, ModelOutput):
            self._proposed(e, body)
        elif isinstance(body, CallRejected):
            self._rejected(e, body)
        elif isinstance(body, ToolDispatched):
            self._dispatched(e, body)
        elif isinstance(
            body, ToolResponded | RecoveryObserved | RecoveryDecided | OperatorDecision
        ):
            self._settled(e, body)
        elif isinstance(body, CallAccepted):
            self._accepted(e, body)
        elif isinstance(body, PermissionDecided):
            if body.decision == "park":
                self._approval_parked(e)
        elif isinstance(body, RunStarted) and body.resumed_from is not None:
            _check_resume_prefix(self._digest_at, e, body.resumed_from, self.session_id)

    def _proposed(self, e: Event, body: ModelOutput) -> None:
        calls = self.calls
        for call in body.calls:
            if call.call_id in calls:
                raise _corrupt(
                    self.session_id,
                    e.offset,
                    "duplicate_call_id",
                    f"call id {call.call_id!r} was proposed twice",
                )
            calls[call.call_id] = CallState(
                call_id=call.call_id, tool=call.name, turn_id=e.turn_id, offset=e.offset
            )

    def _rejected(self, e: Event, body: CallRejected) -> None:
        state = _call_for(self.calls, e, self.session_id, body.tool)
        if state.operations:
            raise _corrupt(
                self.session_id,
                e.offset,
                "rejected_after_dispatch",
                "a dispatched call was rejected",
            )
        state.rejected = True

    def _dispatched(self, e: Event, body: ToolDispatched) -> None:
        """A T1: the call's next operation, linked to the one before by ``retry_of``."""
        operations = self._operations
        state = _call_for(self.calls, e, self.session_id, body.tool)
        if state.rejected:
            raise _corrupt(
                self.session_id,
                e.offset,
                "dispatch_after_rejection",
                f"call {state.call_id!r} was dispatched after it was rejected",
            )
        if body.operation_id in operations:
            raise _corrupt(
                self.session_id,
                e.offset,
                "duplicate_operation",
                f"operation {body.operation_id!r} was dispatched twice",
            )
        previous = state.latest
        if body.retry_of is None and previous is not None:
            raise _corrupt(
                self.session_id,
                e.offset,
                "unlinked_redispatch",
                f"call {state.call_id!r} was dispatched again without a retry_of link",
            )
        if body.retry_of is not None and (
            previous is None
            or previous.operation_id != body.retry_of
            or previous.responded_at is not None
        ):
            raise _corrupt(
                self.session_id,
                e.offset,
                "bad_retry_link",
                f"operation {body.operation_id!r} retries {body.retry_of!r}, which is not "
                "the call's latest unanswered operation",
            )
        record = OperationRecord(
            operation_id=body.operation_id, offset=e.offset, dispatched=body, run_id=e.run_id
        )
        state.operations.append(record)
        operations[body.operation_id] = (state, record)
        self.dispatched_tools.add(body.tool)

    def _settled(
        self,
        e: Event,
        body: ToolResponded | RecoveryObserved | RecoveryDecided | OperatorDecision,
    ) -> None:
        """What became of an operation: a T2, or recovery's or the operator's word on it."""
        found = self._operations.get(body.operation_id)
        if found is None:
            if isinstance(body, RecoveryObserved) and body.reason == "not_dispatched":
                self._noted_not_dispatched(e)
                return
            raise _corrupt(
                self.session_id,
                e.offset,
                "unknown_operation",
                f"{body.kind} names operation {body.operation_id!r}, which was never dispatched",
            )
        state, record = found
        self.accepted_open.pop(body.operation_id, None)
        if e.call_id is not None and e.call_id != state.call_id:
            raise _corrupt(
                self.session_id,
                e.offset,
                "call_mismatch",
                f"{body.kind} for operation {body.operation_id!r} names call "
                f"{e.call_id!r}, but it belongs to {state.call_id!r}",
            )
        if isinstance(body, ToolResponded):
            if record.responded_at is not None:
                raise _corrupt(
                    self.session_id,
                    e.offset,
                    "duplicate_response",
                    f"operation {body.operation_id!r} has a second response",
                )
            record.responded_at = e.offset
        elif isinstance(body, RecoveryObserved):
            record.observed = body
        elif isinstance(body, RecoveryDecided):
            record.parked = body.action == "park"
        else:
            record.decision = body

    def _accepted(self, e: Event, body: CallAccepted) -> None:
        """The remote side accepted an operation: after its T1, before its T2, once."""
        found = self._operations.get(body.operation_id)
        if found is None or (e.call_id is not None and e.call_id != found[0].call_id):
            raise _corrupt(
                self.session_id,
                e.offset,
                "unknown_operation",
                f"call_accepted names operation {body.operation_id!r}, which call "
                f"{e.call_id!r} never dispatched",
            )
        record = found[1]
        if record.accepted is not None or record.responded_at is not None:
            raise _corrupt(
                self.session_id,
                e.offset,
                "late_acceptance",
                f"operation {body.operation_id!r} was accepted twice or after its response",
            )
        record.accepted = body
        self.accepted_open[body.operation_id] = found[0]

    def _noted_not_dispatched(self, e: Event) -> None:
        # the model was told this call never ran; it has no operation
        noted = self.calls.get(e.call_id or "")
        if noted is None or noted.operations:
            raise _corrupt(
                self.session_id,
                e.offset,
                "bad_not_dispatched",
                f"call {e.call_id!r} is recorded as never dispatched, but it "
                "does not exist or was dispatched",
            )
        noted.noted_not_dispatched = True

    def _approval_parked(self, e: Event) -> None:
        # a nested call is not known before its T1 or rejection (and never parks)
        parked = self.calls.get(e.call_id or "")
        if parked is None or parked.operations or parked.rejected:
            raise _corrupt(
                self.session_id,
                e.offset,
                "bad_permission_park",
                f"call {e.call_id!r} waits for an approval, but it does not exist "
                "or was dispatched or rejected already",
            )
        parked.awaiting_approval = True


def classify_calls(events: Sequence[Event]) -> dict[str, CallState]:
    """Every call in the prefix, keyed by call id, in the order they first appear."""
    session_id = events[0].session_id if events else ""
    classifier = CallClassifier(session_id, lambda offset: events[offset].digest)
    for e in events:
        classifier.feed(e)
    return classifier.calls


def _call_for(calls: dict[str, CallState], e: Event, session_id: str, tool: str) -> CallState:
    if e.call_id is None:
        raise _corrupt(session_id, e.offset, "missing_call_id", f"a {e.kind} event has no call id")
    state = calls.get(e.call_id)
    if state is not None:
        return state
    if e.parent_call_id is None:
        raise _corrupt(
            session_id,
            e.offset,
            "dispatch_without_call",
            f"call {e.call_id!r} was never proposed by the model",
        )
    if e.parent_call_id not in calls:
        raise _corrupt(
            session_id,
            e.offset,
            "orphan_nested_call",
            f"nested call {e.call_id!r} names parent {e.parent_call_id!r}, which does not exist",
        )
    state = CallState(
        call_id=e.call_id,
        tool=tool,
        turn_id=e.turn_id,
        offset=e.offset,
        parent_call_id=e.parent_call_id,
        origin=e.origin,
    )
    calls[e.call_id] = state
    return state


def _check_resume_prefix(
    digest_at: Callable[[int], str], e: Event, prefix: Prefix, session_id: str
) -> None:
    if prefix.high_water > e.offset or prefix.high_water < 1:
        raise _corrupt(
            session_id,
            e.offset,
            "bad_resume_prefix",
            f"a run resumes from offset {prefix.high_water}, which is not before it",
        )
    if digest_at(prefix.high_water - 1) != prefix.digest:
        raise _corrupt(
            session_id,
            e.offset,
            "bad_resume_prefix",
            f"a run resumes from a prefix whose digest does not match offset "
            f"{prefix.high_water - 1}",
        )

"""Crash recovery: classify every call from the log, act on per-tool policies, resume."""

from lodger.recovery.classify import CallState, CallStatus, classify_calls
from lodger.recovery.plan import PlannedCall, RecoveryPlan, plan_recovery

__all__ = [
    "CallState",
    "CallStatus",
    "PlannedCall",
    "RecoveryPlan",
    "classify_calls",
    "plan_recovery",
]

"""Engine errors as HTTP answers: a status and a machine-readable body.

Every refusal is ``{"error": {"code", "message", "hint", "session_id", "call_id",
"offset", "next_steps": [{"action", "method", "path"}]}}`` where ``code`` is one of
``lodger.errors.ERROR_CODES`` and each next step is a request of this API (the host's
rendering of ``NextStep``, as the CLI renders them as command lines).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from lodger.errors import (
    AppendConflictError,
    CorruptLogError,
    HostAuthError,
    HostConflictError,
    LodgerError,
    NextStep,
    ProviderError,
    ResumeBlockedError,
    SessionLockedError,
    SessionNotFoundError,
    StorageError,
)

__all__ = ["ErrorBody", "ErrorDetail", "HostStep", "error_body", "status_for"]

#: a well-formed request naming something this host does not have (a model it does not
#: offer is one: the host's configuration decides which exist)
_NOT_FOUND_CODES = {
    "no_such_call",
    "not_found",
    "not_queued",
    "unknown_hook",
    "artifact_missing",
    "model_not_allowed",
}
#: a request the session's current state refuses (a fork past the log's head may succeed
#: once the log has grown)
_CONFLICT_CODES = {
    "nothing_to_resume",
    "nothing_to_decide",
    "nothing_to_abandon",
    "fork_beyond_head",
    "session_running",
    "compaction_refused",
    "rewind_target",
    "workspace_missing",
}


class HostStep(BaseModel):
    """What a client can do about an error, as a request of this API."""

    model_config = ConfigDict(extra="forbid")
    action: str
    method: str | None = None
    path: str | None = None
    session_id: str | None = None
    call_id: str | None = None


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")
    code: str
    message: str
    hint: str | None = None
    session_id: str | None = None
    call_id: str | None = None
    offset: int | None = None
    next_steps: list[HostStep] = []


class ErrorBody(BaseModel):
    error: ErrorDetail


def status_for(exc: LodgerError) -> int:
    if isinstance(exc, HostAuthError):
        return 403 if exc.code == "forbidden" else 401
    if isinstance(exc, SessionNotFoundError) or exc.code in _NOT_FOUND_CODES:
        return 404
    if exc.code == "payload_too_large":
        return 413
    if (
        isinstance(
            exc, (HostConflictError, ResumeBlockedError, SessionLockedError, AppendConflictError)
        )
        or exc.code in _CONFLICT_CODES
    ):
        return 409
    if isinstance(exc, CorruptLogError):
        return 500  # the server's stored facts are damaged: not the client's doing
    if isinstance(exc, ProviderError):
        return 502
    if isinstance(exc, StorageError):
        return 503
    return 400


def _request_for(step: NextStep) -> tuple[str | None, str | None]:
    sid = step.session_id
    base = f"/v1/sessions/{sid}" if sid else None
    routes: dict[str, tuple[str | None, str | None]] = {
        "list_sessions": ("GET", "/v1/sessions"),
        "recover": ("GET", f"{base}/recovery"),
        "decide": ("POST", f"{base}/decide"),
        "resume": ("POST", f"{base}/resume"),
        "run": ("POST", f"{base}/messages"),
        "fork": ("POST", f"{base}/fork"),
        "abandon": ("POST", f"{base}/abandon"),
        "approve": ("POST", f"{base}/approvals/{step.call_id}"),
    }
    if step.action != "list_sessions" and base is None:
        return None, None
    return routes.get(step.action, (None, None))


def error_body(exc: LodgerError) -> dict[str, Any]:
    detail = exc.to_dict()
    steps = []
    for step in exc.next_steps:
        method, path = _request_for(step)
        steps.append(
            HostStep(
                action=step.action,
                method=method,
                path=path,
                session_id=step.session_id,
                call_id=step.call_id,
            ).model_dump(exclude_none=True)
        )
    detail["next_steps"] = steps
    return {"error": detail}

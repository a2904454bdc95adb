"""Every error lodger raises, split by who is to blame and what happens next.

    LodgerError                      root; carries a stable ``code`` and a one-line ``hint``
    ├── UsageError                   the caller misused lodger (bad option, unknown session)
    │   ├── SessionNotFoundError     no log exists for the session
    │   ├── ConfigError              a configuration file or model spec is invalid
    │   ├── MissingExtraError        a part's optional packages are not installed (an ImportError)
    │   ├── HostAuthError            an HTTP request without a valid token, or out of its scope
    │   ├── McpAuthError             an MCP server's OAuth login failed or was refused
    │   ├── HostConflictError        a request lost a race: answered already, key reused, busy
    │   ├── AuthorityMisuseError     a lease used out of turn: released twice, by another owner
    │   └── HookError                your own hook raised: the turn failed, naming the hook
    ├── ToolCallError                the model proposed a bad call; becomes an error result
    │   └── StaleRevisionError       a write named a revision that is no longer the current one
    ├── ResumeBlockedError           a resume cannot go on until an operator decides
    ├── ProviderError                a model provider failed (``retryable`` says what next)
    │   ├── ProviderTimeoutError     no answer in time
    │   ├── ProviderUnreachableError the connection failed
    │   ├── ProviderAuthError        the credentials were refused
    │   └── RateLimitedError         the provider asked us to slow down
    ├── StorageError                 the world failed (disk, network, another writer)
    │   ├── AppendConflictError      the expected offset was not the log's high-water mark
    │   │   └── WriterFencedError    another writer committed the offset first (object store)
    │   ├── SessionLockedError       another writer holds the session
    │   ├── StorageFullError         no space left where the state lives
    │   ├── CommitFailedError        a durable append did not complete; nothing may run after it
    │   ├── ControlPlaneError        the control plane (SQLite or PostgreSQL) failed or is too new
    │   ├── LeaseLostError           a worker's session lease expired or was taken: commit refused
    │   └── StaleTokenError          a write carried a fencing token older than the newest granted
    └── CorruptLogError              stored facts are inconsistent; reading fails closed
        └── LogKeyError              the chain cannot be checked with the configured key

Errors carry structured fields (``session_id``, ``offset``, ``call_id``) so a CLI or an
operator can act on them, ``str(error)`` is one sentence plus a hint, and ``next_steps``
names what a caller can do next as structured actions (``NextStep``): the CLI renders
them as command lines, an HTTP host as its own requests. No error text below the CLI
names a command or a flag. Every ``code`` is one of ``ERROR_CODES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "ERROR_CODES",
    "AppendConflictError",
    "AuthorityMisuseError",
    "CommitFailedError",
    "ConfigError",
    "ControlPlaneError",
    "CorruptLogError",
    "ErrorCode",
    "HookError",
    "HostAuthError",
    "HostConflictError",
    "LeaseLostError",
    "LodgerError",
    "LogKeyError",
    "McpAuthError",
    "MissingExtraError",
    "NextStep",
    "ProviderAuthError",
    "ProviderError",
    "ProviderTimeoutError",
    "ProviderUnreachableError",
    "RateLimitedError",
    "ResumeBlockedError",
    "SessionLockedError",
    "SessionNotFoundError",
    "StaleRevisionError",
    "StaleTokenError",
    "StorageError",
    "StorageFullError",
    "ToolCallError",
    "UsageError",
    "WriterFencedError",
]


ActionName = Literal[
    "approve",
    "recover",
    "decide",
    "resume",
    "run",
    "fork",
    "list_sessions",
    "abandon",
    "relocate",
]


@dataclass(frozen=True, kw_only=True)
class NextStep:
    """Something a caller can do about an error: ``decide`` call ``call_id`` of
    ``session_id``, ``recover`` a session, ``approve`` a call, ``abandon`` the session's
    open turn, ``relocate`` it (resume in another workspace after checking its files) ..."""

    action: ActionName
    session_id: str | None = None
    call_id: str | None = None

    def to_dict(self) -> dict[str, str]:
        out: dict[str, str] = {"action": self.action}
        if self.session_id is not None:
            out["session_id"] = self.session_id
        if self.call_id is not None:
            out["call_id"] = self.call_id
        return out


class LodgerError(Exception):
    """Root of every lodger error."""

    code: str = "lodger_error"

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        code: str | None = None,
        session_id: str | None = None,
        offset: int | None = None,
        call_id: str | None = None,
        next_steps: tuple[NextStep, ...] = (),
    ) -> None:
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code
        self.session_id = session_id
        self.offset = offset
        self.call_id = call_id
        self.next_steps = next_steps
        super().__init__(self.__str__())

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}; {self.hint}"
        return self.message

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready view for ``--json`` output and API responses."""
        out: dict[str, object] = {"code": self.code, "message": self.message}
        for key in ("hint", "session_id", "offset", "call_id"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.next_steps:
            out["next_steps"] = [step.to_dict() for step in self.next_steps]
        return out


class UsageError(LodgerError):
    code = "usage"


class SessionNotFoundError(UsageError):
    code = "session_not_found"


class ConfigError(UsageError):
    code = "config"


class MissingExtraError(UsageError, ImportError):
    """A part of lodger was imported without the extra that installs its packages: "the
    HTTP host needs fastapi: pip install 'lodger[host]'". ``extra`` names the extra,
    ``name`` the module that is missing; an ``ImportError`` too, so code that falls back
    when an optional module is absent goes on doing so."""

    code = "missing_extra"

    def __init__(self, message: str, *, extra: str, module: str | None) -> None:
        super().__init__(message)
        self.extra = extra
        self.name = module


class HostAuthError(UsageError):
    """The HTTP host refused a request: no token, an unknown one (``unauthorized``), or a
    token whose scope does not cover what was asked (``forbidden``)."""

    code = "unauthorized"


class McpAuthError(UsageError):
    """An OAuth login to an MCP server failed or was refused (a metadata, a callback or
    an answer lodger does not accept, or a server that refused lodger); the message
    never holds a token, a code or a secret."""

    code = "mcp_auth"


class HostConflictError(UsageError):
    """A request the host cannot apply because another one came first: an approval
    already answered, an idempotency key used for another request, a busy session."""

    code = "conflict"


class AuthorityMisuseError(UsageError):
    """A lease or lock was used against its protocol (see :mod:`lodger.authority`).

    ``owner`` is the call that misused it and ``holder`` the call the lease belongs to.
    """

    code = "authority_misuse"

    def __init__(self, message: str, *, owner: str, holder: str, hint: str | None = None) -> None:
        self.owner = owner
        self.holder = holder
        super().__init__(message, hint=hint, call_id=owner)


class HookError(UsageError):
    """A hook of yours (``Hooks.before_call`` / ``after_call``) raised. It is your code's
    failure, not the model's: the turn ends ``failed`` in the log (the calls of the step
    settle first, and a call the hook's failure kept from running is a ``call_rejected``
    fact) and this is raised with the hook's exception chained. ``hook`` is the hook's
    qualified name, ``tool`` and ``call_id`` the call it failed on."""

    code = "hook_failed"

    def __init__(self, message: str, *, hook: str, tool: str, call_id: str) -> None:
        self.hook = hook
        self.tool = tool
        super().__init__(
            message,
            hint="fix the hook: it raised on this call (its exception is chained)",
            call_id=call_id,
        )


class ToolCallError(LodgerError):
    """A call the model proposed cannot run; the message is written for the model."""

    code = "tool_call"


class StaleRevisionError(ToolCallError):
    """A compare-and-swap write expected ``expected`` but the state is at ``current``."""

    code = "stale_revision"

    def __init__(self, message: str, *, key: str, expected: int, current: int, hint: str) -> None:
        self.key = key
        self.expected = expected
        self.current = current
        super().__init__(message, hint=hint)


class StorageError(LodgerError):
    code = "storage"


class AppendConflictError(StorageError):
    code = "append_conflict"


class WriterFencedError(AppendConflictError):
    """A create-only put found the offset taken: another writer committed it first, so
    this writer's view is stale and nothing of its append was written."""

    code = "writer_fenced"


class SessionLockedError(StorageError):
    code = "session_locked"


class CommitFailedError(StorageError):
    code = "commit_failed"


class StorageFullError(CommitFailedError):
    """No space left on the device (or quota) that holds the state."""

    code = "storage_full"


class ControlPlaneError(StorageError):
    """The control plane could not be reached, answered with an error, or its schema is
    newer than this lodger (``code`` ``schema_too_new``)."""

    code = "control_plane"


class LeaseLostError(StorageError):
    """A worker's session lease is no longer current (it expired, or another worker took
    the session with a higher epoch): the commit it guarded is refused, nothing written."""

    code = "lease_lost"


class StaleTokenError(StorageError):
    """A write on a shared resource carried a fencing token older than the newest one the
    control plane granted for it: a late holder, refused."""

    code = "stale_token"


class CorruptLogError(LodgerError):
    """A stored log is inconsistent. ``code`` says how; ``offset`` says where."""

    code = "corrupt"


class LogKeyError(CorruptLogError):
    """A session's chain and the configured log key do not fit, so nothing is read.

    ``code`` is ``key_required`` (the chain is keyed and no key is configured),
    ``wrong_key`` (it is keyed with another key; ``expected_key_id`` names it) or
    ``unkeyed_chain`` (a key is required and the chain is plain: written without a key,
    or rewritten by someone without it). ``offset`` is 0, where the chain is declared.
    """

    code = "log_key"

    def __init__(
        self,
        message: str,
        *,
        code: str,
        hint: str,
        session_id: str,
        expected_key_id: str | None = None,
        configured_key_id: str | None = None,
    ) -> None:
        self.expected_key_id = expected_key_id
        self.configured_key_id = configured_key_id
        super().__init__(message, hint=hint, code=code, session_id=session_id, offset=0)

    def to_dict(self) -> dict[str, object]:
        out = super().to_dict()
        for key in ("expected_key_id", "configured_key_id"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


class ProviderError(LodgerError):
    """A model provider failed. ``retryable`` errors (rate limits, 5xx, dropped
    connections) are retried with backoff by the agent loop; others end the run.
    ``retry_after`` is the wait in seconds the provider asked for (``Retry-After``)."""

    code = "provider"

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        hint: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after
        super().__init__(message, hint=hint, code=code)


class ResumeBlockedError(LodgerError):
    """A turn cannot resume: an invariant failed or operations wait for a decision.

    ``blockers`` lists one line per reason, each naming the call or invariant."""

    code = "resume_blocked"

    def __init__(
        self,
        message: str,
        *,
        blockers: list[str],
        hint: str | None = None,
        session_id: str | None = None,
        next_steps: tuple[NextStep, ...] = (),
    ) -> None:
        self.blockers = blockers
        super().__init__(message, hint=hint, session_id=session_id, next_steps=next_steps)


class ProviderTimeoutError(ProviderError):
    code = "provider_timeout"


class ProviderUnreachableError(ProviderError):
    code = "provider_unreachable"


class ProviderAuthError(ProviderError):
    code = "provider_auth"


class RateLimitedError(ProviderError):
    code = "rate_limited"


ErrorCode = Literal[
    # the caller's misuse
    "usage",
    "session_not_found",
    "config",
    "missing_extra",
    "model_settings",
    "output_mode",
    "permission_mode",
    "output_type",
    "tracing_unavailable",
    "secrets_file_unsafe",
    "authority_misuse",
    "hook_failed",
    "invalid_session_id",
    "invalid_range",
    "head_unknown",
    "writer_closed",
    "nothing_to_resume",
    "no_such_call",
    "nothing_to_decide",
    "nothing_to_abandon",
    "no_workspace",
    "duplicate_tool",
    "tool_declaration",
    "codemode_unavailable",
    "claim",
    "script",
    "script_exhausted",
    "function_model",
    "sync_in_async",
    "compaction_policy",
    "compaction_refused",
    "session_running",
    "stream_unfinished",
    "ambiguous_session",
    "missing_api_key",
    "store_closed",
    "unencodable_event",
    "ambiguous_log_key",
    "invalid_key_required",
    "invalid_log_key",
    "key_file_missing",
    "key_file_unreadable",
    "key_in_state_dir",
    "keyed_session_needs_start",
    "log_key",
    "log_key_too_short",
    # steering and the follow-up queue (lodger.engine.steering)
    "empty_message",
    "message_too_long",
    "queue_policy",
    "not_queued",
    # the HTTP host
    "unauthorized",
    "forbidden",
    "mcp_auth",
    "conflict",
    "already_answered",
    "invalid_answer",
    "idempotency_conflict",
    "session_busy",
    "session_exists",
    "invalid_request",
    "not_found",
    "bad_signature",
    "unknown_hook",
    "model_not_allowed",
    "payload_too_large",
    "invalid_token_hash",
    "token_revoked",
    "token_conflict",
    # the model's bad call (rejection reasons travel as ``call_rejected.reason``)
    "tool_call",
    "bad_url",
    "http_unreachable",
    "stale_revision",
    "invalid_path",
    "path_not_found",
    "path_outside",
    "workspace_missing",
    "unsupported_pattern",
    "unusable_tool",
    "not_a_directory",
    "not_regular_file",
    "path_changing",
    "path_hidden",
    "path_loop",
    "permission_denied",
    "unbound",
    "invisible",
    "activated_this_step",
    "invalid_arguments",
    "duplicate_call",
    "claims_failed",
    "denied",
    "precondition",
    "vetoed",
    "subagent_budget",
    "subagent_depth",
    "subagent_tools",
    "subagent_exists",
    "subagent_schema",
    "subagent_arguments",
    "subagent_busy",
    # the world
    "sandbox_unavailable",
    # background processes (lodger.substrates.processes)
    "unknown_process",
    "process_ended",
    "process_limit",
    "resume_blocked",
    "provider",
    "provider_timeout",
    "provider_unreachable",
    "provider_auth",
    "rate_limited",
    "provider_rate_limited",
    "provider_not_found",
    "provider_unavailable",
    "provider_rejected",
    "provider_connection",
    "provider_protocol",
    "provider_stream",
    "provider_client",
    "provider_failed",
    "context_length",
    "compaction_failed",
    "storage",
    "storage_open",
    "storage_full",
    "artifact_write",
    "artifact_missing",
    "storage_lock",
    "log_file_gone",
    "append_conflict",
    "writer_fenced",
    "object_store",
    "store_cannot_fence",
    "object_store_read",
    "object_store_lost_write",
    "invalid_store_url",
    "fork_beyond_head",
    "workspace_changed",
    "rewind_target",
    "session_locked",
    "commit_failed",
    # corruption
    "corrupt",
    "truncated",
    "bad_checkpoint",
    "artifact_corrupt",
    "head_missing",
    "forged",
    "key_required",
    "wrong_key",
    "unkeyed_chain",
    "head_damaged",
    "digest_mismatch",
    "duplicate_offset",
    "gap",
    "undecodable",
    "unknown_kind",
    "missing_kind",
    "unknown_field",
    "missing_field",
    "invalid_field",
    "newer_schema",
    "offset_mismatch",
    "session_mismatch",
    "duplicate_call_id",
    "rejected_after_dispatch",
    "dispatch_after_rejection",
    "duplicate_operation",
    "unlinked_redispatch",
    "bad_retry_link",
    "bad_not_dispatched",
    "bad_permission_park",
    "unknown_operation",
    "late_acceptance",
    "call_mismatch",
    "missing_call_id",
    "dispatch_without_call",
    "orphan_nested_call",
    "bad_resume_prefix",
    "invalid_control_dsn",
    "invalid_cron",
    "invalid_time",
    "worker_model",
    "control_plane",
    "too_many_connections",
    "schema_too_new",
    "lease_lost",
    "stale_token",
    "lodger_error",
    # not an exception: the CLI's JSON error for a turn stopped by a signal (--json)
    "interrupted",
]
ERROR_CODES: frozenset[str] = frozenset(get_args(ErrorCode))
"""Every ``code`` a lodger error can carry (a test holds the source to this list)."""

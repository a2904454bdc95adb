"""Every error lodger raises, split by who is to blame and what happens next.

    LodgerError                      root; carries a stable ``code`` and a one-line ``hint``
    ├── UsageError                   the caller misused lodger (bad option, unknown session)
    │   ├── SessionNotFoundError     no log exists for the session
    │   ├── ConfigError              a configuration file or model spec is invalid
    │   └── AuthorityMisuseError     a lease used out of turn: released twice, by another owner
    ├── ToolCallError                the model proposed a bad call; becomes an error result
    │   └── StaleRevisionError       a write named a revision that is no longer the current one
    ├── ResumeBlockedError           a resume cannot go on until an operator decides
    ├── ProviderError                a model provider failed (``retryable`` says what next)
    ├── StorageError                 the world failed (disk, network, another writer)
    │   ├── AppendConflictError      the expected offset was not the log's high-water mark
    │   ├── SessionLockedError       another writer holds the session
    │   └── CommitFailedError        a durable append did not complete; nothing may run after it
    └── CorruptLogError              stored facts are inconsistent; reading fails closed
        └── LogKeyError              the chain cannot be checked with the configured key

Errors carry structured fields (``session_id``, ``offset``, ``call_id``) so a CLI or an
operator can act on them, and ``str(error)`` is one sentence plus a hint.
"""

from __future__ import annotations

__all__ = [
    "AppendConflictError",
    "AuthorityMisuseError",
    "CommitFailedError",
    "ConfigError",
    "CorruptLogError",
    "LodgerError",
    "LogKeyError",
    "ProviderError",
    "ResumeBlockedError",
    "SessionLockedError",
    "SessionNotFoundError",
    "StaleRevisionError",
    "StorageError",
    "ToolCallError",
    "UsageError",
]


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
    ) -> None:
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code
        self.session_id = session_id
        self.offset = offset
        self.call_id = call_id
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
        return out


class UsageError(LodgerError):
    code = "usage"


class SessionNotFoundError(UsageError):
    code = "session_not_found"


class ConfigError(UsageError):
    code = "config"


class AuthorityMisuseError(UsageError):
    """A lease or lock was used against its protocol (see :mod:`lodger.authority`).

    ``owner`` is the call that misused it and ``holder`` the call the lease belongs to.
    """

    code = "authority_misuse"

    def __init__(self, message: str, *, owner: str, holder: str, hint: str | None = None) -> None:
        self.owner = owner
        self.holder = holder
        super().__init__(message, hint=hint, call_id=owner)


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


class SessionLockedError(StorageError):
    code = "session_locked"


class CommitFailedError(StorageError):
    code = "commit_failed"


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
    connections) are retried with backoff by the agent loop; others end the run."""

    code = "provider"

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        hint: str | None = None,
        code: str | None = None,
    ) -> None:
        self.retryable = retryable
        self.status = status
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
    ) -> None:
        self.blockers = blockers
        super().__init__(message, hint=hint, session_id=session_id)

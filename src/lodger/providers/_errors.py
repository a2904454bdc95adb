"""The provider failures every adapter reports the same way, whatever its SDK."""

from __future__ import annotations

from lodger.errors import (
    ProviderAuthError,
    ProviderError,
    ProviderTimeoutError,
    ProviderUnreachableError,
    RateLimitedError,
)

__all__ = [
    "error_for_status",
    "stream_unfinished",
    "timed_out",
    "unreachable",
    "unreadable",
]


def error_for_status(spec: str, status: int, detail: str, *, key_env: str) -> ProviderError:
    """A ``ProviderError`` for an HTTP error status, with a stable code and a hint.

    Retryable: 408, 409, 429 and every 5xx; every other status is the request's fault.
    """
    retryable = status in (408, 409, 429) or status >= 500
    if status in (401, 403):
        code, hint = "provider_auth", f"check the API key ({key_env}) and its permissions"
    elif status == 429:
        code, hint = "provider_rate_limited", "rate limited; the request is retried with backoff"
    elif status == 404:
        code, hint = "provider_not_found", "check the model name and the base URL"
    elif retryable:
        code, hint = "provider_unavailable", "the provider failed; the request is retried"
    else:
        code, hint = "provider_rejected", "the provider rejected the request"
    cls: type[ProviderError] = ProviderError
    if status in (401, 403):
        cls = ProviderAuthError
    elif status == 429:
        cls = RateLimitedError
    return cls(
        f"{spec}: HTTP {status}: {detail}", retryable=retryable, status=status, code=code, hint=hint
    )


def timed_out(spec: str) -> ProviderError:
    return ProviderTimeoutError(
        f"{spec}: the request timed out",
        retryable=True,
        code="provider_timeout",
        hint="the provider is slow or unreachable; the request is retried",
    )


def unreachable(spec: str, detail: str) -> ProviderError:
    return ProviderUnreachableError(
        f"{spec}: cannot reach the provider ({detail})",
        retryable=True,
        code="provider_connection",
        hint="check the network and the base URL; the request is retried",
    )


def unreadable(spec: str, detail: str, status: int | None) -> ProviderError:
    return ProviderError(
        f"{spec}: the provider sent an answer lodger cannot read ({detail})",
        retryable=False,
        status=status,
        code="provider_protocol",
    )


def stream_unfinished(spec: str, what: str) -> ProviderError:
    """A stream that ended before its final event: ``what`` names the missing end."""
    return ProviderError(
        f"{spec}: the stream ended before {what}",
        retryable=True,
        code="provider_stream",
        hint="the connection was probably dropped; the request is retried",
    )

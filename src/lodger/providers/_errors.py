"""The one rule for HTTP error statuses every provider adapter shares."""

from __future__ import annotations

from lodger.errors import ProviderError

__all__ = ["error_for_status"]


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
    return ProviderError(
        f"{spec}: HTTP {status}: {detail}", retryable=retryable, status=status, code=code, hint=hint
    )

"""The provider failures every adapter reports the same way, whatever its SDK."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, TypeVar

from lodger.errors import (
    ProviderAuthError,
    ProviderError,
    ProviderTimeoutError,
    ProviderUnreachableError,
    RateLimitedError,
)
from lodger.providers.base import names_context_length

if TYPE_CHECKING:
    from lodger.providers.base import ModelResponse

__all__ = [
    "MALFORMED",
    "SinkFailed",
    "brief",
    "error_for_status",
    "finish_reason",
    "guarded_sink",
    "malformed",
    "parse_retry_after",
    "retry_after_from_headers",
    "sized",
    "stream_unfinished",
    "timed_out",
    "token_count",
    "unreachable",
    "unreadable",
    "within",
]

T = TypeVar("T")
# How long one whole answer may stream. The SDK's ``timeout`` bounds each read, so a
# server that sends a keep-alive or a token now and then would hold a turn for ever.
ANSWER_TIMEOUT = 1800.0


MAX_DETAIL = 2000  # characters of what a provider said that an error message keeps


def brief(detail: object) -> str:
    """What a provider said, cut to ``MAX_DETAIL`` characters: an HTML error page or a
    body of megabytes would otherwise be copied into the message, every retry's event
    and the terminal."""
    text = str(detail)
    if len(text) <= MAX_DETAIL:
        return text
    return f"{text[:MAX_DETAIL]}... ({len(text) - MAX_DETAIL} more characters cut)"


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """The wait a ``Retry-After`` header asks for, in seconds from ``now`` (epoch seconds).

    It is either a number of seconds (``"7"``) or an HTTP-date
    (``"Wed, 21 Oct 2015 07:28:00 GMT"``); a date in the past means no wait. Anything
    else (empty, negative, not a number, not a date) is ``None``: the header is ignored
    and the loop's own backoff applies.
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a zone-less one is read as such
        return None
    return max(when.timestamp() - now, 0.0)


def retry_after_from_headers(
    headers: Mapping[str, str] | None, *, now: float | None = None
) -> float | None:
    """``retry-after-ms`` (OpenAI's, milliseconds) or ``Retry-After`` from a response."""
    if headers is None:
        return None
    moment = time.time() if now is None else now
    try:
        millis = float(headers.get("retry-after-ms") or "nan")
    except ValueError:
        millis = math.nan
    if math.isfinite(millis) and millis >= 0:
        return millis / 1000.0
    return parse_retry_after(headers.get("retry-after"), now=moment)


def error_for_status(
    spec: str,
    status: int,
    detail: str,
    *,
    key_env: str,
    headers: Mapping[str, str] | None = None,
) -> ProviderError:
    """A ``ProviderError`` for an HTTP error status, with a stable code and a hint.

    Retryable: 408, 409, 429 and every 5xx; every other status is the request's fault.
    A ``Retry-After`` header in ``headers`` becomes ``retry_after`` (seconds).
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
    elif status in (400, 413, 422) and names_context_length(detail):
        code, hint = (
            "context_length",
            "the request is longer than the model's context window; compaction "
            "(a [compaction] policy) or a context budget keeps it shorter",
        )
    else:
        code, hint = "provider_rejected", "the provider rejected the request"
    cls: type[ProviderError] = ProviderError
    if status in (401, 403):
        cls = ProviderAuthError
    elif status == 429:
        cls = RateLimitedError
    return cls(
        f"{spec}: HTTP {status}: {brief(detail)}",
        retryable=retryable,
        status=status,
        code=code,
        hint=hint,
        retry_after=retry_after_from_headers(headers) if retryable else None,
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
        f"{spec}: cannot reach the provider ({brief(detail)})",
        retryable=True,
        code="provider_connection",
        hint="check the network and the base URL; the request is retried",
    )


def unreadable(spec: str, detail: str, status: int | None) -> ProviderError:
    return ProviderError(
        f"{spec}: the provider sent an answer lodger cannot read ({brief(detail)})",
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


# What folding a stream raises when an event is not the shape its SDK type says (the SDKs
# build stream events without validating them): a null delta, text that is an object, a
# frame that is not JSON, a token count that is not one.
MALFORMED = (ValueError, TypeError, AttributeError, KeyError, IndexError)
_MAX_TOKENS = 2**53  # past this a count is no count, and JSON readers lose precision


def token_count(value: object, what: str) -> int:
    """A usage count as the provider sent it: ``None`` (not counted) is 0; a negative,
    fractional, absurd or non-number count is a ``ValueError`` (a malformed answer), never
    a count that would lower a turn's usage."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_TOKENS:
        raise ValueError(f"its {what} token count {str(value)[:40]!r} is not a count of tokens")
    return value


def malformed(spec: str, exc: BaseException) -> ProviderError:
    """A stream whose events lodger cannot fold (one of ``MALFORMED``)."""
    said = " ".join(str(exc).split())[:300]  # pydantic's message spans lines
    return unreadable(spec, f"{type(exc).__name__}: {said}", None)


class SinkFailed(Exception):
    """The caller's ``on_text`` raised (its error is the cause): not the provider's fault,
    so it is re-raised as it was, not reported as a malformed answer."""


def guarded_sink(on_text: Callable[[str], None] | None) -> Callable[[str], None] | None:
    if on_text is None:
        return None
    sink = on_text

    def say(text: str) -> None:
        try:
            sink(text)
        except Exception as exc:
            raise SinkFailed from exc

    return say


async def within(spec: str, seconds: float, answer: Awaitable[T]) -> T:
    """``answer`` (one model request, streamed to its end), or a retryable timeout error
    once it has taken ``seconds`` in all, however steadily the server keeps sending."""
    try:
        async with asyncio.timeout(seconds) as deadline:
            return await answer
    except TimeoutError:
        if not deadline.expired():
            raise
        raise ProviderTimeoutError(
            f"{spec}: the answer did not finish within {seconds:g} s",
            retryable=True,
            code="provider_timeout",
            hint="the provider kept the stream open without finishing; the request is retried",
        ) from None


# The most text one answer may hold (text, reasoning, call names and arguments): about a
# million tokens, past any model's output limit. Each answer is one event in the log.
MAX_ANSWER_CHARS = 4_000_000


def sized(response: ModelResponse) -> ModelResponse:
    """``response``, or a ``ValueError`` (a malformed answer) when it holds more than
    ``MAX_ANSWER_CHARS``: a server that streams megabytes must not fill the log."""
    size = len(response.text) + len(response.reasoning)
    size += sum(len(call.name) + len(call.arguments) for call in response.calls)
    if size > MAX_ANSWER_CHARS:
        raise ValueError(f"the answer holds {size} characters, more than {MAX_ANSWER_CHARS}")
    return response


def finish_reason(value: object) -> str:
    """Why the provider says the answer ended: a short string, or a ``ValueError`` (a
    malformed answer): a server may send an object, a number or a megabyte there."""
    if not isinstance(value, str) or len(value) > 100:
        raise ValueError(f"its finish reason {str(value)[:40]!r} is not a short string")
    return value

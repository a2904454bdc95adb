"""How long the agent loop waits before asking a provider again, and how it gives up.

A provider that says how long to wait (``Retry-After``, seconds or an HTTP-date, parsed
by the adapter into ``ProviderError.retry_after``) is believed: the loop waits at least
that long, plus a little jitter so clients that were refused together do not return at
the same instant. Without it the loop backs off exponentially with "equal jitter" (half
the step fixed, half random). The jitter is a number in ``[0, 1)`` handed in by the
caller (``Engine.jitter``), so tests pick it.
"""

from __future__ import annotations

from lodger.errors import ProviderError

__all__ = ["MAX_BACKOFF", "gave_up", "retry_delay"]

#: the longest wait the loop's own backoff reaches (a Retry-After may ask for more)
MAX_BACKOFF = 30.0


def retry_delay(attempt: int, *, base: float, retry_after: float | None, jitter: float) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first retry).

    >>> retry_delay(1, base=0.5, retry_after=None, jitter=0.0)
    0.25
    >>> retry_delay(3, base=0.5, retry_after=2.0, jitter=0.0)
    2.0
    """
    jitter = min(max(jitter, 0.0), 1.0)
    if retry_after is not None:
        # Never earlier than asked; up to 10 % (at least the base step) later.
        return retry_after + jitter * max(0.1 * retry_after, base)
    step = min(base * 2.0 ** (attempt - 1), MAX_BACKOFF)
    return step / 2 + jitter * step / 2


def gave_up(exc: ProviderError, why: str) -> ProviderError:
    """The final failure of a retried request: the same kind of error, saying so."""
    return type(exc)(
        f"gave up {why}: {exc.message}",
        retryable=False,
        status=exc.status,
        hint="the provider kept failing; try again later",
        code=exc.code,
        retry_after=exc.retry_after,
    )

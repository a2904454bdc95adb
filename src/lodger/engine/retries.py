"""How long the agent loop waits before asking a provider again, and how it gives up.

A provider that says how long to wait (``Retry-After``, seconds or an HTTP-date, parsed
by the adapter into ``ProviderError.retry_after``) is believed: the loop waits at least
that long, plus a little jitter so clients that were refused together do not return at
the same instant. Without it the loop backs off exponentially with "equal jitter" (half
the step fixed, half random). The jitter is a number in ``[0, 1)`` handed in by the
caller (``Engine.jitter``), so tests pick it.

:func:`complete` is the loop itself: a step's request, retried per model, and handed on
to the next model of a ``FallbackModel`` (a ``model_switched`` fact) once one gave up.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from lodger.errors import ProviderError
from lodger.events import ModelSwitched, ProviderRetried
from lodger.providers.base import Model, ModelRequest, ModelResponse, TextSink
from lodger.providers.fallback import FallbackModel

if TYPE_CHECKING:
    from lodger.engine.settings import Retries

__all__ = ["MAX_BACKOFF", "Record", "complete", "gave_up", "retry_delay"]

#: commits one fact of the step (``provider_retried``, ``model_switched``)
Record = Callable[[ProviderRetried | ModelSwitched], Awaitable[object]]

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


async def complete(
    model: Model,
    request: ModelRequest,
    *,
    retries: Retries,
    record: Record,
    on_text: TextSink | None = None,
) -> ModelResponse:
    """The step's answer from ``model``: each retryable failure is retried (a
    ``provider_retried`` fact each); a ``FallbackModel`` whose member gave up on a failure
    its ``fallback_on`` accepts goes on to the next member (a ``model_switched`` fact),
    whose retries start afresh. The last failure is raised."""
    if not isinstance(model, FallbackModel):
        return await _retried(model, request, retries=retries, record=record, on_text=on_text)
    for member, after in model.pairs():
        try:
            return await _retried(member, request, retries=retries, record=record, on_text=on_text)
        except ProviderError as exc:
            # judged on the failure itself, not on the "gave up" that ended its retries
            cause = exc.__cause__ if isinstance(exc.__cause__, ProviderError) else exc
            if after is None or not model.falls_back(cause):
                raise
            await record(
                ModelSwitched(from_model=member.spec, to_model=after.spec, error=exc.message)
            )
    raise AssertionError("unreachable: the last member's failure is raised")


async def _retried(
    model: Model,
    request: ModelRequest,
    *,
    retries: Retries,
    record: Record,
    on_text: TextSink | None,
) -> ModelResponse:
    attempt = 0
    while True:
        try:
            return await model.complete(request, on_text=on_text)
        except ProviderError as exc:
            attempt += 1
            if not exc.retryable:
                raise
            if attempt > retries.max_retries:
                raise gave_up(exc, f"after {attempt - 1} retries") from exc
            if exc.retry_after is not None and exc.retry_after > retries.max_retry_after:
                raise gave_up(
                    exc,
                    f"at once (the provider asked to wait {exc.retry_after:.0f} s, more "
                    f"than {retries.max_retry_after:.0f} s)",
                ) from exc
            delay = retry_delay(
                attempt,
                base=retries.base_delay,
                retry_after=exc.retry_after,
                jitter=retries.jitter(),
            )
            error = exc.message
            if exc.retry_after is not None:
                error = f"{error} (Retry-After {exc.retry_after:g} s)"
            await record(ProviderRetried(attempt=attempt, error=error, delay_ms=int(delay * 1000)))
            await retries.sleep(delay)

"""``FallbackModel``: models tried in order when one fails in a way that is not the
request's fault.

>>> model = FallbackModel(make_model("openai:gpt-4.1"), make_model("anthropic:claude-sonnet-4-5"))
>>> agent = Agent(model=model)  # or Agent(model="openai:gpt-4.1|anthropic:claude-sonnet-4-5")

Inside a run the engine drives the chain (``lodger.engine.retries.complete``): each model
gets the run's retries first, and only when it gave up on a failure ``fallback_on``
accepts does the next one take the step, recorded as a ``model_switched`` fact before the
step's ``model_output``. Each step starts again from the first model, so a recovered
first model answers the next step. Called directly (outside a run), ``complete`` tries
the models in order without retries and without facts.

The spec of a chain is its members' specs joined by ``|`` (``openai:a|anthropic:b``):
``make_model`` reads it back, so a resumed session runs with the same chain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import cast

from lodger.errors import ProviderError, UsageError
from lodger.providers.base import Model, ModelRequest, ModelResponse, OutputMode, TextSink

__all__ = ["SEPARATOR", "FallbackModel", "FallbackOn", "not_the_requests_fault"]

#: what separates the members of a chain in a spec (no provider's spec contains it)
SEPARATOR = "|"

FallbackOn = Callable[[ProviderError], bool] | tuple[type[ProviderError], ...]
"""When to try the next model: a test of the failure, or the error classes that count."""


def not_the_requests_fault(error: ProviderError) -> bool:
    """The default ``fallback_on``: failures the next provider may not share (5xx, 408,
    409, rate limits, timeouts, dropped connections and cut streams: the retryable ones).
    A 400, 401, 403 or 404, an unreadable answer or a spent budget stays with the request."""
    return error.retryable


class FallbackModel:
    """``first``, then each of ``others`` in turn, for a step whose model failed.

    ``fallback_on`` decides which failures move on: by default those that are not the
    request's fault (``not_the_requests_fault``); a tuple of ``ProviderError`` classes
    (``(RateLimitedError,)``) or any test of the error narrows it. The chain owns its
    members: ``aclose`` closes them all.
    """

    def __init__(
        self, first: Model, *others: Model, fallback_on: FallbackOn = not_the_requests_fault
    ) -> None:
        members: list[Model] = []
        for model in (first, *others):
            # a chain inside a chain is the same chain, flattened: one spec reads it back
            members.extend(model.models if isinstance(model, FallbackModel) else (model,))
        if len(members) < 2:
            raise UsageError(
                "a FallbackModel needs at least two models",
                hint="pass the model itself when there is nothing to fall back to",
            )
        for model in members:
            if SEPARATOR in model.spec:
                raise UsageError(
                    f"the model spec {model.spec!r} holds {SEPARATOR!r}, which separates "
                    "the models of a fallback chain",
                    hint="rename the script file or model so its spec has no '|'",
                )
        self.models: tuple[Model, ...] = tuple(members)
        self._fallback_on = fallback_on

    @property
    def spec(self) -> str:
        return SEPARATOR.join(model.spec for model in self.models)

    @property
    def output_mode(self) -> OutputMode:
        """The members' structured-output mode when they all share one, else
        ``prompted`` (the mode every provider takes): one request serves the chain."""
        modes = {cast(OutputMode, getattr(m, "output_mode", "prompted")) for m in self.models}
        return modes.pop() if len(modes) == 1 else "prompted"

    @property
    def media_kinds(self) -> frozenset[str]:
        """What every member takes (a step may land on any of them)."""
        kinds = [frozenset(getattr(m, "media_kinds", frozenset())) for m in self.models]
        return frozenset.intersection(*kinds)

    def falls_back(self, error: ProviderError) -> bool:
        """Whether ``error`` (as the model last raised it, before any retry gave up)
        moves the step on to the next model."""
        test = self._fallback_on
        if isinstance(test, tuple):
            return isinstance(error, test)
        return bool(test(error))

    def pairs(self) -> Iterator[tuple[Model, Model | None]]:
        """Each member with the one after it (None after the last)."""
        for i, model in enumerate(self.models):
            yield model, self.models[i + 1] if i + 1 < len(self.models) else None

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        for model, after in self.pairs():
            try:
                return await model.complete(request, on_text=on_text)
            except ProviderError as exc:
                if after is None or not self.falls_back(exc):
                    raise
        raise AssertionError("unreachable: the last member's failure is raised")

    async def aclose(self) -> None:
        for model in self.models:
            await model.aclose()

    def __repr__(self) -> str:
        return f"FallbackModel({self.spec!r})"

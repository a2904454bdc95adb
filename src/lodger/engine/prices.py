"""Prices of model tokens, and what one model request cost.

A ``PriceTable`` maps a model spec (``openai:gpt-4.1``) to a ``ModelPrice`` in US dollars
per million tokens: uncached input, cached input (tokens read from the provider's prompt
cache), output, and optionally input written to the cache (Anthropic charges more for
those; default: the input price). A spec is matched exactly, else by the longest entry
it starts with at a ``-`` or ``@`` boundary (``anthropic:claude-sonnet-4`` prices
``anthropic:claude-sonnet-4-20250514``), else by the table's ``*`` entry if it has one;
a fallback chain (``a|b``) is priced as the member that answered.

>>> table = PriceTable.defaults().with_prices({"openai:my-tune": ModelPrice.of(1, 0.5, 4)})
>>> table.cost("openai:my-tune", Usage(input_tokens=1000, output_tokens=10))
1040

Costs are integers in micro-USD (millionths of a dollar), rounded up per request, so a
budget's sum is exact and the same in every process that reads the log.

The defaults (``DEFAULT_PRICES``) are the providers' published list prices as of
``PRICES_AS_OF``: estimates, not invoices. Batch discounts, long-context tiers and
regional prices are not modelled; set your own with ``[budgets.prices]`` or
``PriceTable.with_prices``. lodger's offline models (``script:``, ``function:``, ``test``)
cost nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from lodger.errors import ConfigError
from lodger.events import Usage

__all__ = ["DEFAULT_PRICES", "PRICES_AS_OF", "ModelPrice", "PriceTable"]

#: when the default prices were read from the providers' price pages
PRICES_AS_OF = "2025-08-01"

_FREE_PREFIXES = ("script:", "function:", "test")
_CHAIN = "|"  # between the members of a fallback chain's spec (lodger.providers.fallback)


def _usd(value: object, what: str) -> Decimal:
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        amount = Decimal("NaN")
    if not amount.is_finite() or amount < 0 or isinstance(value, bool):
        raise ConfigError(
            f"{what} must be a price in USD per million tokens (a number >= 0), not {value!r}",
            hint="for example input = 2.0, cached_input = 0.5, output = 8.0",
            code="config",
        )
    return amount


@dataclass(frozen=True, kw_only=True)
class ModelPrice:
    """US dollars per million tokens."""

    input: Decimal
    cached_input: Decimal
    output: Decimal
    #: input tokens written to the prompt cache (None: priced as ``input``)
    cache_write: Decimal | None = None

    @classmethod
    def of(
        cls,
        input: float | str | Decimal,
        cached_input: float | str | Decimal,
        output: float | str | Decimal,
        cache_write: float | str | Decimal | None = None,
    ) -> ModelPrice:
        return cls(
            input=_usd(input, "input"),
            cached_input=_usd(cached_input, "cached_input"),
            output=_usd(output, "output"),
            cache_write=None if cache_write is None else _usd(cache_write, "cache_write"),
        )

    def cost(self, usage: Usage) -> int:
        """Micro-USD of one request (USD per million tokens is micro-USD per token)."""
        cached = min(usage.cache_read_tokens, usage.input_tokens)
        written = min(usage.cache_write_tokens, usage.input_tokens - cached)
        plain = usage.input_tokens - cached - written
        write_price = self.input if self.cache_write is None else self.cache_write
        total = (
            plain * self.input
            + cached * self.cached_input
            + written * write_price
            + usage.output_tokens * self.output
        )
        return math.ceil(total)


_FREE = ModelPrice(input=Decimal(0), cached_input=Decimal(0), output=Decimal(0))


def _p(input: str, cached: str, output: str, write: str | None = None) -> ModelPrice:
    return ModelPrice.of(input, cached, output, write)


#: list prices in USD per million tokens as of ``PRICES_AS_OF`` (estimates)
DEFAULT_PRICES: Mapping[str, ModelPrice] = {
    "openai:gpt-5": _p("1.25", "0.125", "10"),
    "openai:gpt-5-mini": _p("0.25", "0.025", "2"),
    "openai:gpt-5-nano": _p("0.05", "0.005", "0.40"),
    "openai:gpt-4.1": _p("2", "0.50", "8"),
    "openai:gpt-4.1-mini": _p("0.40", "0.10", "1.60"),
    "openai:gpt-4.1-nano": _p("0.10", "0.025", "0.40"),
    "openai:gpt-4o": _p("2.50", "1.25", "10"),
    "openai:gpt-4o-mini": _p("0.15", "0.075", "0.60"),
    "openai:o3": _p("2", "0.50", "8"),
    "openai:o3-mini": _p("1.10", "0.55", "4.40"),
    "openai:o4-mini": _p("1.10", "0.275", "4.40"),
    "anthropic:claude-opus-4": _p("15", "1.50", "75", "18.75"),
    "anthropic:claude-sonnet-4": _p("3", "0.30", "15", "3.75"),
    "anthropic:claude-3-7-sonnet": _p("3", "0.30", "15", "3.75"),
    "anthropic:claude-3-5-haiku": _p("0.80", "0.08", "4", "1"),
    "anthropic:claude-haiku-4-5": _p("1", "0.10", "5", "1.25"),
    "gemini:gemini-2.5-pro": _p("1.25", "0.31", "10"),
    "gemini:gemini-2.5-flash": _p("0.30", "0.075", "2.50"),
    "gemini:gemini-2.5-flash-lite": _p("0.10", "0.025", "0.40"),
}

_ALIASES = {"responses:": "openai:", "google:": "gemini:", "google-gla:": "gemini:"}


@dataclass(frozen=True)
class PriceTable:
    """Prices by model spec; see the module docstring for how a spec is matched."""

    prices: Mapping[str, ModelPrice] = field(default_factory=dict)

    @classmethod
    def defaults(cls) -> PriceTable:
        return cls(dict(DEFAULT_PRICES))

    def with_prices(self, prices: Mapping[str, ModelPrice]) -> PriceTable:
        """This table with ``prices`` added (an entry of the same spec replaced)."""
        return PriceTable({**self.prices, **prices})

    def price(self, spec: str) -> ModelPrice:
        """The price of ``spec``; ``ConfigError`` naming it when the table has none.

        A fallback chain's spec (``openai:a|anthropic:b``) is priced as its first member:
        a step another member answered says so in its ``model_switched`` fact."""
        spec = spec.split(_CHAIN, 1)[0]
        found = self._lookup(spec)
        if found is None:
            for alias, provider in _ALIASES.items():
                if spec.startswith(alias):
                    found = self._lookup(provider + spec[len(alias) :])
        if found is None:
            found = self.prices.get("*")
        if found is None:
            raise ConfigError(
                f"no price for model {spec!r}: a money budget cannot count its spend",
                hint=f'add it: [budgets.prices."{spec}"] input = ..., cached_input = ..., '
                "output = ... (USD per million tokens) in lodger.toml, or "
                "PriceTable.defaults().with_prices({...}) in Budgets(prices=...)",
                code="config",
            )
        return found

    def require(self, spec: str) -> None:
        """``ConfigError`` unless every model of ``spec`` (each of a chain) has a price."""
        for member in spec.split(_CHAIN):
            self.price(member)

    def _lookup(self, spec: str) -> ModelPrice | None:
        exact = self.prices.get(spec)
        if exact is not None:
            return exact
        best: str | None = None
        for key in self.prices:
            if (
                len(spec) > len(key)
                and spec.startswith(key)
                and spec[len(key)] in "-@"
                and (best is None or len(key) > len(best))
            ):
                best = key
        if best is not None:
            return self.prices[best]
        if spec.startswith(_FREE_PREFIXES):
            return _FREE
        return None

    def cost(self, spec: str, usage: Usage) -> int:
        """Micro-USD that ``usage`` on ``spec`` cost."""
        return self.price(spec).cost(usage)

"""Usage limits and money budgets: checked from the log before each model request.

    Agent(
        model=model,
        limits=Limits(
            usage=UsageLimits(request_limit=20, total_tokens_limit=200_000),
            budgets=Budgets(session_usd=2, tree_usd=5, daily_usd=50),
        ),
    )

``UsageLimits`` count over one turn (every run of it): model requests, input, output
and total tokens, and the tool calls the model proposed and lodger dispatched.
``Budgets`` count money, priced from the usage facts with a ``PriceTable``
(``lodger.engine.prices``): per session, per subagent tree (the root session and every
child it delegated to, at any depth) and per UTC day across the sessions of the storage.

When one is reached the run records a ``budget_reached`` fact and ends ``parked``; the
turn stays open, never ended for it. Raise the limit (a new ``Limits``, ``lodger.toml``)
and resume the session: the turn continues as a new run. Without a raise, the resume
parks again before asking the model anything.

Everything is read from committed facts, never from counters kept in memory, so a
budget holds across a crash (a SIGKILL loses no spend: it was committed with its step)
and across workers. The session's own spend comes from its verified fold; the tree and
the day are read by a ``SpendReader`` (``lodger.runtime.spend``), which folds each other
session's log once and then only what was appended since.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Protocol

from lodger.engine.prices import PriceTable
from lodger.errors import ConfigError
from lodger.events import (
    BudgetReached,
    Compacted,
    CompactionFailed,
    Event,
    ModelOutput,
    ModelSwitched,
    RunStarted,
    SamplingAnswered,
    StepStarted,
    ToolDispatched,
)

if TYPE_CHECKING:
    from lodger.engine.state import SessionState

__all__ = [
    "Budgets",
    "SpendFold",
    "SpendReader",
    "UsageLimits",
    "check_before_calls",
    "check_before_request",
    "day_of",
    "describe",
]

_DAY_US = 86_400_000_000


def day_of(ts_us: int) -> int:
    """The UTC day (days since 1970-01-01) of a timestamp in microseconds."""
    return ts_us // _DAY_US


def _count(value: object, what: str) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ConfigError(
            f"{what} must be a whole number >= 0 or None (no limit), not {value!r}",
            hint="for example UsageLimits(request_limit=20)",
            code="config",
        )


@dataclass(frozen=True, kw_only=True)
class UsageLimits:
    """Per-turn limits, as pydantic-ai's ``UsageLimits`` (None: no limit). A turn parks
    before the request that would go past ``request_limit``, before any request once a
    token limit is reached, and before dispatching a step's calls that would go past
    ``tool_calls_limit`` (a code cell counts as one call)."""

    request_limit: int | None = None
    input_tokens_limit: int | None = None
    output_tokens_limit: int | None = None
    total_tokens_limit: int | None = None
    tool_calls_limit: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            _count(getattr(self, f.name), f.name)

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    def lowered(self, other: UsageLimits) -> UsageLimits:
        """The stricter of the two, field by field (an untrusted project only lowers)."""
        return replace(self, **{f.name: _lower(self, other, f.name) for f in fields(self)})


def _lower(a: object, b: object, name: str) -> int | None:
    x: int | None = getattr(a, name)
    y: int | None = getattr(b, name)
    return y if x is None else x if y is None else min(x, y)


def _micro(value: object, what: str) -> int | None:
    if value is None:
        return None
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        amount = Decimal("NaN")
    if isinstance(value, bool) or not amount.is_finite() or amount < 0:
        raise ConfigError(
            f"{what} must be an amount in USD >= 0 or None (no budget), not {value!r}",
            hint="for example Budgets(session_usd=2.5)",
            code="config",
        )
    return math.floor(amount * 1_000_000)


@dataclass(frozen=True, kw_only=True)
class Budgets:
    """Money budgets in US dollars (None: none), priced with ``prices``."""

    #: spend of one session, all its turns
    session_usd: float | str | Decimal | None = None
    #: spend of the subagent tree the session is in: its root and every descendant
    tree_usd: float | str | Decimal | None = None
    #: spend of every session of the storage on the current UTC day
    daily_usd: float | str | Decimal | None = None
    prices: PriceTable = field(default_factory=PriceTable.defaults)

    def __post_init__(self) -> None:
        for name in ("session_usd", "tree_usd", "daily_usd"):
            _micro(getattr(self, name), name)

    def micro(self, name: str) -> int | None:
        """A budget in micro-USD (exact integers, as the facts hold them)."""
        return _micro(getattr(self, name), name)

    @property
    def any(self) -> bool:
        return any(getattr(self, n) is not None for n in ("session_usd", "tree_usd", "daily_usd"))

    def lowered(self, other: Budgets) -> Budgets:
        """The stricter budgets of the two; the prices stay this one's."""
        out: dict[str, Any] = {}
        for name in ("session_usd", "tree_usd", "daily_usd"):
            x, y = self.micro(name), other.micro(name)
            low = y if x is None else x if y is None else min(x, y)
            out[name] = None if low is None else Decimal(low) / 1_000_000
        return replace(self, **out)


class SpendFold:
    """The spend of one session, folded from its events in order: micro-USD in total
    and by UTC day, and the child sessions its calls named (``children_of`` reads a
    ``delegate`` call's resources). Fed again with only what was appended since."""

    def __init__(
        self, prices: PriceTable, children_of: Callable[[Sequence[str]], str | None] | None = None
    ) -> None:
        self.prices = prices
        self.children_of = children_of
        self.high_water = 0
        self.last_digest = ""
        self.total = 0
        self.by_day: dict[int, int] = {}
        self.children: list[str] = []
        #: the session's first event (its ``session_started``: where it comes from)
        self.first: Event | None = None
        self._step_models: dict[str, str] = {}
        self._run_model = ""

    def feed(self, events: Sequence[Event]) -> None:
        for e in events:
            if e.offset < self.high_water:
                continue  # folded already
            self._one(e)
            self.high_water, self.last_digest = e.offset + 1, e.digest

    def _one(self, e: Event) -> None:
        body = e.body
        if e.offset == 0:
            self.first = e
        if isinstance(body, StepStarted):
            self._step_models[e.step_id or ""] = body.model
        elif isinstance(body, ModelSwitched):  # the step's output is the fallback's
            self._step_models[e.step_id or ""] = body.to_model
        elif isinstance(body, RunStarted):
            self._run_model = body.model
        elif isinstance(body, ModelOutput):
            if e.origin == "provider" and body.usage is not None:
                model = self._step_models.pop(e.step_id or "", self._run_model)
                cost = self.prices.cost(model, body.usage)
                self.total += cost
                day = day_of(e.ts)
                self.by_day[day] = self.by_day.get(day, 0) + cost
        elif isinstance(body, Compacted | CompactionFailed | SamplingAnswered) and (
            body.usage is not None
        ):
            # the summary requests; an MCP server's sampling, answered by the session's model
            cost = self.prices.cost(body.model, body.usage)
            self.total += cost
            day = day_of(e.ts)
            self.by_day[day] = self.by_day.get(day, 0) + cost
        elif isinstance(body, ToolDispatched) and self.children_of is not None:
            child = self.children_of(body.resources)
            if child is not None and child not in self.children:
                self.children.append(child)


class SpendReader(Protocol):
    """Reads what other sessions spent (``lodger.runtime.spend.LogSpend`` reads the
    log); ``own`` is the checking session's fold, fresher than its stored log."""

    async def tree(self, own: SpendFold, state: SessionState, prices: PriceTable) -> int: ...

    async def day(
        self, own: SpendFold, day: int, state: SessionState, prices: PriceTable
    ) -> int: ...


#: each open session's own fold, kept with its state (only new events are priced a step)
_OWN: weakref.WeakKeyDictionary[SessionState, SpendFold] = weakref.WeakKeyDictionary()


def _own(state: SessionState, prices: PriceTable) -> SpendFold:
    """The session's spend from its verified fold: what it committed, to the last event."""
    fold = _OWN.get(state)
    events = state.events
    if (
        fold is None
        or fold.prices != prices
        or fold.high_water > len(events)
        or (fold.high_water and events[fold.high_water - 1].digest != fold.last_digest)
    ):
        fold = _OWN[state] = SpendFold(prices)
    if fold.high_water < len(events):
        fold.feed(events[fold.high_water :])
    return fold


@dataclass(frozen=True, slots=True)
class _TurnUse:
    requests: int
    input_tokens: int
    output_tokens: int
    calls: int
    last_reached: BudgetReached | None


def _turn_use(state: SessionState) -> _TurnUse:
    start = state.open_turn_offset or 0
    requests = inp = out = 0
    calls: set[str] = set()
    reached: BudgetReached | None = None
    for e in state.events[start:]:
        body = e.body
        if isinstance(body, ModelOutput) and e.origin == "provider":
            requests += 1
            reached = None  # the model was asked again: the park was lifted
            if body.usage is not None:
                inp += body.usage.input_tokens
                out += body.usage.output_tokens
        elif isinstance(body, Compacted | CompactionFailed) and body.usage is not None:
            requests += body.attempts if isinstance(body, CompactionFailed) else 1
            inp += body.usage.input_tokens
            out += body.usage.output_tokens
        elif isinstance(body, SamplingAnswered):  # an MCP server's request to our model
            requests += 1
            inp += body.usage.input_tokens
            out += body.usage.output_tokens
        elif isinstance(body, ToolDispatched) and e.parent_call_id is None:
            calls.add(e.call_id or "")
        elif isinstance(body, BudgetReached):
            reached = body
    return _TurnUse(requests, inp, out, len(calls), reached)


def _reached(
    budget: str, limit: int | None, spent: int, unit: str, scope: str
) -> BudgetReached | None:
    if limit is None or spent < limit:
        return None
    return BudgetReached(budget=budget, limit=limit, spent=spent, unit=unit, scope=scope)


def _usage_reached(limits: UsageLimits, state: SessionState) -> BudgetReached | None:
    use = _turn_use(state)
    last = use.last_reached
    if last is not None and last.budget == "tool_calls":
        # parked before dispatching a step's calls: still parked unless raised past them
        limit = limits.tool_calls_limit
        if limit is not None and limit < last.spent:
            return BudgetReached(
                budget="tool_calls", limit=limit, spent=last.spent, unit="calls", scope="turn"
            )
    checks = (
        ("requests", limits.request_limit, use.requests, "requests"),
        ("input_tokens", limits.input_tokens_limit, use.input_tokens, "tokens"),
        ("output_tokens", limits.output_tokens_limit, use.output_tokens, "tokens"),
        ("total_tokens", limits.total_tokens_limit, use.input_tokens + use.output_tokens, "tokens"),
    )
    for budget, limit, spent, unit in checks:
        found = _reached(budget, limit, spent, unit, "turn")
        if found is not None:
            return found
    return None


async def check_before_request(
    state: SessionState,
    *,
    usage: UsageLimits,
    budgets: Budgets,
    spend: SpendReader | None,
    now_us: int,
    model: str | None = None,
) -> BudgetReached | None:
    """The limit or budget the next model request would go past, if any. With a money
    budget, ``model`` (the spec the request goes to) must have a price: a ``ConfigError``
    says so before the request rather than after it."""
    found = _usage_reached(usage, state) if usage.any else None
    if found is not None or not budgets.any:
        return found
    if model is not None:
        budgets.prices.require(model)
    own = _own(state, budgets.prices)
    found = _reached(
        "session_cost", budgets.micro("session_usd"), own.total, "micro_usd", "session"
    )
    if found is not None:
        return found
    for name, scope in (("tree_usd", "tree"), ("daily_usd", "day")):
        limit = budgets.micro(name)
        if limit is None:
            continue
        if spend is None:
            raise ConfigError(
                f"a {scope} budget needs a reader of the other sessions' logs",
                hint="run through Agent or Sessions, which read them from their storage",
                code="config",
            )
        if scope == "tree":
            spent = await spend.tree(own, state, budgets.prices)
        else:
            spent = await spend.day(own, day_of(now_us), state, budgets.prices)
        found = _reached(
            f"{scope}_cost" if scope == "tree" else "daily_cost", limit, spent, "micro_usd", scope
        )
        if found is not None:
            return found
    return None


def check_before_calls(
    state: SessionState, *, usage: UsageLimits, proposed: int
) -> BudgetReached | None:
    """``tool_calls`` when dispatching ``proposed`` more calls would go past the limit."""
    limit = usage.tool_calls_limit
    if limit is None or proposed == 0:
        return None
    spent = _turn_use(state).calls + proposed
    if spent <= limit:
        return None
    return BudgetReached(budget="tool_calls", limit=limit, spent=spent, unit="calls", scope="turn")


def _how(budget: str) -> str:
    """Where a budget is raised: the library's group, lodger.toml and the flag."""
    if budget in _MONEY:
        key, table = _MONEY[budget], "budgets"
        group = f"Budgets({key}=...)"
    else:
        key, table = f"{budget}_limit" if budget != "requests" else "request_limit", "limits"
        group = f"UsageLimits({key}=...)"
    return f"{group}, {key} in [{table}] of lodger.toml or --{key.replace('_', '-')}"


_MONEY = {"session_cost": "session_usd", "tree_cost": "tree_usd", "daily_cost": "daily_usd"}


def _amount(value: int, unit: str) -> str:
    if unit == "micro_usd":
        return f"{Decimal(value) / 1_000_000:f} USD"
    return f"{value} {unit}"


def describe(reached: BudgetReached) -> str:
    """One line: what was reached, and how to raise it and go on."""
    if reached.budget == "tool_calls":
        what = f"the step proposed calls that would make {reached.spent}"
    else:
        what = f"spent {_amount(reached.spent, reached.unit)}"
    return (
        f"the {reached.budget} budget of the {reached.scope} is reached "
        f"({what}; limit {_amount(reached.limit, reached.unit)}); raise "
        f"{_how(reached.budget)} and resume the session"
    )

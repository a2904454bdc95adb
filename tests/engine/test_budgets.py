"""Usage limits and money budgets park a turn before the request that would go past
them; a raised limit and a resume continue the same turn as a new run, nothing re-run.
Spend is read from the log: a new agent on the same state directory sees it all.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from lodger import Agent, FunctionModel, tool
from lodger.engine.budgets import Budgets, UsageLimits
from lodger.engine.prices import ModelPrice, PriceTable
from lodger.engine.settings import Limits, Services
from lodger.errors import ConfigError
from lodger.events import BudgetReached, Event, RecoveryObserved, RunEnded, TurnEnded, Usage
from lodger.ids import ManualClock
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import tool_call

RAN: list[int] = []

#: 1000 input tokens (200 of them cached) and 100 output tokens at these prices:
#: 800 * 2 + 200 * 0.5 + 100 * 8 = 2500 micro-USD a request
PRICES = PriceTable.defaults().with_prices({"function:priced": ModelPrice.of(2, "0.5", 8)})
USAGE = Usage(input_tokens=1000, cache_read_tokens=200, output_tokens=100)
PER_REQUEST = 2500


@tool(recovery="never_retry")
def add(a: int, b: int) -> int:
    """Add two integers (counted: nothing may run twice)."""
    RAN.append(a + b)
    return a + b


class Counted:
    """``add`` per step until ``calls`` are made, then an answer; counts its requests."""

    def __init__(self, calls: int = 1, per_step: int = 1) -> None:
        self.calls, self.per_step, self.requests = calls, per_step, 0

    def model(self) -> FunctionModel:
        def step(request: ModelRequest) -> ModelResponse:
            self.requests += 1
            done = sum(isinstance(m, ToolResultMessage) for m in request.messages)
            if done >= self.calls:
                return ModelResponse(text="done", usage=USAGE)
            calls = tuple(tool_call("add", a=done, b=n) for n in range(self.per_step))
            return ModelResponse(calls=calls, usage=USAGE)

        return FunctionModel(step, name="priced")


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


def agent(state: Path, model: FunctionModel, **limits: object) -> Agent:
    return Agent(model=model, tools=[add], storage=state, limits=Limits(**limits))  # type: ignore[arg-type]


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


async def test_a_request_limit_parks_and_a_raised_one_resumes_the_same_turn(
    tmp_path: Path,
) -> None:
    script = Counted(calls=2)
    async with agent(tmp_path, script.model(), usage=UsageLimits(request_limit=2)) as a:
        parked = await a.run("add twice", session="s")
    assert parked.status == "parked" and script.requests == 2
    assert parked.budget == BudgetReached(
        budget="requests", limit=2, spent=2, unit="requests", scope="turn"
    )
    assert "request_limit" in (parked.error or "") and "resume" in (parked.error or "")
    async with agent(tmp_path, script.model()) as a:
        events = await a.session("s").events()
        assert kinds(events)[-2:] == ["budget_reached", "run_ended"]
        assert isinstance(events[-1].body, RunEnded) and events[-1].body.status == "parked"
        assert not any(isinstance(e.body, TurnEnded) for e in events)  # the turn stays open
    async with agent(tmp_path, script.model(), usage=UsageLimits(request_limit=3)) as a:
        resumed = await a.resume("s")
        events = await a.session("s").events()
        await a.session("s").verify()
    assert resumed.status == "completed" and resumed.answer == "done"
    assert resumed.turn_id == parked.turn_id and resumed.run_id != parked.run_id
    assert RAN == [0, 1] and script.requests == 3  # nothing ran again
    assert len(resumed.usage.requests) == 3  # the turn's usage counts both runs


async def test_resume_without_a_raise_parks_again_without_asking_the_model(
    tmp_path: Path,
) -> None:
    script = Counted(calls=3)
    limits = UsageLimits(total_tokens_limit=2000)
    async with agent(tmp_path, script.model(), usage=limits) as a:
        first = await a.run("go", session="s")
        assert first.status == "parked" and script.requests == 2
        logged = len(await a.session("s").events())
        again = await a.resume("s")
        # a new turn on the session resumes the open one first: parked still
        third = await a.run("something else", session="s")
        # nothing written either time (a worker looking again every minute adds nothing)
        assert len(await a.session("s").events()) == logged
    assert again.status == third.status == "parked" and script.requests == 2
    assert again.budget == BudgetReached(
        budget="total_tokens", limit=2000, spent=2200, unit="tokens", scope="turn"
    )
    assert third.turn_id == first.turn_id  # the open turn resumed, no new turn started


async def test_input_and_output_token_limits_count_the_turn_only(tmp_path: Path) -> None:
    script = Counted(calls=1)
    async with agent(tmp_path, script.model(), usage=UsageLimits(output_tokens_limit=100)) as a:
        one = await a.run("a", session="s")  # 100 output tokens after 1 request: parks
        assert one.status == "parked" and one.budget is not None
        assert one.budget.budget == "output_tokens" and one.budget.spent == 100
    async with agent(tmp_path, script.model(), usage=UsageLimits(input_tokens_limit=2000)) as a:
        done = await a.resume("s")
        assert done.status == "completed"
        # a new turn starts from zero: the first turn's 2000 input tokens are not its own
        two = await a.run("b", session="s")
    assert two.status == "completed"


async def test_a_tool_calls_limit_parks_before_dispatching_the_step(tmp_path: Path) -> None:
    script = Counted(calls=4, per_step=2)  # results of 2 calls not run count as done
    async with agent(tmp_path, script.model(), usage=UsageLimits(tool_calls_limit=1)) as a:
        parked = await a.run("two at once", session="s")
        assert parked.status == "parked" and RAN == []  # neither call ran
        assert parked.budget == BudgetReached(
            budget="tool_calls", limit=1, spent=2, unit="calls", scope="turn"
        )
        still = await a.resume("s")
        assert still.status == "parked" and script.requests == 1
    async with agent(tmp_path, script.model(), usage=UsageLimits(tool_calls_limit=2)) as a:
        done = await a.resume("s")
        events = await a.session("s").events()
    # the calls the park held back never ran: the model was told so, and called again
    assert done.status == "completed" and RAN == [2, 3] and script.requests == 3
    told = [e for e in events if isinstance(e.body, RecoveryObserved)]
    assert {e.body.reason for e in told if isinstance(e.body, RecoveryObserved)} == {
        "not_dispatched"
    }
    assert len(told) == 2


async def test_a_session_money_budget_prices_the_usage_facts(tmp_path: Path) -> None:
    script = Counted(calls=5)
    budgets = Budgets(session_usd="0.006", prices=PRICES)  # 6000 micro-USD: 3 requests
    async with agent(tmp_path, script.model(), budgets=budgets) as a:
        first = await a.run("one", session="s")
        assert first.status == "parked" and script.requests == 3
    assert first.budget == BudgetReached(
        budget="session_cost", limit=6000, spent=3 * PER_REQUEST, unit="micro_usd", scope="session"
    )
    assert "0.0075 USD" in (first.error or "") and "session_usd" in (first.error or "")
    raised = Budgets(session_usd="0.1", prices=PRICES)
    async with agent(tmp_path, script.model(), budgets=raised) as a:
        done = await a.resume("s")
    assert done.status == "completed" and script.requests == 6


async def test_a_daily_budget_counts_every_session_of_the_day_only(tmp_path: Path) -> None:
    clock = ManualClock(start_us=1_800_000_000_000_000)
    budgets = Budgets(daily_usd="0.005", prices=PRICES)  # two requests a day

    def on(script: Counted) -> Agent:
        return Agent(
            model=script.model(),
            tools=[add],
            storage=tmp_path,
            limits=Limits(budgets=budgets),
            services=Services(clock=clock),
        )

    async with on(Counted(calls=1)) as a:
        assert (await a.run("first", session="s1")).status == "completed"  # 2 requests
    second = Counted(calls=1)
    async with on(second) as a:
        parked = await a.run("second", session="s2")  # another session, the same day
        assert parked.status == "parked" and second.requests == 0
        assert parked.budget is not None and parked.budget.scope == "day"
        assert parked.budget.spent == 2 * PER_REQUEST
        clock.advance(86_400_000_000)  # the next UTC day: yesterday's spend is not today's
        assert (await a.resume("s2")).status == "completed"


def test_prices_are_exact_micro_usd_and_matched_by_prefix() -> None:
    table = PriceTable.defaults()
    # gpt-4.1: 2 / 0.5 / 8 USD per million
    assert table.cost("openai:gpt-4.1", Usage(input_tokens=1_000_000)) == 2_000_000
    assert table.cost("openai:gpt-4.1-2025-04-14", USAGE) == 2500  # a dated name
    assert table.price("openai:gpt-4.1-mini") != table.price("openai:gpt-4.1")
    assert table.cost("responses:gpt-4.1", USAGE) == 2500
    # a fallback chain's step is the first member's unless a model_switched says otherwise
    chain = "openai:gpt-4.1|anthropic:claude-sonnet-4"
    assert table.cost(chain, USAGE) == 2500
    with pytest.raises(ConfigError, match="'openai:gpt-9'"):
        table.require("openai:gpt-4.1|openai:gpt-9")
    # cache writes are priced as such where the provider charges more for them
    written = Usage(input_tokens=1000, cache_write_tokens=1000)
    assert table.cost("anthropic:claude-sonnet-4-20250514", written) == 3750
    assert table.cost("test:echo", USAGE) == 0 and table.cost("script:x.json", USAGE) == 0
    assert ModelPrice.of("0.1", 0, 0).cost(Usage(input_tokens=3)) == 1  # rounded up
    with pytest.raises(ConfigError, match="no price for model 'openai:gpt-9'") as caught:
        table.price("openai:gpt-9")
    assert caught.value.hint is not None and "budgets.prices" in caught.value.hint
    assert table.with_prices({"*": ModelPrice.of(1, 1, 1)}).cost("openai:gpt-9", USAGE) == 1100


def test_bad_limits_and_budgets_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="request_limit must be a whole number"):
        UsageLimits(request_limit=-1)
    with pytest.raises(ConfigError, match="session_usd must be an amount"):
        Budgets(session_usd="lots")
    with pytest.raises(ConfigError, match="output must be a price"):
        ModelPrice.of(1, 1, -2)
    assert Budgets(tree_usd=Decimal("1.5")).micro("tree_usd") == 1_500_000
    low = UsageLimits(request_limit=5).lowered(UsageLimits(request_limit=3, tool_calls_limit=9))
    assert low == UsageLimits(request_limit=3, tool_calls_limit=9)


class Named:
    """A model under another spec (one the price table does not know)."""

    def __init__(self, inner: FunctionModel, spec: str) -> None:
        self.inner, self.spec = inner, spec

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def complete(self, request: ModelRequest, **kw: Any) -> ModelResponse:
        return await self.inner.complete(request, **kw)


async def test_a_money_budget_on_a_model_without_a_price_fails_before_any_request(
    tmp_path: Path,
) -> None:
    script = Counted(calls=1)
    unpriced = Named(script.model(), "openai:gpt-9")
    budgets = Budgets(session_usd=1)
    with pytest.raises(ConfigError, match="no price for model 'openai:gpt-9'"):
        Agent(model=unpriced, tools=[add], storage=tmp_path, limits=Limits(budgets=budgets))
    # a change of limits after the agent was made is checked before the first request
    async with Agent(model=unpriced, tools=[add], storage=tmp_path) as a:
        a.engine.limits = Limits(budgets=budgets)
        with pytest.raises(ConfigError, match=r"budgets\.prices"):
            await a.run("go", session="s")
    assert script.requests == 0


def test_a_step_a_fallback_answered_is_priced_as_the_fallback() -> None:
    from lodger.engine.budgets import SpendFold, day_of
    from lodger.events import ModelOutput, ModelSwitched, StepStarted

    def at(offset: int, body: Any, origin: str = "runtime") -> Event:
        return Event(
            offset=offset, session_id="s", id=f"e{offset}", ts=offset, body=body,
            step_id="st", origin=origin,
        )  # fmt: skip

    chain = "function:priced|openai:gpt-4o"
    fold = SpendFold(PRICES)
    fold.feed([at(0, StepStarted(index=0, model=chain, tools=()))])
    switched = ModelSwitched(from_model="function:priced", to_model="openai:gpt-4o", error="503")
    fold.feed([at(1, switched), at(2, ModelOutput(usage=USAGE), origin="provider")])
    # gpt-4o: 800 * 2.5 + 200 * 1.25 + 100 * 10 = 3250 (the chain's first would be 2500)
    assert fold.total == 3250 and fold.by_day == {day_of(2): 3250}
    fold.feed([at(2, ModelOutput(usage=USAGE), origin="provider")])  # seen: not again
    assert fold.total == 3250 and fold.high_water == 3

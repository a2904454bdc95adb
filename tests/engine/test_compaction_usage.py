"""What a summary costs is in the log: ``compacted`` and ``compaction_failed`` carry the
usage of their summary requests, and the budgets read from the log count it."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from compaction_world import World, agent, policy

from lodger.engine.budgets import SpendFold
from lodger.engine.prices import ModelPrice, PriceTable
from lodger.errors import ProviderError
from lodger.events import Compacted, CompactionFailed, Usage
from lodger.providers.base import ModelRequest, ModelResponse

SUMMARY_USAGE = Usage(input_tokens=1_000, output_tokens=200)
ONE = Decimal(1_000_000)  # a dollar a token


class PricedWorld(World):
    """The compaction world whose summarizer reports what each summary request used."""

    def __call__(self, request: ModelRequest) -> ModelResponse | str:
        answer = super().__call__(request)
        if request.system.startswith("You are compacting") and isinstance(answer, str):
            return ModelResponse(text=answer, usage=SUMMARY_USAGE)
        return answer


async def test_a_summary_records_its_usage_and_the_spend_fold_prices_it(tmp_path: Path) -> None:
    world = PricedWorld(steps=6)
    async with agent(tmp_path / "state", world, policy()) as a:
        await a.run("read the pages", session="s")
        made = await a.compact("s")
        assert isinstance(made, Compacted)
        assert made.usage == SUMMARY_USAGE
        assert made.model == "function:world"
        events = await a.log.read_all("s")
    prices = PriceTable.defaults().with_prices(
        {"function:world": ModelPrice(input=ONE, cached_input=ONE, output=ONE)}
    )
    with_summary = SpendFold(prices)
    with_summary.feed(events)
    without = SpendFold(prices)
    without.feed(events[:-1])
    # 1,200 tokens at one dollar a token: 1,200 USD in micro-USD
    assert with_summary.total - without.total == 1_200 * 1_000_000


async def test_failed_attempts_count_as_requests_of_the_turn(tmp_path: Path) -> None:
    world = PricedWorld(steps=6)
    async with agent(tmp_path / "state", world, policy()) as a:
        await a.run("read the pages", session="s")
    world.summarizer = "bad"
    async with agent(tmp_path / "state", world, policy(max_attempts=2)) as a:
        with pytest.raises(ProviderError):
            await a.compact("s")
        events = await a.log.read_all("s")
    failed = events[-1].body
    assert isinstance(failed, CompactionFailed)
    assert failed.attempts == 2 and failed.model == "function:world"
    assert failed.usage == Usage(input_tokens=2_000, output_tokens=400)
    assert not any(isinstance(e.body, Compacted) and e.body.usage is None for e in events)

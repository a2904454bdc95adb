"""``LogSpend``, the reader of other sessions' spend: each log folded once, then only what
was appended since, and the same sums as a full read."""

from __future__ import annotations

from pathlib import Path

from lodger import Agent, FunctionModel
from lodger.engine.budgets import Budgets, SpendFold, day_of
from lodger.engine.prices import ModelPrice, PriceTable
from lodger.engine.settings import Limits, Services
from lodger.engine.state import SessionState
from lodger.events import Usage
from lodger.ids import ManualClock
from lodger.providers.base import ModelResponse
from lodger.runtime.spend import LogSpend
from lodger.storage import Storage

PRICES = PriceTable.defaults().with_prices({"function:priced": ModelPrice.of(2, "0.5", 8)})
USAGE = Usage(input_tokens=1000, cache_read_tokens=200, output_tokens=100)  # 2500 micro-USD


async def test_a_log_is_folded_once_and_then_read_from_where_it_stopped(tmp_path: Path) -> None:
    clock = ManualClock(start_us=1_800_000_000_000_000)
    storage = Storage.local(tmp_path)
    model = FunctionModel(lambda request: ModelResponse(text="ok", usage=USAGE), name="priced")
    agent = Agent(
        model=model,
        storage=storage,
        limits=Limits(budgets=Budgets(daily_usd=1, prices=PRICES)),
        services=Services(clock=clock),
    )
    reader = LogSpend.for_log(storage.log)
    assert LogSpend.for_log(storage.log) is reader  # one per log in the process
    elsewhere, today = SessionState("other"), day_of(clock.now_us())
    await agent.run("one", session="s1")
    assert await reader.day(SpendFold(PRICES), today, elsewhere, PRICES) == 2500
    await agent.run("two", session="s1")
    await agent.run("three", session="s2")
    folded = reader._folds["s1"].high_water
    assert folded == len(await storage.log.read_all("s1"))
    assert await reader.day(SpendFold(PRICES), today, elsewhere, PRICES) == 3 * 2500
    # the same sums as a reader that reads everything afresh
    fresh = LogSpend(storage.log)
    assert await fresh.day(SpendFold(PRICES), today, elsewhere, PRICES) == 3 * 2500
    assert await fresh.day(SpendFold(PRICES), today + 1, elsewhere, PRICES) == 0
    await agent.close()
    await storage.close()

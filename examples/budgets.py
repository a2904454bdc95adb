"""Usage limits and money budgets: a reached one parks the turn (never ends it); raise it
and resume, and the same turn goes on as a new run, nothing run twice.

    python examples/budgets.py
"""

import asyncio
import tempfile

from lodger import (
    Agent,
    Budgets,
    FunctionModel,
    Limits,
    ModelPrice,
    ModelRequest,
    ModelResponse,
    PriceTable,
    ToolResultMessage,
    UsageLimits,
    tool,
    tool_call,
)
from lodger.events import Usage


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def model(request: ModelRequest) -> ModelResponse:
    # every request reports 1000 input tokens (200 from the prompt cache) and 100 output
    usage = Usage(input_tokens=1000, cache_read_tokens=200, output_tokens=100)
    done = [m for m in request.messages if isinstance(m, ToolResultMessage)]
    if len(done) < 3:
        return ModelResponse(calls=(tool_call("add", a=len(done), b=1),), usage=usage)
    return ModelResponse(text=f"the last sum is {done[-1].content}", usage=usage)


# USD per million tokens: 800 * 2 + 200 * 0.5 + 100 * 8 = 2500 micro-USD a request
prices = PriceTable.defaults().with_prices({"function:mine": ModelPrice.of(2, "0.5", 8)})


def agent(state: str, limits: Limits) -> Agent:
    return Agent(model=FunctionModel(model, name="mine"), tools=[add], storage=state, limits=limits)


async def main(state: str) -> None:
    tight = Limits(budgets=Budgets(session_usd="0.005", prices=prices))  # two requests
    async with agent(state, tight) as first:
        parked = await first.run("add three times", session="s")
    assert parked.status == "parked" and parked.budget is not None, parked
    print(parked.status, parked.budget.budget, parked.budget.spent, parked.budget.unit)
    print(parked.error)

    # another agent (or process, or worker) reads the spend from the log: raise and resume
    raised = Limits(
        usage=UsageLimits(request_limit=10), budgets=Budgets(session_usd="0.05", prices=prices)
    )
    async with agent(state, raised) as second:
        done = await second.resume("s")
    assert done.status == "completed" and done.turn_id == parked.turn_id, done
    print(done.status, repr(done.answer), f"after {len(done.usage.requests)} requests")


with tempfile.TemporaryDirectory() as state:
    asyncio.run(main(state))

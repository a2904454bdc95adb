"""The agent of the budget crash test, run in a child process
(``python budget_world.py STATE MODE``): one priced request asks for ``hold``, then the
turn answers. ``crash`` SIGKILLs the process inside ``hold`` (the request's usage and the
call's T1 committed, no T2); ``none`` runs on (the resume, in the test's process).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from lodger import Agent, FunctionModel, tool
from lodger.engine.budgets import Budgets
from lodger.engine.prices import ModelPrice, PriceTable
from lodger.engine.settings import Limits
from lodger.events import Usage
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import tool_call

PRICES = PriceTable.defaults().with_prices({"function:priced": ModelPrice.of(2, "0.5", 8)})
#: 800 * 2 + 200 * 0.5 + 100 * 8 = 2500 micro-USD a request
USAGE = Usage(input_tokens=1000, cache_read_tokens=200, output_tokens=100)
PER_REQUEST = 2500


def budget_agent(state: Path, mode: str, budgets: Budgets | None = None) -> Agent:
    @tool(recovery="idempotent")
    def hold() -> str:
        """Wait here (safe to run again)."""
        if mode == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        return "held"

    def step(request: ModelRequest) -> ModelResponse:
        if any(isinstance(m, ToolResultMessage) for m in request.messages):
            return ModelResponse(text="done", usage=USAGE)
        return ModelResponse(calls=(tool_call("hold"),), usage=USAGE)

    return Agent(
        model=FunctionModel(step, name="priced"),
        tools=[hold],
        storage=state,
        limits=Limits(budgets=budgets or Budgets(prices=PRICES)),
    )


async def _main(state: Path, mode: str) -> None:
    async with budget_agent(state, mode) as agent:
        await agent.run("go", session="s")


if __name__ == "__main__":
    asyncio.run(_main(Path(sys.argv[1]), sys.argv[2]))

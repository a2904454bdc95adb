"""A turn whose store, model and tools never wait still lets other tasks run each step."""

from __future__ import annotations

import asyncio
import json

from lodger import Agent, FunctionModel, tool
from lodger.engine.settings import Limits
from lodger.events import ProposedCall
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.storage import EventLog, MemoryLogStore, Storage
from lodger.storage.artifacts import MemoryArtifactStore

STEPS = 40


@tool
async def instant(data: str) -> str:
    """Answer at once."""
    return data


async def test_an_in_memory_turn_gives_the_loop_away_every_step() -> None:
    left = [STEPS]

    def step(request: ModelRequest) -> ModelResponse:
        if left[0] == 0:
            return ModelResponse(text="done")
        left[0] -= 1
        arguments = json.dumps({"data": "x"})
        return ModelResponse(calls=(ProposedCall(call_id="", name="instant", arguments=arguments),))

    log = EventLog(MemoryLogStore())
    agent = Agent(
        model=FunctionModel(step),
        tools=[instant],
        storage=Storage(log=log, artifacts=MemoryArtifactStore()),
        limits=Limits(max_steps=STEPS + 1),
    )
    turn = asyncio.create_task(agent.run("go"))
    ticks = 0
    while not turn.done():
        ticks += 1
        await asyncio.sleep(0)
    assert (await turn).status == "completed"
    assert ticks >= STEPS  # at least one turn of the loop for others per step
    await log.close()

"""Between any two model steps other tasks get the event loop, whatever the store.

A step yields on its own only when none of its commits waited for the store (the
memory twin never waits; SQLite commits wait for the I/O thread, and other tasks run
then). Either way a task that counts its turns must have moved between two requests.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import pytest

from lodger import Agent, FunctionModel, tool
from lodger.engine.settings import Limits
from lodger.events import ProposedCall
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.storage import EventLog, MemoryLogStore, SqliteLogStore, Storage
from lodger.storage.artifacts import MemoryArtifactStore

STEPS = 12


@tool
async def instant(data: str) -> str:
    """Answer at once."""
    return data


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_other_tasks_move_between_every_two_steps(store: str, tmp_path: Path) -> None:
    ticks = [0]
    seen: list[int] = []

    def step(request: ModelRequest) -> ModelResponse:
        seen.append(ticks[0])
        if len(seen) > STEPS:
            return ModelResponse(text="done")
        arguments = json.dumps({"data": "x"})
        return ModelResponse(calls=(ProposedCall(call_id="", name="instant", arguments=arguments),))

    log = EventLog(MemoryLogStore() if store == "memory" else SqliteLogStore(tmp_path))
    agent = Agent(
        model=FunctionModel(step),
        tools=[instant],
        storage=Storage(log=log, artifacts=MemoryArtifactStore()),
        limits=Limits(max_steps=STEPS + 1),
    )
    turn = asyncio.create_task(agent.run("go"))
    while not turn.done():
        ticks[0] += 1
        await asyncio.sleep(0)
    assert (await turn).status == "completed"
    assert len(seen) == STEPS + 1
    assert all(a < b for a, b in itertools.pairwise(seen)), seen
    await log.close()

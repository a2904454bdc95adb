"""The agent of the steering crash test, run in a child process
(``python steer_world.py STATE MODE``): the turn's one call sends a steer while it runs,
then the next step delivers it. ``before`` SIGKILLs the process as the
``steer_delivered`` append is about to be written, ``after`` once it is committed;
``none`` kills nothing (the resume, in the test's process, uses it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from lodger import Agent, FunctionModel, tool
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage, UserMessage
from lodger.providers.scripted import tool_call
from lodger.storage import EventLog, Storage
from lodger.storage.logstore import ForwardingLogStore, LogStore, Record
from lodger.storage.sqlite import SqliteLogStore
from lodger.testing import MemoryArtifactStore

STEER = "turn left at the next file"


class KillAtDelivery(ForwardingLogStore):
    """SIGKILL this process around the append that holds ``steer_delivered``."""

    def __init__(self, inner: LogStore, mode: str) -> None:
        super().__init__(inner)
        self.mode = mode

    async def append_records(
        self, *, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        delivering = any(json.loads(r.data)["body"]["kind"] == "steer_delivered" for r in records)
        if delivering and self.mode == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        await self.inner.append_records(
            session_id=session_id, records=records, expected_offset=expected_offset
        )
        if delivering and self.mode == "after":
            os.kill(os.getpid(), signal.SIGKILL)


def steers_seen(request: ModelRequest) -> list[str]:
    return [m.text for m in request.messages if isinstance(m, UserMessage) and m.source == "steer"]


def steer_agent(state: Path, mode: str, requests: list[ModelRequest] | None = None) -> Agent:
    seen = requests if requests is not None else []
    holder: list[Agent] = []

    @tool(recovery="idempotent")
    async def hold() -> str:
        """Work a while (safe to run again)."""
        if mode != "none":
            await holder[0].steer("s", STEER, who="test")  # sent while this call runs
        return "held"

    def step(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        if any(isinstance(m, ToolResultMessage) for m in request.messages):
            return ModelResponse(text="done: " + " | ".join(steers_seen(request)))
        return ModelResponse(calls=(tool_call("hold"),))

    store: LogStore = SqliteLogStore(state)
    if mode != "none":
        store = KillAtDelivery(store, mode)
    agent = Agent(
        model=FunctionModel(step),
        tools=[hold],
        storage=Storage(log=EventLog(store), artifacts=MemoryArtifactStore()),
    )
    holder.append(agent)
    return agent


async def _main(state: Path, mode: str) -> None:
    async with steer_agent(state, mode) as agent:
        await agent.run("go", session="s")


if __name__ == "__main__":
    asyncio.run(_main(Path(sys.argv[1]), sys.argv[2]))

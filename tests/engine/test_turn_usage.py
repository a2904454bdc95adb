"""A turn's usage counts its own model requests: not the session's earlier turns, and
every run of it (a resumed turn counts the requests of the run that was interrupted).

The engine reads them from the turn's own events, starting at its ``turn_started``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from lodger import Agent, FunctionModel, tool
from lodger.errors import CommitFailedError
from lodger.events import Usage
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import tool_call
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.storage.logstore import Record
from lodger.testing import FaultyLogStore, MemoryArtifactStore


@tool(recovery="idempotent")
async def add(a: int, b: int) -> int:
    """Add two numbers (safe to run again: a resume re-runs it)."""
    return a + b


def counting_model(tokens: list[int]) -> FunctionModel:
    """Calls ``add`` once per turn, then answers; request n reports ``tokens[n]`` in."""
    seen = [0]

    def step(request: ModelRequest) -> ModelResponse:
        usage = Usage(input_tokens=tokens[seen[0]], output_tokens=1)
        seen[0] += 1
        last = request.messages[-1] if request.messages else None
        if isinstance(last, ToolResultMessage):
            return ModelResponse(text="done", usage=usage)
        return ModelResponse(calls=(tool_call("add", a=1, b=2),), usage=usage)

    return FunctionModel(step)


def agent_on(log: EventLog, model: FunctionModel) -> Agent:
    return Agent(
        model=model, tools=[add], storage=Storage(log=log, artifacts=MemoryArtifactStore())
    )


async def test_a_second_turn_counts_only_its_own_requests(tmp_path: Path) -> None:
    log = EventLog(SqliteLogStore(tmp_path))
    agent = agent_on(log, counting_model([1, 2, 30, 40]))
    first = await agent.run("one", session="s")
    second = await agent.run("two", session="s")
    assert [u.input_tokens for u in first.usage.requests] == [1, 2]
    assert [u.input_tokens for u in second.usage.requests] == [30, 40]
    await agent.close()


class FailT2Once:
    def __init__(self) -> None:
        self.done = False

    def __call__(self, records: Sequence[Record]) -> bool:
        if not self.done and any(b'"kind":"tool_responded"' in r.data for r in records):
            self.done = True
            return True
        return False


async def test_a_resumed_turn_counts_the_requests_of_its_interrupted_run(
    tmp_path: Path,
) -> None:
    store = FaultyLogStore(SqliteLogStore(tmp_path), fail_when=FailT2Once())
    agent = agent_on(EventLog(store), counting_model([5, 7]))
    with pytest.raises(CommitFailedError):
        await agent.run("go", session="s")  # T2 fails: the turn stays open after request 1
    await agent.close()
    again = agent_on(EventLog(SqliteLogStore(tmp_path)), counting_model([70]))
    result = await again.resume("s")
    assert result.status == "completed"
    assert [u.input_tokens for u in result.usage.requests] == [5, 70]
    await again.close()

"""A fork's model context: the parent's history up to the fork point, then the fork's own.

The model is a FunctionModel that records every request, on SQLite and on the object
store; the parent's events are never copied into the fork, only read and checked.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lodger import Agent, FunctionModel, tool
from lodger.context import project_messages
from lodger.engine.settings import Services
from lodger.errors import CorruptLogError
from lodger.events import ProposedCall, TurnEnded
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import (
    AssistantMessage,
    Message,
    ModelRequest,
    ModelResponse,
    ToolResultMessage,
    UserMessage,
)
from lodger.storage import Storage
from lodger.storage.forks import fork_session, read_lineage
from lodger.storage.objectstore import ObjectLogStore
from lodger.testing.log_conformance import (
    LogBackend,
    ObjectStoreBackend,
    SqliteBackend,
    rechain,
)


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


class Recorder:
    """Answers each user input: a lookup call first (with a call id the parent used too),
    then text naming the input; records the messages of every request."""

    def __init__(self) -> None:
        self.requests: list[tuple[Message, ...]] = []

    def __call__(self, request: ModelRequest) -> ModelResponse:
        messages = tuple(request.messages)
        self.requests.append(messages)
        last = messages[-1]
        if isinstance(last, UserMessage):
            call = ProposedCall(call_id="c1", name="lookup", arguments=json.dumps({"key": "k"}))
            return ModelResponse(calls=(call,))
        asked = next(m.text for m in reversed(messages) if isinstance(m, UserMessage))
        return ModelResponse(text=f"answer to {asked}")


def texts(messages: tuple[Message, ...]) -> list[str]:
    out: list[str] = []
    for m in messages:
        if isinstance(m, UserMessage):
            out.append(f"user: {m.text}")
        elif isinstance(m, AssistantMessage):
            out.append(f"assistant: {m.text}" if m.text else f"calls: {len(m.calls)}")
        elif isinstance(m, ToolResultMessage):
            out.append(f"result: {m.content}")
    return out


@pytest.fixture(params=["sqlite", "objects-file"])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    if request.param == "sqlite":
        made = Storage.local(tmp_path / "state")
    else:
        made = Storage.from_url(f"file://{tmp_path / 'objects'}")
    yield made
    await made.close()


def agent(storage: Storage, recorder: Recorder, prefix: str) -> Agent:
    return Agent(
        model=FunctionModel(recorder),
        tools=[lookup],
        storage=storage,
        services=Services(clock=ManualClock(tick_us=1), ids=SequentialIds(prefix)),
    )


TURN_ONE = ["user: one", "calls: 1", "result: value of k", "assistant: answer to one"]
TURN_TWO = ["user: two", "calls: 1", "result: value of k", "assistant: answer to two"]


async def _parent(storage: Storage) -> int:
    """Two turns on the parent; returns the offset just after the first turn's end."""
    parent = agent(storage, Recorder(), "p")
    await parent.run("one", session="parent")
    await parent.run("two", session="parent")
    events = await storage.log.read_all("parent")
    return next(e.offset for e in events if isinstance(e.body, TurnEnded)) + 1


async def test_a_fork_sees_the_parent_history_up_to_the_fork_point(storage: Storage) -> None:
    after_turn_one = await _parent(storage)
    await fork_session(
        storage.log,
        "parent",
        fork_id="fork",
        at=after_turn_one,
        clock=ManualClock(),
        ids=SequentialIds("f"),
    )
    recorder = Recorder()
    result = await agent(storage, recorder, "x").run("three", session="fork")
    assert result.answer == "answer to three"
    # the first request of the fork's turn: turn one of the parent, not turn two
    assert texts(recorder.requests[0]) == [*TURN_ONE, "user: three"]
    assert texts(result.messages) == [
        *TURN_ONE,
        "user: three",
        "calls: 1",
        "result: value of k",
        "assistant: answer to three",
    ]
    # the fork's call got a fresh id: "c1" is the parent's, and results pair by id
    fork_calls = [m for m in result.messages if isinstance(m, AssistantMessage) and m.calls]
    assert fork_calls[0].calls[0].call_id == "c1" and fork_calls[1].calls[0].call_id != "c1"
    # the same context as projecting the whole lineage at once
    lineage = await read_lineage(storage.log, "fork")
    assert tuple(result.messages) == tuple(project_messages(lineage.events).messages)
    # the parent's own next turn does not see the fork's
    parent_recorder = Recorder()
    await agent(storage, parent_recorder, "q").run("four", session="parent")
    assert texts(parent_recorder.requests[0]) == [*TURN_ONE, *TURN_TWO, "user: four"]


async def test_a_fresh_agent_and_a_fork_of_a_fork_see_every_ancestor(storage: Storage) -> None:
    await _parent(storage)
    clock, ids = ManualClock(), SequentialIds("f")
    await fork_session(storage.log, "parent", fork_id="child", clock=clock, ids=ids)
    await agent(storage, Recorder(), "c").run("three", session="child")
    await fork_session(storage.log, "child", fork_id="grandchild", clock=clock, ids=ids)
    # a new agent (a new process would be the same) reads the lineage from storage
    recorder = Recorder()
    await agent(storage, recorder, "g").run("four", session="grandchild")
    three = ["user: three", "calls: 1", "result: value of k", "assistant: answer to three"]
    assert texts(recorder.requests[0]) == [*TURN_ONE, *TURN_TWO, *three, "user: four"]
    # a second turn on the same agent keeps the inherited history
    again = agent(storage, Recorder(), "h")
    await again.run("five", session="grandchild")
    result = await again.run("six", session="grandchild")
    assert texts(result.messages)[: len(TURN_ONE) + len(TURN_TWO)] == [*TURN_ONE, *TURN_TWO]
    assert texts(result.messages)[-4:] == [
        "user: six",
        "calls: 1",
        "result: value of k",
        "assistant: answer to six",
    ]


async def test_a_fork_inside_an_open_call_strips_the_dangling_call(storage: Storage) -> None:
    await _parent(storage)
    events = await storage.log.read_all("parent")
    # fork right after the first T1: the call has no response in the shared prefix
    t1 = next(e.offset for e in events if e.kind == "tool_dispatched")
    await fork_session(
        storage.log, "parent", fork_id="fork", at=t1 + 1, clock=ManualClock(), ids=SequentialIds()
    )
    recorder = Recorder()
    await agent(storage, recorder, "x").run("three", session="fork")
    # the parent's open turn: its input, and its output with the dangling call stripped
    # (as the projection strips it after a crash), no result
    assert texts(recorder.requests[0]) == ["user: one", "calls: 0", "user: three"]


async def test_a_changed_parent_prefix_fails_the_fork_before_the_model_runs(
    storage: Storage,
) -> None:
    after_turn_one = await _parent(storage)
    await fork_session(
        storage.log,
        "parent",
        fork_id="fork",
        at=after_turn_one,
        clock=ManualClock(),
        ids=SequentialIds("f"),
    )
    # the parent's first input is edited and the chain and head recomputed, so the
    # parent verifies on its own: only the digest the fork recorded can tell
    back_door = _back_door(storage)
    records = back_door.stored("parent")
    first = next(r for r in records if b'"input":"one"' in r.data)
    rechain(back_door, "parent", first.offset, first.data.replace(b'"one"', b'"ONE"'))
    back_door.set_head("parent", (len(records), back_door.stored("parent")[-1].digest))
    assert (await storage.log.verify("parent")).high_water == len(records)
    recorder = Recorder()
    with pytest.raises(CorruptLogError) as info:
        await agent(storage, recorder, "x").run("three", session="fork")
    assert (info.value.session_id, info.value.offset, info.value.code) == (
        "fork",
        0,
        "digest_mismatch",
    )
    assert recorder.requests == []  # nothing ran on a history that does not check out
    await back_door.aclose()


def _back_door(storage: Storage) -> LogBackend:
    store = storage.log.store
    if isinstance(store, ObjectLogStore):
        return ObjectStoreBackend(lambda: store.store)
    assert storage.state_dir is not None
    return SqliteBackend(storage.state_dir)

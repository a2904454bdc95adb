"""Steering a running turn and the follow-up queue, through the library, on real SQLite.

Every interleaving is forced with events (a tool that waits on a gate), never by sleeping.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lodger import Agent, FunctionModel, tool
from lodger.context import project_messages
from lodger.engine.queue import queued_messages
from lodger.errors import HostConflictError, UsageError
from lodger.events import (
    MessageQueued,
    QueueChanged,
    SteerDelivered,
    SteerReceived,
    StepStarted,
    TurnEnded,
    TurnStarted,
)
from lodger.providers.base import ModelRequest, ModelResponse, UserMessage
from lodger.providers.scripted import tool_call
from lodger.runtime.streaming import FactCommitted
from lodger.storage import Storage


class Gate:
    """A tool that tells when it runs and waits until the test lets it finish."""

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.release = asyncio.Event()
        self.runs = 0

    def tool(self):  # type: ignore[no-untyped-def]
        @tool
        async def wait_here(label: str) -> str:
            """Wait at the gate."""
            self.runs += 1
            self.running.set()
            await self.release.wait()
            return f"done {label}"

        return wait_here


def _steers_seen(request: ModelRequest) -> list[str]:
    return [m.text for m in request.messages if isinstance(m, UserMessage) and m.source == "steer"]


class CallsThenAnswers:
    """Step 0 (of each turn) calls the gate; later steps answer with the steers seen."""

    def __init__(self, calls: int = 1) -> None:
        self.requests: list[ModelRequest] = []
        self.calls = calls

    def __call__(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        outputs = 0
        for m in reversed(request.messages):
            if isinstance(m, UserMessage) and m.source == "input":
                break
            outputs += type(m).__name__ == "AssistantMessage"
        if outputs < self.calls:
            return ModelResponse(calls=(tool_call("wait_here", label=str(outputs)),))
        return ModelResponse(text="answer: " + " | ".join(_steers_seen(request)))


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage.local(tmp_path / "state")


async def test_a_steer_sent_while_a_tool_runs_is_in_the_next_request_with_its_step(
    storage: Storage,
) -> None:
    gate, script = Gate(), CallsThenAnswers()
    agent = Agent(model=FunctionModel(script), tools=[gate.tool()], storage=storage)
    turn = asyncio.create_task(agent.run("start", session="s1"))
    await gate.running.wait()  # the step's call is past T1 and running
    assert agent.busy("s1")
    steered = await agent.steer("s1", "use the other file", who="cli:ana")
    assert steered.status == "steer"
    gate.release.set()
    result = await turn
    assert result.status == "completed"
    assert result.answer == "answer: use the other file"
    # the first request had no steer; the second (step 1) carried it
    assert [_steers_seen(r) for r in script.requests] == [[], ["use the other file"]]
    events = await agent.log.read_all("s1")
    received = [e for e in events if isinstance(e.body, SteerReceived)]
    delivered = [e for e in events if isinstance(e.body, SteerDelivered)]
    assert len(received) == 1 and received[0].body.who == "cli:ana"
    assert received[0].offset == steered.offset
    assert len(delivered) == 1
    body = delivered[0].body
    assert isinstance(body, SteerDelivered)
    assert body.steer_ids == (steered.steer_id,) and body.step == 1
    # delivered before step 1's request: right after step 1 started
    step1 = next(e for e in events if isinstance(e.body, StepStarted) and e.body.index == 1)
    assert delivered[0].offset == step1.offset + 1
    assert delivered[0].step_id == step1.step_id
    # a pure function of the log: a full projection shows it where the step read it
    projected = project_messages(events).messages
    assert [m.text for m in projected if isinstance(m, UserMessage)] == [
        "start",
        "use the other file",
    ]
    assert tuple(projected) == tuple(result.messages)[: len(projected)]
    await agent.log.verify("s1")
    await agent.close()
    await storage.close()


async def test_a_steer_with_no_turn_running_is_the_next_turn(storage: Storage) -> None:
    agent = Agent(model=FunctionModel(lambda r: "ok"), storage=storage)
    await agent.run("first", session="s1")
    steered = await agent.steer("s1", "and then this")
    assert steered.status == "queued"
    queue = await agent.queue("s1")
    assert [m.text for m in queue] == ["and then this"]
    result = await agent.run_queued("s1")
    assert result is not None and result.status == "completed"
    assert await agent.queue("s1") == []
    assert await agent.run_queued("s1") is None
    events = await agent.log.read_all("s1")
    started = [e for e in events if isinstance(e.body, TurnStarted)]
    assert [e.body.input for e in started] == ["first", "and then this"]  # type: ignore[union-attr]
    # the delivery commits with the turn it became: right after its turn_started
    delivered = events[started[1].offset + 1].body
    assert isinstance(delivered, QueueChanged) and delivered.action == "delivered"
    assert delivered.message_id == steered.steer_id
    await agent.close()
    await storage.close()


async def test_a_steer_after_the_last_step_becomes_the_next_turn(storage: Storage) -> None:
    """The steer lands while the final answer is being asked for: no step is left to
    carry it, so it commits as the next turn's input with the turn's end."""
    asked = asyncio.Event()
    answer = asyncio.Event()

    async def model(request: ModelRequest) -> ModelResponse:
        asked.set()
        await answer.wait()
        return ModelResponse(text="done")

    agent = Agent(model=FunctionModel(model), storage=storage)
    turn = asyncio.create_task(agent.run("go", session="s1"))
    await asked.wait()
    steered = await agent.steer("s1", "too late for this turn")
    assert steered.status == "steer"  # the turn was still running when it arrived
    answer.set()
    assert (await turn).status == "completed"
    events = await agent.log.read_all("s1")
    ended = next(e for e in events if isinstance(e.body, TurnEnded))
    queued = events[ended.offset + 1].body
    assert isinstance(queued, MessageQueued) and queued.message_id == steered.steer_id
    assert not any(isinstance(e.body, SteerDelivered) for e in events)
    assert [m.text for m in await agent.queue("s1")] == ["too late for this turn"]
    await agent.close()
    await storage.close()


async def test_queue_edit_move_retract_with_authors(storage: Storage) -> None:
    agent = Agent(model=FunctionModel(lambda r: "ok"), storage=storage)
    await agent.run("first", session="s1")
    a = await agent.enqueue("s1", "a", who="ana")
    b = await agent.enqueue("s1", "b", who="bo")
    c = await agent.enqueue("s1", "c", who="bo")
    await agent.edit_queued("s1", b.message_id, text="B", who="ana")
    queue = await agent.edit_queued("s1", c.message_id, position=0, who="bo")
    assert [m.text for m in queue] == ["c", "a", "B"]
    queue = await agent.retract_queued("s1", a.message_id, who="ana")
    assert [m.text for m in queue] == ["c", "B"]
    with pytest.raises(UsageError) as raised:
        await agent.retract_queued("s1", a.message_id)
    assert raised.value.code == "not_queued"
    with pytest.raises(UsageError) as raised:
        await agent.enqueue("s1", "x", policy="sometimes")
    assert raised.value.code == "queue_policy"
    with pytest.raises(UsageError) as raised:
        await agent.steer("s1", "")
    assert raised.value.code == "empty_message"
    events = await agent.log.read_all("s1")
    changes = [e.body for e in events if isinstance(e.body, QueueChanged)]
    assert [(c.action, c.who) for c in changes] == [
        ("edit", "ana"),
        ("move", "bo"),
        ("retract", "ana"),
    ]
    assert [m.text for m in queued_messages(events)] == ["c", "B"]
    # the queue drains in order, each message once
    assert (await agent.run_queued("s1")) is not None
    assert (await agent.run_queued("s1")) is not None
    assert (await agent.run_queued("s1")) is None
    events = await agent.log.read_all("s1")
    inputs = [e.body.input for e in events if isinstance(e.body, TurnStarted)]  # type: ignore[union-attr]
    assert inputs == ["first", "c", "B"]
    await agent.close()
    await storage.close()


async def _running(agent: Agent, gate: Gate, task: str = "start") -> asyncio.Task[object]:
    turn = asyncio.create_task(agent.run(task, session="s1"))
    await gate.running.wait()
    return turn


async def test_policies_under_two_senders(storage: Storage) -> None:
    """Two senders while one turn runs: reject is refused, enqueue waits its turn,
    interrupt stops the turn once its calls settled and runs before the enqueued one."""
    gate, script = Gate(), CallsThenAnswers(calls=2)
    agent = Agent(model=FunctionModel(script), tools=[gate.tool()], storage=storage)
    turn = await _running(agent, gate)
    with pytest.raises(HostConflictError) as raised:
        await agent.enqueue("s1", "refused", policy="reject", who="bo")
    assert raised.value.code == "session_busy"
    waiting = await agent.enqueue("s1", "later", who="ana")
    urgent = await agent.enqueue("s1", "now", policy="interrupt", who="bo")
    assert [m.message_id for m in await agent.queue("s1")] == [
        urgent.message_id,
        waiting.message_id,
    ]
    gate.release.set()
    result = await turn
    assert result.status == "cancelled"  # type: ignore[attr-defined]
    assert gate.runs == 1  # the call in flight settled; no second step was asked for
    events = await agent.log.read_all("s1")
    ended = [e.body for e in events if isinstance(e.body, TurnEnded)]
    assert ended[-1].reason == f"interrupted for queued message {urgent.message_id}"
    # the interrupting message runs next, then the enqueued one
    gate.release.clear()
    gate.release.set()
    first = await agent.run_queued("s1")
    second = await agent.run_queued("s1")
    assert first is not None and second is not None
    events = await agent.log.read_all("s1")
    inputs = [e.body.input for e in events if isinstance(e.body, TurnStarted)]  # type: ignore[union-attr]
    assert inputs == ["start", "now", "later"]
    assert await agent.queue("s1") == []
    await agent.log.verify("s1")
    await agent.close()
    await storage.close()


async def test_rollback_abandons_the_turn_before_its_next_calls(storage: Storage) -> None:
    """A rollback sent while the model is asked: the calls it proposes never start."""
    gate, script = Gate(), CallsThenAnswers(calls=3)
    asked_again, answer = asyncio.Event(), asyncio.Event()

    async def model(request: ModelRequest) -> ModelResponse:
        if script.requests:  # the second request waits for the test
            asked_again.set()
            await answer.wait()
        return script(request)

    agent = Agent(model=FunctionModel(model), tools=[gate.tool()], storage=storage)
    gate.release.set()  # the first call finishes at once
    turn = asyncio.create_task(agent.run("start", session="s1"))
    await asked_again.wait()
    other = await agent.enqueue("s1", "instead", policy="rollback", who="ana")
    answer.set()
    result = await turn
    assert result.status == "abandoned"
    # the second step proposed a call, and it never started
    assert gate.runs == 1 and len(script.requests) == 2
    events = await agent.log.read_all("s1")
    ended = [e.body for e in events if isinstance(e.body, TurnEnded)]
    assert ended[-1].status == "abandoned"
    assert ended[-1].reason == f"rolled back for queued message {other.message_id}"
    assert (await agent.run_queued("s1")) is not None
    events = await agent.log.read_all("s1")
    inputs = [e.body.input for e in events if isinstance(e.body, TurnStarted)]  # type: ignore[union-attr]
    assert inputs == ["start", "instead"]
    await agent.log.verify("s1")
    await agent.close()
    await storage.close()


async def test_the_stream_handle_steers_its_turn(storage: Storage) -> None:
    gate, script = Gate(), CallsThenAnswers()
    agent = Agent(model=FunctionModel(script), tools=[gate.tool()], storage=storage)
    kinds: list[str] = []
    async with agent.stream("start", session="s1") as stream:
        assert stream.session_id == "s1"
        async for item in stream:
            if isinstance(item, FactCommitted):
                kinds.append(item.event.kind)
                if item.event.kind == "tool_dispatched":
                    await gate.running.wait()
                    steered = await stream.steer("from the stream", who="me")
                    assert steered.status == "steer"
                    gate.release.set()
    assert stream.result.answer == "answer: from the stream"
    assert kinds.index("steer_received") < kinds.index("tool_responded")
    assert "steer_delivered" in kinds
    await agent.close()
    await storage.close()

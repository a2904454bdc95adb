"""Deferred tools and tool_search through the agent loop, over a real SQLite log."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from lodger.engine.envelope import Envelope
from lodger.engine.settings import Services
from lodger.engine.state import SessionState
from lodger.errors import CommitFailedError
from lodger.events import (
    CallRejected,
    Event,
    ProposedCall,
    RunStarted,
    StepStarted,
    ToolDispatched,
    ToolResponded,
    ToolsActivated,
)
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import FunctionModel
from lodger.runtime.agent import DEFAULT_SYSTEM, Agent
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.storage.logstore import LogStore
from lodger.testing import FaultyLogStore, MemoryArtifactStore
from lodger.tools import Tool, tool


class World:
    """The deferred tools' effects, counted outside the log."""

    def __init__(self) -> None:
        self.effects: list[str] = []

    def tools(self) -> list[Tool]:
        @tool
        def echo(text: str) -> str:
            """Echo the text back."""
            return text

        @tool(name="weather__forecast", group="weather", deferred=True)
        def forecast(city: str) -> str:
            """Forecast tomorrow's weather for a city."""
            self.effects.append(f"forecast:{city}")
            return f"sunny in {city}"

        @tool(name="git__git_log", group="git", deferred=True)
        def git_log(limit: int = 5) -> str:
            """Show the commit history of the repository."""
            self.effects.append("git_log")
            return "abc123 first commit"

        @tool(name="git__git_reset", group="git", deferred=True, approval=True)
        def git_reset() -> str:
            """Unstage all staged changes."""
            self.effects.append("git_reset")
            return "reset"

        return [echo, forecast, git_log, git_reset]


def call(call_id: str, name: str, arguments: str = "{}") -> ProposedCall:
    return ProposedCall(call_id=call_id, name=name, arguments=arguments)


class Script:
    """A model that answers step ``i`` with ``steps[i]`` and keeps every request."""

    def __init__(self, *steps: tuple[ProposedCall, ...]) -> None:
        self.steps = steps
        self.requests: list[ModelRequest] = []

    def __call__(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        index = len(self.requests) - 1
        if index < len(self.steps):
            return ModelResponse(calls=self.steps[index])
        return ModelResponse(text="done")

    def tools(self, index: int) -> list[str]:
        return [t.name for t in self.requests[index].tools]

    def results(self, index: int) -> dict[str, ToolResultMessage]:
        messages = self.requests[index].messages
        return {m.call_id: m for m in messages if isinstance(m, ToolResultMessage)}


def make_agent(tmp_path: Path, script: Script, tools: list[Tool], **kw: object) -> Agent:
    store = kw.pop("store", None) or SqliteLogStore(tmp_path / "state")
    return Agent(
        model=FunctionModel(script),
        tools=tools,
        storage=Storage(log=EventLog(store), artifacts=MemoryArtifactStore()),
        services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds("id")),
        **kw,  # type: ignore[arg-type]
    )


def of_kind(events: list[Event], kind: type) -> list[Event]:
    return [e for e in events if isinstance(e.body, kind)]


SEARCH_FORECAST = call("s1", "tool_search", '{"query": "weather forecast for a city"}')


async def test_first_request_has_inventory_and_tool_search_but_no_deferred_schema(
    tmp_path: Path,
) -> None:
    script = Script()
    agent = make_agent(tmp_path, script, World().tools())
    await agent.run("hi", session="s")
    first = script.requests[0]
    assert script.tools(0) == ["echo", "tool_search"]
    assert first.system.startswith(DEFAULT_SYSTEM)
    inventory = first.system[len(DEFAULT_SYSTEM) :]
    # Names and groups only, groups and names sorted: a stable prompt prefix.
    assert inventory.splitlines()[-2:] == [
        "- git: git__git_log, git__git_reset",
        "- weather: weather__forecast",
    ]
    assert "Forecast tomorrow" not in first.system  # no descriptions, no schemas
    await agent.close()


async def test_no_tool_search_and_no_inventory_without_deferred_tools(tmp_path: Path) -> None:
    script = Script()
    agent = make_agent(tmp_path, script, World().tools()[:1])
    await agent.run("hi", session="s")
    assert script.tools(0) == ["echo"]
    assert script.requests[0].system == DEFAULT_SYSTEM
    await agent.close()


async def test_search_activates_for_the_next_step_and_a_same_step_call_waits(
    tmp_path: Path,
) -> None:
    world = World()
    script = Script(
        # The model calls the tool in the step that searches for it; that call is refused.
        (call("early", "weather__forecast", '{"city": "Oslo"}'), SEARCH_FORECAST),
        (call("late", "weather__forecast", '{"city": "Oslo"}'),),
    )
    agent = make_agent(tmp_path, script, world.tools())
    result = await agent.run("weather?", session="s")
    assert result.status == "completed"
    assert script.tools(0) == ["echo", "tool_search"]
    assert script.tools(1) == ["echo", "tool_search", "weather__forecast"]

    step1 = script.results(1)
    assert step1["early"].is_error
    assert "activated by tool_search in this step" in step1["early"].content
    assert "call it on the next step" in step1["early"].content
    found = step1["s1"].content
    assert "weather__forecast: Forecast tomorrow's weather for a city." in found
    assert '"properties"' not in found  # names and descriptions, never schemas
    assert script.results(2)["late"].content == "sunny in Oslo"
    assert world.effects == ["forecast:Oslo"]  # only the next-step call ran

    events = await agent.session("s").events()
    (activated,) = of_kind(events, ToolsActivated)
    assert activated.body.names == ("weather__forecast",)  # type: ignore[union-attr]
    assert activated.call_id == "s1" and activated.step_id is not None
    rejected = of_kind(events, CallRejected)
    assert [(e.call_id, e.body.reason) for e in rejected] == [  # type: ignore[union-attr]
        ("early", "activated_this_step")
    ]
    # The step's tool set is recorded: the activated tool is in the second step only.
    steps = [[r.name for r in e.body.tools] for e in of_kind(events, StepStarted)]  # type: ignore[union-attr]
    assert steps == [
        ["echo", "tool_search"],
        ["echo", "tool_search", "weather__forecast"],
        ["echo", "tool_search", "weather__forecast"],
    ]
    await agent.close()


async def test_activations_accumulate_and_the_prefix_stays_stable(tmp_path: Path) -> None:
    script = Script(
        (SEARCH_FORECAST,),
        (call("s2", "tool_search", '{"query": "select:git__git_log"}'),),
        (call("s3", "tool_search", '{"query": "select:git__git_log"}'),),
    )
    agent = make_agent(tmp_path, script, World().tools())
    await agent.run("go", session="s")
    tools = [script.tools(i) for i in range(4)]
    assert tools[1] == ["echo", "tool_search", "weather__forecast"]
    assert tools[2] == ["echo", "tool_search", "weather__forecast", "git__git_log"]
    assert tools[3] == tools[2]
    for before, after in itertools.pairwise(tools):
        assert after[: len(before)] == before  # each step extends the last: cache-friendly
    assert len({r.system for r in script.requests}) == 1
    assert "Already loaded: git__git_log" in script.results(3)["s3"].content
    await agent.close()


async def test_activations_are_released_when_the_turn_ends(tmp_path: Path) -> None:
    script = Script((SEARCH_FORECAST,))
    agent = make_agent(tmp_path, script, World().tools())
    await agent.run("one", session="s")
    assert script.tools(1) == ["echo", "tool_search", "weather__forecast"]
    await agent.run("two", session="s")
    assert script.tools(2) == ["echo", "tool_search"]
    await agent.close()


async def test_search_grants_no_permission_and_binds_nothing(tmp_path: Path) -> None:
    world = World()
    script = Script(
        (call("s1", "tool_search", '{"query": "select:git__git_reset,rm_rf"}'),),
        (call("s2", "tool_search", '{"query": "select:git__git_reset"}'),),
        (call("reset", "git__git_reset"), call("rm", "rm_rf")),
    )
    agent = make_agent(tmp_path, script, world.tools())
    await agent.run("go", session="s")
    assert script.results(1)["s1"].is_error
    assert "no deferred tool is named 'rm_rf'" in script.results(1)["s1"].content
    results = script.results(3)
    assert "needs approval" in results["reset"].content  # visible, still not allowed
    assert "unknown tool 'rm_rf'" in results["rm"].content
    assert world.effects == []
    await agent.close()


def _fails_on_forecast_t1(records: object) -> bool:
    return any(
        b'"kind":"tool_dispatched"' in r.data and b"weather__forecast" in r.data
        for r in records  # type: ignore[attr-defined]
    )


async def test_a_second_run_of_the_same_turn_inherits_activations(tmp_path: Path) -> None:
    world = World()
    state = tmp_path / "state"
    store: LogStore = FaultyLogStore(SqliteLogStore(state), fail_when=_fails_on_forecast_t1)
    first = Script((SEARCH_FORECAST,), (call("c1", "weather__forecast", '{"city": "Rome"}'),))
    agent = make_agent(tmp_path, first, world.tools(), store=store)
    with pytest.raises(CommitFailedError):
        await agent.run("weather?", session="s")
    await agent.close()
    assert world.effects == []  # T1 failed, so the call never ran; the turn is open

    # A new run continues the open turn from the log, as resume does.
    second = Script((call("c2", "weather__forecast", '{"city": "Rome"}'),))
    resumed = make_agent(tmp_path, second, world.tools())
    writer = await resumed.log.open_writer("s")
    journal = resumed.engine.journal(writer, SessionState("s", writer.initial_events))
    (run,) = of_kind(journal.events, RunStarted)
    assert run.turn_id is not None
    await journal.fact(
        RunStarted(model="function:x", parent_run_id=run.run_id),
        Envelope(turn_id=run.turn_id, run_id="r2"),
    )
    ctx = resumed.engine.run_context(journal, turn_id=run.turn_id, run_id="r2")
    result = await resumed.engine.drive(ctx)
    await writer.close()
    assert result.status == "completed"
    assert second.tools(0) == ["echo", "tool_search", "weather__forecast"]
    assert world.effects == ["forecast:Rome"]
    events = await resumed.session("s").events()
    assert [e.run_id for e in of_kind(events, ToolDispatched)] == [run.run_id, "r2"]
    assert len(of_kind(events, ToolResponded)) == 2
    await resumed.close()

"""Model settings per agent and per run reach every request and every ``step_started``;
a resume asks with the settings its turn was asked with."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from lodger import Agent, FunctionModel, tool
from lodger.engine.modelsettings import settings_from_mapping
from lodger.engine.settings import Services
from lodger.errors import CommitFailedError, ConfigError, UsageError
from lodger.events import StepStarted
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ModelResponse, ModelSettings, ToolResultMessage
from lodger.providers.scripted import tool_call
from lodger.storage import EventLog, MemoryArtifactStore, MemoryLogStore, SqliteLogStore, Storage
from lodger.storage.logstore import Record
from lodger.testing import FaultyLogStore


@tool(recovery="idempotent")
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def recording(seen: list[ModelRequest]) -> FunctionModel:
    def step(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        if isinstance(request.messages[-1], ToolResultMessage):
            return ModelResponse(text="done")
        return ModelResponse(calls=(tool_call("add", a=1, b=2),))

    return FunctionModel(step)


def make(model: Any, log: EventLog | None = None, **kw: Any) -> Agent:
    return Agent(
        model=model,
        tools=[add],
        storage=Storage(log=log or EventLog(MemoryLogStore()), artifacts=MemoryArtifactStore()),
        services=Services(clock=ManualClock(tick_us=5), ids=SequentialIds("m")),
        **kw,
    )


async def steps(agent: Agent, session: str) -> list[StepStarted]:
    events = await agent.session(session).events()
    return [e.body for e in events if isinstance(e.body, StepStarted)]


async def test_agent_settings_reach_every_request_and_step_started() -> None:
    seen: list[ModelRequest] = []
    settings = ModelSettings(temperature=0.2, max_tokens=300, stop=("END",), extra={"k": 1})
    agent = make(recording(seen), model_settings=settings)
    result = await agent.run("go", session="s")
    assert result.status == "completed" and len(seen) == 2
    assert all(r.settings == settings for r in seen)
    assert all(r.max_output_tokens == 300 for r in seen)
    recorded = [s.settings for s in await steps(agent, "s")]
    assert (
        recorded
        == [{"temperature": 0.2, "max_tokens": 300, "stop": ["END"], "extra": {"k": 1}}] * 2
    )
    await agent.close()


async def test_run_settings_override_the_agents_field_by_field_for_that_run_only() -> None:
    seen: list[ModelRequest] = []
    agent = make(recording(seen), model_settings=ModelSettings(temperature=0.2, seed=7))
    await agent.run("go", session="s", model_settings=ModelSettings(temperature=0.9))
    assert seen[0].settings == ModelSettings(temperature=0.9, seed=7)
    seen.clear()
    await agent.run("again", session="s")
    assert seen[0].settings == ModelSettings(temperature=0.2, seed=7)
    recorded = [s.settings for s in await steps(agent, "s")]
    assert recorded[0] == {"temperature": 0.9, "seed": 7}
    assert recorded[-1] == {"temperature": 0.2, "seed": 7}
    await agent.close()


def test_run_sync_and_stream_take_model_settings() -> None:
    seen: list[ModelRequest] = []
    with make(recording(seen)) as agent:
        agent.run_sync("go", model_settings=ModelSettings(top_p=0.5))
        assert seen[-1].settings.top_p == 0.5

        async def streamed() -> None:
            async for _ in agent.stream("go", model_settings=ModelSettings(seed=3)):
                pass

        agent._sync_runner().run(streamed())
        assert seen[-1].settings.seed == 3


async def test_no_settings_records_none_and_sends_defaults() -> None:
    seen: list[ModelRequest] = []
    agent = make(recording(seen))
    await agent.run("go", session="s")
    assert seen[0].settings == ModelSettings() and seen[0].max_output_tokens is None
    assert [s.settings for s in await steps(agent, "s")] == [None, None]
    await agent.close()


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        (ModelSettings(temperature=3.0), "temperature"),
        (ModelSettings(top_p=0), "top_p"),
        (ModelSettings(max_tokens=0), "max_tokens"),
        (ModelSettings(reasoning_effort="huge"), "reasoning_effort"),
        (ModelSettings(extra={"x": float("nan")}), "extra"),
    ],
)
async def test_settings_out_of_range_are_a_usage_error_naming_the_field(
    settings: ModelSettings, field: str
) -> None:
    with pytest.raises(UsageError, match=field):
        make(recording([]), model_settings=settings)
    agent = make(recording([]))
    with pytest.raises(UsageError, match=field):
        await agent.run("go", model_settings=settings)
    await agent.close()


def test_settings_from_a_table_reject_unknown_keys_and_read_stop_as_a_list() -> None:
    assert settings_from_mapping({"stop": "END"}, where="t").stop == ("END",)
    with pytest.raises(ConfigError, match="unknown model setting 'temp'"):
        settings_from_mapping({"temp": 1}, where="[model.settings]")
    with pytest.raises(ConfigError, match="max_tokens must be a whole number"):
        settings_from_mapping({"max_tokens": "many"}, where="[model.settings]")


class FailT2Once:
    def __init__(self) -> None:
        self.done = False

    def __call__(self, records: Sequence[Record]) -> bool:
        if not self.done and any(b'"kind":"tool_responded"' in r.data for r in records):
            self.done = True
            return True
        return False


async def test_a_resume_asks_with_the_settings_the_turn_was_asked_with(tmp_path: Path) -> None:
    store = FaultyLogStore(SqliteLogStore(tmp_path), fail_when=FailT2Once())
    agent = make(recording([]), EventLog(store))
    with pytest.raises(CommitFailedError):
        await agent.run("go", session="s", model_settings=ModelSettings(temperature=0.1))
    await agent.close()
    seen: list[ModelRequest] = []
    # a new agent with other defaults: the turn keeps what it was asked with
    again = make(
        recording(seen),
        EventLog(SqliteLogStore(tmp_path)),
        model_settings=ModelSettings(temperature=1.5, seed=4),
    )
    result = await again.resume("s", model_settings=ModelSettings(max_tokens=50))
    assert result.status == "completed"
    assert seen[-1].settings == ModelSettings(temperature=0.1, max_tokens=50)
    await again.close()


async def test_sessions_compose_settings_and_a_resume_keeps_the_turns(tmp_path: Path) -> None:
    from lodger.runtime.composition import Overrides, compose
    from lodger.runtime.project import Project
    from lodger.runtime.sessions import Sessions

    (tmp_path / "lodger.toml").write_text("[model_settings]\ntemperature = 0.4\n")
    project = Project.load(tmp_path, trusted=True)
    store = FaultyLogStore(SqliteLogStore(tmp_path / "log"), fail_when=FailT2Once())
    storage = Storage(log=EventLog(store), artifacts=MemoryArtifactStore())
    first = compose(project, Overrides(model=recording([]), tools=[add], builtin_tools=False))
    assert first.model_settings == ModelSettings(temperature=0.4)
    async with Sessions(storage) as sessions:
        with pytest.raises(CommitFailedError):
            await sessions.run("go", binding=first, session="s")
    seen: list[ModelRequest] = []
    (tmp_path / "lodger.toml").unlink()  # the recorded settings still hold
    again = compose(
        Project.load(tmp_path, trusted=True),
        Overrides(
            model=recording(seen),
            tools=[add],
            builtin_tools=False,
            model_settings=ModelSettings(seed=9),
        ),
    )
    log = Storage(log=EventLog(SqliteLogStore(tmp_path / "log")), artifacts=MemoryArtifactStore())
    async with Sessions(log) as sessions:
        result = await sessions.resume("s", binding=again)
    assert result.status == "completed"
    assert seen[-1].settings == ModelSettings(temperature=0.4, seed=9)

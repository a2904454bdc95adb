"""Settings travel as a few frozen groups, passed whole from the agent to the engine and
its call pipeline (``lodger.engine.settings``)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from lodger import Agent, Hooks, Limits, Retries, ScriptedModel, Services, Storage
from lodger.authority import Authorities
from lodger.engine.journal import Journal
from lodger.engine.loop import Engine
from lodger.engine.state import SessionState
from lodger.ids import ManualClock, SequentialIds, Uuid7Factory


def test_the_agent_takes_a_few_groups_not_thirty_arguments() -> None:
    parameters = [p for p in inspect.signature(Agent.__init__).parameters if p != "self"]
    # 17: model_settings and output_mode joined for parity with pydantic-ai (issue 30);
    # 18: compaction (issue 31), itself a group, kept in ``limits`` once given;
    # anything further belongs in a group
    assert len(parameters) <= 18, parameters
    engine_fields = [f.name for f in dataclasses.fields(Engine) if f.init]
    # 18: issue 30 added output_mode, settings, run_settings and spend; the next field
    # should come with grouping the model request's three into one settings group
    assert len(engine_fields) <= 18, engine_fields


async def test_the_engine_and_its_pipeline_hold_the_groups_as_given() -> None:
    limits = Limits(max_steps=3, default_timeout=7.0)
    retries = Retries(max_retries=1)
    hooks = Hooks(on_event=lambda event: None)
    services = Services(clock=ManualClock(), ids=SequentialIds("s"), authorities=Authorities())
    agent = Agent(
        model=ScriptedModel([{"text": "ok"}]),
        storage=Storage.memory(),
        limits=limits,
        retries=retries,
        hooks=hooks,
        services=services,
    )
    engine = agent.engine
    assert (engine.limits, engine.retries, engine.hooks, engine.services) == (
        limits,
        retries,
        hooks,
        services,
    )
    assert engine.limits is limits and engine.hooks is hooks and engine.services is services
    assert agent.clock is services.clock and agent.ids is services.ids
    async with await agent.log.open_writer("s1") as writer:
        journal: Journal = engine.journal(writer, SessionState("s1"))
        pipeline = engine.pipeline(engine.run_context(journal, turn_id="t", run_id="r"))
        assert pipeline.default_timeout == 7.0
        assert pipeline.authorities is services.authorities
    result = await agent.run("hi", session="s1")
    assert result.status == "completed" and result.answer == "ok"
    await agent.close()


def test_groups_are_frozen_and_a_change_is_a_replace() -> None:
    limits = Limits()
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.max_steps = 1  # type: ignore[misc]
    assert dataclasses.replace(limits, max_steps=1).max_steps == 1 and limits.max_steps == 50
    hooks = Hooks(before_call=[print])
    assert hooks.before_call == (print,)  # kept as a tuple, whatever sequence was given


def test_services_take_their_ids_from_their_clock_unless_given() -> None:
    clock = ManualClock()
    made = Services(clock=clock)
    assert isinstance(made.ids, Uuid7Factory)
    ids = SequentialIds("x")
    assert Services(clock=clock, ids=ids).ids is ids
    assert Services().authorities is not Services().authorities  # each its own

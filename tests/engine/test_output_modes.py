"""Output modes: the engine sends an object schema in native and tool mode (wrapping
other types and unwrapping their answers), keeps the schema in the prompt only when
prompted, and takes a union of output types."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import BaseModel

from lodger import Agent, FunctionModel, ScriptedModel
from lodger.engine.settings import Services
from lodger.errors import UsageError
from lodger.events import TurnEnded
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ModelResponse, OutputMode
from lodger.providers.scripted import tool_call
from lodger.providers.testmodel import TestModel
from lodger.storage import EventLog, MemoryArtifactStore, MemoryLogStore, Storage


class Invoice(BaseModel):
    customer: str
    cents: int


class Refusal(BaseModel):
    reason: str


def make(model: Any, **kw: Any) -> Agent:
    return Agent(
        model=model,
        storage=Storage(log=EventLog(MemoryLogStore()), artifacts=MemoryArtifactStore()),
        services=Services(clock=ManualClock(tick_us=5), ids=SequentialIds("o")),
        **kw,
    )


def answering(seen: list[ModelRequest], text: str) -> FunctionModel:
    def step(request: ModelRequest) -> str:
        seen.append(request)
        return text

    return FunctionModel(step)


WRAPPED_LIST = {
    "type": "object",
    "properties": {"result": {"type": "array", "items": {"type": "integer"}}},
    "required": ["result"],
    "additionalProperties": False,
}


async def test_native_mode_wraps_a_list_type_and_unwraps_the_answer() -> None:
    seen: list[ModelRequest] = []
    agent = make(answering(seen, '{"result": [1, 2]}'), output_type=list[int], output_mode="native")
    result = await agent.run("go", session="s")
    assert result.output == [1, 2]
    assert seen[0].output_mode == "native" and seen[0].output_schema == WRAPPED_LIST
    assert "JSON schema" not in seen[0].system  # the schema travels on its own
    ended = (await agent.session("s").events())[-1].body
    assert isinstance(ended, TurnEnded) and ended.output == [1, 2]
    await agent.close()


async def test_an_object_type_is_sent_as_it_is_and_prompted_mode_keeps_the_prompt() -> None:
    seen: list[ModelRequest] = []
    agent = make(answering(seen, '{"customer": "A", "cents": 1}'), output_type=Invoice)
    await agent.run("go", output_mode="tool")
    assert seen[-1].output_mode == "tool"
    assert seen[-1].output_schema == Invoice.model_json_schema()
    assert "final_result" in seen[-1].system
    await agent.run("go", output_type=list[int], output_mode="prompted")
    assert seen[-1].output_mode == "prompted"
    assert seen[-1].output_schema == {"type": "array", "items": {"type": "integer"}}
    assert "JSON schema" in seen[-1].system
    await agent.close()


async def test_the_models_own_mode_is_the_default_and_the_agents_overrides_it() -> None:
    seen: list[ModelRequest] = []
    model = answering(seen, '{"result": 3}')
    model.output_mode = "native"  # type: ignore[attr-defined]  # as adapters declare it
    agent = make(model, output_type=int)
    assert (await agent.run("go")).output == 3
    assert seen[-1].output_mode == "native"
    await agent.close()
    prompted = make(answering(seen, "3"), output_type=int, output_mode="prompted")
    assert (await prompted.run("go")).output == 3
    assert seen[-1].output_mode == "prompted" and seen[-1].output_schema == {"type": "integer"}
    await prompted.close()


async def test_tool_mode_takes_a_lone_output_call_from_a_function_model() -> None:
    def step(request: ModelRequest) -> ModelResponse:
        return ModelResponse(calls=(tool_call("final_result", result=[4, 5]),))

    agent = make(FunctionModel(step), output_type=list[int], output_mode="tool")
    result = await agent.run("go")
    assert result.status == "completed" and result.output == [4, 5]
    await agent.close()


async def test_a_wrapped_answer_with_other_keys_is_rejected_and_retried() -> None:
    answers = iter(['{"result": 1, "x": 2}', '{"result": 1}'])
    agent = make(FunctionModel(lambda r: next(answers)), output_type=int, output_mode="native")
    result = await agent.run("go")
    assert result.output == 1
    await agent.close()


@pytest.mark.parametrize("output_type", [[Invoice, Refusal], Invoice | Refusal])
@pytest.mark.parametrize("mode", ["prompted", "native", "tool"])
async def test_a_union_of_output_types_validates_as_either(
    output_type: Any, mode: OutputMode
) -> None:
    seen: list[ModelRequest] = []
    wrap = mode != "prompted"
    text = '{"reason": "no"}'
    agent = make(
        answering(seen, '{"result": ' + text + "}" if wrap else text),
        output_type=output_type,
        output_mode=mode,
    )
    result = await agent.run("go")
    assert result.output == Refusal(reason="no") and isinstance(result.output, Refusal)
    schema = seen[0].output_schema or {}
    assert (schema.get("type") == "object") is wrap
    if wrap:  # the definitions the union refers to stay at the root
        assert set(schema["$defs"]) == {"Invoice", "Refusal"}
    other = make(ScriptedModel([{"text": '{"customer": "A", "cents": 2}'}]), output_mode=mode)
    assert (await other.run("go", output_type=output_type)).output == Invoice(customer="A", cents=2)
    await agent.close()
    await other.close()


@dataclasses.dataclass
class Point:
    x: int
    y: int


@pytest.mark.parametrize("mode", ["prompted", "native", "tool"])
@pytest.mark.parametrize("output_type", [int, list[str], Point, [Invoice, Refusal]])
async def test_the_test_model_answers_valid_output_in_every_mode(
    mode: OutputMode, output_type: Any
) -> None:
    agent = make(TestModel(), output_type=output_type, output_mode=mode)
    result = await agent.run("go")
    assert result.status == "completed", result.error
    assert result.output is not None
    await agent.close()


def test_an_unknown_mode_or_an_empty_union_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown output_mode 'json'"):
        make(TestModel(), output_mode="json")
    with pytest.raises(UsageError, match="empty list"):
        make(TestModel(), output_type=[])


async def test_an_output_call_beside_other_calls_waits_for_a_later_step() -> None:
    from lodger import tool

    @tool
    def note(text: str) -> str:
        """Take a note."""
        return "noted"

    seen: list[ModelRequest] = []

    def step(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        if len(seen) == 1:
            return ModelResponse(
                calls=(tool_call("note", text="x"), tool_call("final_result", result=1))
            )
        return ModelResponse(calls=(tool_call("final_result", result=2),))

    agent = make(FunctionModel(step), output_type=int, output_mode="tool", tools=[note])
    result = await agent.run("go", session="s")
    assert result.status == "completed" and result.output == 2
    events = await agent.session("s").events()
    assert not any(e.kind == "call_rejected" for e in events)  # final_result never ran
    await agent.close()

"""``lodger._core.records.record``: the instance a frozen dataclass's ``__init__`` makes,
for every class the call path builds that way, and a refusal for any other class."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from lodger._core.records import record, recordable
from lodger.context import MessageSnapshot, Projection
from lodger.engine.pipeline import CallOutcome
from lodger.events import ProposedCall
from lodger.providers.base import (
    AssistantMessage,
    ModelRequest,
    ModelSettings,
    ToolResultMessage,
    ToolSchema,
)
from lodger.tools.spec import Tool, ToolContext

CALL = ProposedCall(call_id="c", name="n", arguments="{}")

CASES: list[tuple[type, dict[str, Any]]] = [
    (
        ToolContext,
        {
            "session_id": "s",
            "turn_id": "t",
            "run_id": "r",
            "call_id": "c",
            "operation_id": "o",
            "workspace": Path("/w"),
            "parent_call_id": None,
            "hidden": (Path("/w/.lodger"),),
            "step": None,
            "nested": None,
            "extras": {},
            "deps": {"db": 1},
            "idempotency_key": "lodger-k",
            "runtime": None,
        },
    ),
    (
        CallOutcome,
        {
            "call_id": "c",
            "name": "n",
            "status": "ok",
            "content": "x",
            "dispatched": True,
            "suspended": False,
            "awaiting_approval": False,
        },
    ),
    (
        ToolResultMessage,
        {"call_id": "c", "name": "n", "content": "x", "is_error": True, "parts": ()},
    ),
    (
        AssistantMessage,
        {"text": "t", "reasoning": "r", "calls": (CALL,), "provider_state": {"p": [1]}},
    ),
    (
        Projection,
        {"messages": MessageSnapshot([], 0, ()), "elided_call_ids": (), "estimated_tokens": 4},
    ),
    (
        ModelRequest,
        {
            "system": "s",
            "messages": (),
            "tools": (ToolSchema(name="n", description="d", parameters={}),),
            "max_output_tokens": None,
            "output_schema": {"type": "object"},
            "output_mode": "native",
            "settings": ModelSettings(temperature=0.5),
        },
    ),
]


@pytest.mark.parametrize(("cls", "fields"), CASES, ids=[c.__name__ for c, _ in CASES])
def test_record_is_what_init_makes(cls: type, fields: dict[str, Any]) -> None:
    built = record(cls, dict(fields))
    expected = cls(**fields)
    assert type(built) is cls
    assert built == expected
    assert repr(built) == repr(expected)
    assert vars(built) == vars(expected)
    assert dataclasses.asdict(built) == dataclasses.asdict(expected)
    field = next(iter(fields))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, field, "changed")


def test_each_tool_context_gets_its_own_extras() -> None:
    fields = dict(CASES[0][1])
    one = record(ToolContext, {**fields, "extras": {}})
    two = record(ToolContext, {**fields, "extras": {}})
    assert one.extras is not two.extras


def test_classes_init_does_more_for_are_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class Checked:
        n: int

        def __post_init__(self) -> None:
            if self.n < 0:
                raise ValueError("negative")

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        n: int

    assert not recordable(Checked)
    assert not recordable(Slotted)
    assert not recordable(Tool)  # Tool checks itself in __post_init__
    assert not recordable(int)
    with pytest.raises(TypeError, match="cannot be built"):
        record(Checked, {"n": -1})


def test_the_fields_must_be_every_field_in_order() -> None:
    @dataclasses.dataclass(frozen=True)
    class Pair:
        a: int
        b: int

    with pytest.raises(TypeError, match="exactly the fields"):
        record(Pair, {"b": 1, "a": 2})
    with pytest.raises(TypeError, match="exactly the fields"):
        record(Pair, {"a": 1})
    assert record(Pair, {"a": 1, "b": 2}) == Pair(1, 2)

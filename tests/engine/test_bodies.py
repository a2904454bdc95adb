"""The hot path's body builders (``lodger.engine.bodies``) against the models' own
constructors: the same body for every value the model takes, the model's own error for
every value it refuses, and canonical bytes identical to a validated body's."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from lodger.engine import bodies
from lodger.errors import UsageError
from lodger.events import (
    ArtifactRef,
    Event,
    EventDraft,
    FileExpectation,
    ModelOutput,
    ProposedCall,
    StepStarted,
    ToolDispatched,
    ToolRef,
    ToolResponded,
    Usage,
    canonical_bytes,
    seal,
)


class Text(str):
    """A str subclass: strict pydantic decides what it makes of it, not the fast path."""


REF = ToolRef(name="noop", schema_digest="a" * 64)
CALL = ProposedCall(call_id="c1", name="noop", arguments='{"a": 1}')
ART = ArtifactRef(sha256="c" * 64, size=3)
EXPECT = FileExpectation(path="f.txt", before_sha256=None, after_sha256="b" * 64)


def _nested_lists(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _same(build: Callable[..., BaseModel], cls: type[BaseModel], **kwargs: Any) -> None:
    """``build(**kwargs)`` and ``cls(**kwargs)`` agree: equal bodies, or the same error."""
    try:
        expected = cls(**kwargs)
    except ValidationError as exc:
        refused = exc.errors()
    else:
        refused = None
    if refused is not None:
        with pytest.raises(ValidationError) as got:
            build(**kwargs)
        assert got.value.errors() == refused
        return
    built = build(**kwargs)
    assert type(built) is cls
    assert built == expected
    assert built.model_dump(mode="json") == expected.model_dump(mode="json")
    assert list(built.__dict__) == list(expected.__dict__)
    made, want = _sealed(built), _sealed(expected)
    assert made == want
    if isinstance(want, tuple):
        validated = Event(offset=0, session_id="s", id="e1", ts=1, body=expected)  # type: ignore[arg-type]
        assert want[0] == canonical_bytes(validated)


def _sealed(body: BaseModel) -> tuple[bytes, str] | str:
    """The canonical bytes and digest of ``body`` in a first event, or the error."""
    draft = EventDraft(id="e1", ts=1, body=body)  # type: ignore[arg-type]
    try:
        event, data = seal(draft, session_id="s", offset=0, prev_digest="")
    except UsageError as exc:
        return f"{exc.code}: {exc}"
    return data, event.digest


@pytest.mark.parametrize(
    "kwargs",
    [
        {"index": 0, "model": "m", "tools": (REF,)},
        {"index": 3, "model": "m", "tools": ()},
        {"index": True, "model": "m", "tools": ()},  # a bool is not an index
        {"index": 1.0, "model": "m", "tools": ()},
        {"index": 1, "model": Text("m"), "tools": ()},
        {"index": 1, "model": None, "tools": ()},
        {"index": 1, "model": "m", "tools": [REF]},  # a list, not a tuple
        {"index": 1, "model": "m", "tools": ({"name": "x", "schema_digest": "y"},)},
    ],
)
def test_step_started_matches_the_model(kwargs: dict[str, Any]) -> None:
    _same(bodies.step_started, StepStarted, **kwargs)


OUTPUT = {
    "text": "",
    "reasoning": "",
    "calls": (CALL,),
    "usage": None,
    "finish_reason": None,
    "provider_state": None,
}


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"usage": Usage(input_tokens=3, output_tokens=4), "finish_reason": "stop"},
        {"text": "answer", "calls": ()},
        {"provider_state": {"anthropic": {"blocks": [1, "x"]}}},
        {"provider_state": {"p": float("nan")}},
        {"text": b"bytes"},
        {"text": Text("sub")},
        {"calls": [CALL]},
        {"calls": (CALL, "not a call")},
        {"usage": {"input_tokens": 1}},
        {"finish_reason": 7},
    ],
)
def test_model_output_matches_the_model(change: dict[str, Any]) -> None:
    _same(bodies.model_output, ModelOutput, **{**OUTPUT, **change})


DISPATCH = {
    "operation_id": "op1",
    "tool": "noop",
    "arguments": {"data": "x" * 20, "n": 3, "flag": True, "none": None},
    "attempt": 1,
    "retry_of": None,
    "recovery": "never_retry",
    "resources": (),
    "expectations": (),
}


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"arguments": {}},
        {"retry_of": "op0", "attempt": 2, "resources": ("file:a",), "expectations": (EXPECT,)},
        {"arguments": {"nested": {"a": [1, 2, {"b": None}]}}},
        {"arguments": {"nested": [[1.5, -0.0, 2**70], {"k": [True, "s"]}]}},
        {"arguments": {"nested": [{"f": math.inf}]}},
        {"arguments": {"nested": {"t": (1, 2)}}},
        {"arguments": {"nested": {1: "int key"}}},
        {"arguments": {"nested": [Text("sub")]}},
        {"arguments": {"deep": _nested_lists(70)}},
        {"arguments": {"f": 1.5}},
        {"arguments": {"f": math.inf}},
        {"arguments": {"f": math.nan}},
        {"arguments": {1: "int key"}},
        {"arguments": {"t": (1, 2)}},
        {"arguments": {"o": object()}},
        {"arguments": {"s": Text("sub")}},
        {"arguments": [("a", 1)]},
        {"attempt": True},
        {"resources": ["file:a"]},
        {"resources": (1,)},
        {"expectations": ({"path": "f", "before_sha256": None, "after_sha256": None},)},
        {"retry_of": 5},
    ],
)
def test_tool_dispatched_matches_the_model(change: dict[str, Any]) -> None:
    _same(bodies.tool_dispatched, ToolDispatched, **{**DISPATCH, **change})


def test_tool_dispatched_keeps_its_own_arguments() -> None:
    """The tool gets the decoded arguments and may change them: T1's body must not."""
    arguments: dict[str, Any] = {"data": "x"}
    body = bodies.tool_dispatched(**{**DISPATCH, "arguments": arguments})
    arguments["data"] = "changed"
    arguments["added"] = 1
    assert body.arguments == {"data": "x"}


RESPONSE = {
    "operation_id": "op1",
    "status": "ok",
    "content": "result",
    "truncated": False,
    "artifacts": (),
}


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"status": "timed_out", "content": "", "truncated": True},
        {"status": "error", "content": 'é \u2028 \x00 quote" back\\slash'},
        {"status": "finished"},  # not a status
        {"status": Text("ok")},
        {"content": None},
        {"content": 42},
        {"content": b"bytes"},
        {"content": Text("sub")},
        {"content": "lone \ud800 surrogate"},  # the model takes it; sealing refuses it
        {"truncated": 1},
        {"artifacts": (ART,), "truncated": True},
        {"artifacts": [ART]},
        {"artifacts": ({"sha256": "c", "size": 1},)},
    ],
)
def test_tool_responded_matches_the_model(change: dict[str, Any]) -> None:
    kwargs = {**RESPONSE, **change}
    if "\ud800" in str(kwargs["content"]):
        fast = bodies.tool_responded(**kwargs)
        assert fast == ToolResponded(**kwargs)
        draft = EventDraft(id="e1", ts=1, body=fast)
        with pytest.raises(Exception, match="cannot be stored"):
            seal(draft, session_id="s", offset=0, prev_digest="")
        return
    _same(bodies.tool_responded, ToolResponded, **kwargs)


def test_fast_bodies_share_no_fields_set_with_validated_ones() -> None:
    """Bodies built the fast way say every field was set; a copy with an update (what
    the log does to a first event) gets a set of its own, the shared one is unchanged."""
    body = bodies.tool_responded(**RESPONSE)
    shared = body.model_fields_set
    assert shared == set(ToolResponded.model_fields)
    copy = body.model_copy(update={"content": "other"})
    assert copy.content == "other"
    assert copy.model_fields_set is not shared
    assert shared == set(ToolResponded.model_fields)


def test_the_common_values_take_the_fast_way() -> None:
    """Not the fallback: the four bodies of a plain call are built without pydantic."""
    from lodger import events

    made = [
        bodies.step_started(index=0, model="m", tools=(REF,)),
        bodies.model_output(**OUTPUT),
        bodies.tool_dispatched(**DISPATCH),
        bodies.tool_responded(**RESPONSE),
    ]
    for body in made:
        assert body.model_fields_set is events._ALL_FIELDS[type(body)]
    nested = {"f": 1.5, "points": [{"x": 1, "tags": ["a"]}], "style": {"w": None}}
    fast = bodies.tool_dispatched(**{**DISPATCH, "arguments": nested})
    assert fast.model_fields_set is events._ALL_FIELDS[ToolDispatched]
    for odd in ({"f": math.nan}, {"s": [Text("sub")]}, {"deep": _nested_lists(70)}):
        slow = bodies.tool_dispatched(**{**DISPATCH, "arguments": odd})
        assert slow.model_fields_set is not events._ALL_FIELDS.get(ToolDispatched), odd


def test_tool_dispatched_copies_nested_arguments_deeply() -> None:
    """The fast way copies every nested list and dict: changing the tool's arguments
    after T1 was built changes nothing in T1."""
    arguments: dict[str, Any] = {"points": [{"x": 1, "tags": ["a"]}], "style": {"w": 2}}
    body = bodies.tool_dispatched(**{**DISPATCH, "arguments": arguments})
    arguments["points"][0]["tags"].append("b")
    arguments["points"].append({"x": 2})
    arguments["style"]["w"] = 3
    assert body.arguments == {"points": [{"x": 1, "tags": ["a"]}], "style": {"w": 2}}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"call_id": "call-1", "name": "noop", "arguments": "{}"},
        {"call_id": "", "name": "noop", "arguments": ""},
        {"call_id": Text("c"), "name": "noop", "arguments": "{}"},
        {"call_id": "c", "name": None, "arguments": "{}"},
        {"call_id": "c", "name": "noop", "arguments": {"a": 1}},
    ],
)
def test_proposed_call_matches_the_model(kwargs: dict[str, Any]) -> None:
    try:
        expected = ProposedCall(**kwargs)
    except ValidationError as exc:
        refused = exc.errors()
    else:
        assert bodies.proposed_call(**kwargs) == expected
        return
    with pytest.raises(ValidationError) as got:
        bodies.proposed_call(**kwargs)
    assert got.value.errors() == refused


def test_new_prefix_is_the_validated_prefix() -> None:
    from lodger.events import Prefix, new_prefix

    made = new_prefix(7, "ab" * 32)
    assert made == Prefix(high_water=7, digest="ab" * 32)
    assert made.model_dump() == {"high_water": 7, "digest": "ab" * 32}
    assert hash(made) == hash(Prefix(high_water=7, digest="ab" * 32))

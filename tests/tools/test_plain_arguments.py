"""A tool whose arguments are all plain ``str``/``int``/``bool`` gets them without its
pydantic model when they already have exactly those types: what the tool receives, and
the error when the arguments are wrong, must be what the model would have given."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any

import pytest
from pydantic import Field

import lodger.tools.spec as spec
from lodger.errors import ToolCallError
from lodger.tools import tool
from lodger.tools.spec import Tool, ToolContext

SEEN: list[dict[str, Any]] = []


async def plain(text: str, count: int, flag: bool = False, label: str = "none") -> str:
    """Record what arrived."""
    SEEN.append({"text": text, "count": count, "flag": flag, "label": label})
    return "ok"


async def converted(ratio: float, name: str) -> str:
    """A float field: pydantic converts an int, so the model always validates."""
    SEEN.append({"ratio": ratio, "name": name})
    return "ok"


async def constrained(code: Annotated[str, Field(max_length=3)]) -> str:
    """A constraint the fast way cannot check: the model always validates."""
    SEEN.append({"code": code})
    return "ok"


async def field_default(count: int = Field(default=3, ge=1)) -> str:
    """A default given as a pydantic Field (with a bound): the model's to fill and check."""
    SEEN.append({"count": count})
    return "ok"


class Text(str):
    pass


CTX = ToolContext(session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o")


def _validated(fn: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> Tool:
    """``fn`` as a tool that always validates through its model."""
    with monkeypatch.context() as m:
        m.setattr(spec, "_plain_fields", lambda fields: None)
        return tool(fn)


def _run(t: Tool, arguments: Any) -> tuple[str, Any]:
    """What ``t`` received for ``arguments`` (types included), or its error text."""
    SEEN.clear()
    try:
        asyncio.run(t.handler(arguments, CTX))
    except ToolCallError as exc:
        return "error", str(exc)
    (received,) = SEEN
    return "ok", [(k, type(v), v) for k, v in received.items()]


CASES = [
    (plain, {"text": "a", "count": 2}),
    (plain, {"text": "a", "count": 2, "flag": True, "label": "x"}),
    (plain, {"text": "", "count": -5, "flag": False}),
    (plain, {"text": "a", "count": True}),  # a bool for an int
    (plain, {"text": "a", "count": "2"}),  # a numeric string
    (plain, {"text": "a", "count": 2.0}),
    (plain, {"text": "a", "count": 2.5}),
    (plain, {"text": 3, "count": 2}),
    (plain, {"text": Text("a"), "count": 2}),
    (plain, {"text": "a", "count": 2, "flag": 1}),
    (plain, {"text": "a", "count": 2, "flag": "true"}),
    (plain, {"text": "a"}),  # missing
    (plain, {"text": "a", "count": 2, "extra": 1}),  # unknown
    (plain, {}),
    (plain, {"text": None, "count": 2}),
    (converted, {"ratio": 1, "name": "n"}),
    (constrained, {"code": "abcd"}),
    (constrained, {"code": "ab"}),
    (field_default, {}),  # the Field's default, not the Field itself
    (field_default, {"count": 0}),  # its bound
    (field_default, {"count": 5}),
]


@pytest.mark.parametrize(("fn", "arguments"), CASES)
def test_plain_arguments_arrive_as_the_model_gives_them(
    fn: Callable[..., Any], arguments: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _run(tool(fn), dict(arguments))
    slow = _run(_validated(fn, monkeypatch), dict(arguments))
    assert fast == slow


def test_only_plain_annotations_take_the_fast_way() -> None:
    assert spec._plain_fields({"a": (str, ...), "b": (int, 3), "c": (bool, False)}) is not None
    assert spec._plain_fields({"a": (str, ...), "r": (float, ...)}) is None
    assert spec._plain_fields({"a": (Annotated[str, Field(max_length=3)], ...)}) is None
    assert spec._plain_fields({"a": (str | None, None)}) is None
    assert spec._plain_fields({"a": (int, Field(default=3, ge=1))}) is None


def test_the_fast_way_is_taken_for_exact_values_only() -> None:
    """Not always the fallback: exact values are handed over as they are (defaults
    filled in); anything else is left to the model (None)."""
    fields = spec._plain_fields({"text": (str, ...), "count": (int, ...), "flag": (bool, False)})
    assert fields is not None
    take = spec._plain_kwargs
    assert take(fields, {"text": "a", "count": 1}) == {"text": "a", "count": 1, "flag": False}
    assert take(fields, {"text": "a", "count": 1, "flag": True})["flag"] is True
    for other in (
        {"text": "a", "count": True},
        {"text": "a"},
        {"text": "a", "count": 1, "x": 1},
        {"text": Text("a"), "count": 1},
        [("text", "a")],
    ):
        assert take(fields, other) is None  # type: ignore[arg-type]

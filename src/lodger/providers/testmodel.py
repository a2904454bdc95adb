"""``TestModel``: exercises an agent's tools with no script and no network.

On the first step of a turn it calls every visible tool (or the ones named in
``call_tools``) once, with arguments made from each tool's JSON schema; on the next step
it answers: with a JSON value made from the output schema when the turn has an output
type, else with ``text`` if given, else a JSON object of each tool's result. It reports
a deterministic token usage (about four characters a token), so usage accounting can be
tested too.

    agent = Agent(model=TestModel(), tools=[add, lookup])
    result = await agent.run("anything")   # add and lookup each ran once, through T1/T2
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from lodger.events import ProposedCall, Usage
from lodger.providers.base import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    TextSink,
    ToolResultMessage,
    UserMessage,
)

__all__ = ["TestModel", "example_for"]


class TestModel:
    """Calls every tool once with schema-valid arguments, then answers."""

    __test__ = False  # not a pytest test class
    #: takes images and documents (it reads none of them)
    media_kinds: frozenset[str] = frozenset({"image", "document"})

    def __init__(
        self,
        *,
        call_tools: Sequence[str] | None = None,
        text: str | None = None,
        name: str = "test",
    ) -> None:
        self.call_tools = None if call_tools is None else tuple(call_tools)
        self.text = text
        self._name = name

    @property
    def spec(self) -> str:
        return f"test:{self._name}"

    async def aclose(self) -> None:
        """Nothing to release."""

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        since = _since_input(request)
        calls: tuple[ProposedCall, ...] = ()
        text = ""
        if not any(isinstance(m, AssistantMessage) for m in since):
            calls = tuple(
                ProposedCall(
                    call_id=f"test-{n}",
                    name=t.name,
                    arguments=json.dumps(example_for(t.parameters), ensure_ascii=False),
                )
                for n, t in enumerate(request.tools, start=1)
                if self.call_tools is None or t.name in self.call_tools
            )
        if not calls:
            text = self._answer(request, since)
            if on_text is not None:
                on_text(text)
        chars = len(request.system) + sum(len(_text_of(m)) for m in request.messages)
        out_chars = len(text) + sum(len(c.arguments) for c in calls)
        return ModelResponse(
            text=text,
            calls=calls,
            usage=Usage(input_tokens=max(1, chars // 4), output_tokens=max(1, out_chars // 4)),
            finish_reason="tool_calls" if calls else "stop",
        )

    def _answer(self, request: ModelRequest, since: Sequence[Any]) -> str:
        if request.output_schema is not None:
            return json.dumps(example_for(request.output_schema), ensure_ascii=False)
        if self.text is not None:
            return self.text
        results = {m.name: m.content for m in since if isinstance(m, ToolResultMessage)}
        return json.dumps(results, ensure_ascii=False) if results else "success (no tool calls)"


def _since_input(request: ModelRequest) -> list[Any]:
    out: list[Any] = []
    for m in reversed(request.messages):
        if isinstance(m, UserMessage) and m.source == "input":
            break
        out.append(m)
    out.reverse()
    return out


def _text_of(m: Any) -> str:
    if isinstance(m, UserMessage):
        return m.text
    if isinstance(m, ToolResultMessage):
        return m.content
    if isinstance(m, AssistantMessage):
        return m.text + "".join(c.arguments for c in m.calls)
    return ""


def example_for(schema: dict[str, Any], root: dict[str, Any] | None = None) -> Any:
    """A value that satisfies ``schema`` for the common shapes pydantic and MCP servers
    produce: types, enums, consts, defaults, bounds, ``$ref``, ``anyOf``, arrays, objects."""
    root = schema if root is None else root
    if "$ref" in schema:
        return example_for(_resolve(schema["$ref"], root), root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if options:
            usable = [o for o in options if o.get("type") != "null"] or options
            return example_for(usable[0], root)
    if schema.get("allOf"):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(_resolve(part["$ref"], root) if "$ref" in part else part)
        return example_for(merged, root)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "string":
        return _string(schema)
    if kind in ("integer", "number"):
        return _number(schema, integer=kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "array":
        if "prefixItems" in schema:
            return [example_for(s, root) for s in schema["prefixItems"]]
        count = max(int(schema.get("minItems", 1)), 1)
        count = min(count, int(schema.get("maxItems", count)))
        item = schema.get("items")
        return [example_for(item, root) if isinstance(item, dict) else "a"] * count
    properties = schema.get("properties", {})
    return {name: example_for(sub, root) for name, sub in properties.items()}


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    assert isinstance(node, dict)
    return node


_FORMATS = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def _string(schema: dict[str, Any]) -> str:
    if schema.get("format") in _FORMATS:
        return _FORMATS[schema["format"]]
    length = max(int(schema.get("minLength", 1)), 1)
    return "a" * min(length, int(schema.get("maxLength", length)))


def _number(schema: dict[str, Any], *, integer: bool) -> int | float:
    step = 1 if integer else 0.5
    value: float = 0
    if "minimum" in schema:
        value = max(value, schema["minimum"])
    if "exclusiveMinimum" in schema:
        value = max(value, schema["exclusiveMinimum"] + step)
    if "maximum" in schema:
        value = min(value, schema["maximum"])
    if "exclusiveMaximum" in schema:
        value = min(value, schema["exclusiveMaximum"] - step)
    return int(value) if integer else float(value)

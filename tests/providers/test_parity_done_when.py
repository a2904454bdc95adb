"""Issue 30's "done when", one turn per provider through the real adapter and a loopback
wire server that records every request: a pydantic tool result reaches the model as JSON,
``output_type`` travels as the provider's native schema, the model settings reach every
request, and an image given with the input reaches the provider in its own format. The
session's log verifies after. (Fallback switches, provider switches mid-session and money
budgets have their own tests: ``test_fallback``, ``test_provider_switch``,
``tests/engine/test_budgets.py``.)
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from wire_dialects import DIALECTS, Dialect
from wire_server import WireServer

from lodger import Agent, BinaryContent, tool
from lodger.events import StepStarted
from lodger.providers.anthropic import AnthropicModel
from lodger.providers.base import Model, ModelSettings
from lodger.storage import Storage

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
PNG_B64 = base64.b64encode(PNG).decode()


class Book(BaseModel):
    isbn: str
    title: str


class Verdict(BaseModel):
    title: str
    worth_reading: bool


@tool(recovery="idempotent")
def lookup(isbn: str) -> Book:
    """Look a book up by ISBN."""
    return Book(isbn=isbn, title="Dune")


def _values(node: Any) -> Iterator[Any]:
    """Every value in a JSON body, depth first (dict values, list items, the node)."""
    yield node
    if isinstance(node, dict):
        for value in node.values():
            yield from _values(value)
    elif isinstance(node, list):
        for item in node:
            yield from _values(item)


def _pairs(node: Any) -> Iterator[tuple[str, Any]]:
    for value in _values(node):
        if isinstance(value, dict):
            yield from value.items()


def _carries_book(body: Any) -> bool:
    """The tool's result is in the request as JSON (a JSON string, or an object)."""
    want = {"isbn": "1", "title": "Dune"}
    for value in _values(body):
        if value == want:
            return True
        if isinstance(value, str) and value.lstrip().startswith("{"):
            try:
                if json.loads(value) == want:
                    return True
            except ValueError:
                continue
    return False


def _native_schema(name: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """Where each provider's structured-output option carries the JSON schema."""
    where: dict[str, Callable[[dict[str, Any]], Any]] = {
        "openai_chat": lambda b: b["response_format"]["json_schema"]["schema"],
        "openai_responses": lambda b: b["text"]["format"]["schema"],
        "anthropic": lambda b: b["output_config"]["format"]["schema"],
        "gemini": lambda b: b["generationConfig"]["responseJsonSchema"],
    }
    try:
        schema = where[name](body)
    except (KeyError, TypeError):
        return None
    return schema if isinstance(schema, dict) else None


def _plain(dialect: Dialect) -> Callable[[WireServer], Model]:
    """The dialect's adapter without extended thinking (with it on, Anthropic's max_tokens
    must exceed the thinking budget, so the adapter raises the one asked for)."""
    if dialect.name != "anthropic":
        return dialect.model
    return lambda server: AnthropicModel(
        model="claude-test", base_url=server.base_url, api_key="sk-ant-test"
    )


@pytest.mark.parametrize("dialect", DIALECTS, ids=[d.name for d in DIALECTS])
async def test_results_schema_settings_and_images_reach_the_provider(
    tmp_path: Path, dialect: Dialect
) -> None:
    answer = json.dumps({"title": "Dune", "worth_reading": True})
    with WireServer() as server:
        server.push(dialect.call("call_1", "lookup", {"isbn": "1"}), dialect.answer(answer))
        storage = Storage.local(tmp_path / "state")
        model = _plain(dialect)(server)
        async with Agent(
            model=model,
            tools=[lookup],
            storage=storage,
            output_type=Verdict,
            model_settings=ModelSettings(temperature=0.25, max_tokens=321),
        ) as agent:
            result = await agent.run(["is this worth reading?", BinaryContent(PNG, "image/png")])
            events = await agent.session(result.session_id).events()
            await agent.session(result.session_id).verify()
        await model.aclose()
        await storage.close()
        bodies = [r.body for r in server.requests]
    assert result.status == "completed", result.error
    assert result.output == Verdict(title="Dune", worth_reading=True)
    assert len(bodies) == 2
    first, second = bodies
    # a pydantic tool result reaches the model as JSON, not a Python repr
    assert _carries_book(second), second
    assert "isbn='1'" not in json.dumps(second)
    for body in bodies:
        # output_type travels as the provider's native schema
        schema = _native_schema(dialect.name, body)
        assert schema is not None, body
        assert {"title", "worth_reading"} <= set(schema.get("properties", {})), schema
        # the settings reach every request
        assert ("temperature", 0.25) in list(_pairs(body)), body
        assert any("max" in key.lower() and value == 321 for key, value in _pairs(body)), body
    # the image reaches the provider, as base64 in its own image format
    assert PNG_B64 in json.dumps(first)
    # and the log says what was asked
    asked = [e.body.settings for e in events if isinstance(e.body, StepStarted)]
    assert asked == [{"temperature": 0.25, "max_tokens": 321}] * 2

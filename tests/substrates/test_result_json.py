"""A tool's return value reaches the model as JSON, serialized the way pydantic does it
(issue 30 item 1): models by their fields, never a Python repr. Real SQLite state; the
model is a FunctionModel that keeps what it read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from lodger import Agent, FunctionModel, ModelRequest, ModelResponse, ToolResultMessage, tool
from lodger import tool_call as call
from lodger.events import ToolResponded
from lodger.storage import Storage
from lodger.substrates.inprocess import result_execution


class Book(BaseModel):
    isbn: str
    title: str
    published: datetime.date


class Shelf(enum.Enum):
    SCIFI = "sci-fi"


@dataclasses.dataclass
class Placement:
    shelf: Shelf
    book_id: uuid.UUID
    where: Path


def _run(tmp_path: Path, value: Any) -> tuple[ToolResultMessage, ToolResponded]:
    seen: list[ToolResultMessage] = []

    @tool
    def lookup(isbn: str) -> Any:
        """Look a book up."""
        return value

    def model(request: ModelRequest) -> ModelResponse | str:
        results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
        if not results:
            return ModelResponse(calls=(call("lookup", isbn="1"),))
        seen.append(results[-1])
        return "ok"

    with Agent(model=FunctionModel(model), tools=[lookup], storage=tmp_path / "s") as agent:
        result = agent.run_sync("find it", session="s1")
        assert result.status == "completed"
    log = asyncio.run(_events(tmp_path))
    t2 = next(e.body for e in log if isinstance(e.body, ToolResponded))
    return seen[0], t2


async def _events(tmp_path: Path) -> list[Any]:
    storage = Storage.local(tmp_path / "s")
    try:
        return await storage.log.read_all("s1")
    finally:
        await storage.close()


def test_a_pydantic_model_reaches_the_model_as_json_not_a_repr(tmp_path: Path) -> None:
    read, t2 = _run(tmp_path, Book(isbn="1", title="Dune", published=datetime.date(1965, 8, 1)))
    assert json.loads(read.content) == {"isbn": "1", "title": "Dune", "published": "1965-08-01"}
    assert "isbn='1'" not in read.content
    assert t2.content == read.content and t2.status == "ok"  # T2 holds what the model read


def test_nested_values_pydantic_knows_are_json(tmp_path: Path) -> None:
    book_id = uuid.UUID(int=7)
    value = {
        "placements": [Placement(Shelf.SCIFI, book_id, Path("a/b"))],
        "tags": {"classic"},
        "cover": b"\x89PNG",
    }
    read, _ = _run(tmp_path, value)
    assert json.loads(read.content) == {
        "placements": [{"shelf": "sci-fi", "book_id": str(book_id), "where": "a/b"}],
        "tags": ["classic"],
        "cover": "iVBORw==",  # bytes as base64
    }


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (object(), "builtins.object"),
        ({"n": float("nan")}, "Out of range float"),
        ({(1, 2): "tuple key"}, "keys must be"),
    ],
)
def test_what_cannot_be_json_is_an_error_naming_the_tool_and_the_type(
    value: Any, named: str
) -> None:
    execution = result_execution("lookup", value)
    assert execution.status == "error"
    assert execution.content.startswith("lookup returned a value of type ")
    assert type(value).__name__ in execution.content and named in execution.content

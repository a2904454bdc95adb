"""Code cells get structured values from nested calls (issue 30 item 9): ``read_file``
gives a cell the file's lines without numbers (a result that is JSON text, as a JSON file
is, reaches the cell parsed), a tool returning a pydantic model gives an object, and the
nested call's T2 records exactly the text the cell's value came from. The model's
own calls keep the readable form. Real V8 and Monty cells.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cell_harness import Cells, cell_result, make_agent
from pydantic import BaseModel

from lodger.events import ToolResponded
from lodger.tools import Tool, tool
from lodger.tools.files import read_file


class Book(BaseModel):
    isbn: str
    title: str


@tool(nestable=True)
def book(isbn: str) -> Book:
    """Look a book up."""
    return Book(isbn=isbn, title="Dune")


TOOLS: list[Tool] = [read_file, book]
CONFIG = {"name": "lodger", "workers": 3}


def _workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    (ws / "rows.csv").write_text("id,name\n1,ada\n2,grace\n")


async def _nested_t2s(agent: object) -> list[str]:
    events = await agent.session("s").events()  # type: ignore[attr-defined]
    return [
        e.body.content
        for e in events
        if e.parent_call_id == "cell0" and isinstance(e.body, ToolResponded)
    ]


async def test_a_javascript_cell_gets_a_json_file_and_a_model_as_objects(tmp_path: Path) -> None:
    _workspace(tmp_path)
    model = Cells(
        "const config = await tools.read_file({path: 'config.json'});\n"
        "const b = await tools.book({isbn: '1'});\n"
        "return {name: config.name, workers: config.workers, title: b.title};"
    )
    agent = make_agent(tmp_path, model, TOOLS)
    result = await agent.run("go", session="s")
    assert result.status == "completed"
    events = await agent.session("s").events()
    status, content = cell_result(events)
    assert (status, content["result"]) == ("ok", {"name": "lodger", "workers": 3, "title": "Dune"})
    # T2 of each nested call is what the cell got: the file's text as it is, the model as JSON
    t2s = await _nested_t2s(agent)
    assert t2s[0] == json.dumps(CONFIG, indent=2)
    assert json.loads(t2s[1]) == {"isbn": "1", "title": "Dune"}
    await agent.close()


async def test_a_python_cell_splits_lines_without_numbers(tmp_path: Path) -> None:
    _workspace(tmp_path)
    code = (
        "text = await read_file(path='rows.csv')\n"
        "b = await book(isbn='2')\n"
        "{'rows': text.splitlines()[1:], 'title': b['title']}"
    )
    agent = make_agent(tmp_path, Cells(code), TOOLS, language="python")
    result = await agent.run("go", session="s")
    assert result.status == "completed"
    status, content = cell_result(await agent.session("s").events())
    assert (status, content["result"]) == ("ok", {"rows": ["1,ada", "2,grace"], "title": "Dune"})
    await agent.close()


@pytest.mark.parametrize("nested", [False, True])
async def test_the_model_keeps_numbered_lines_and_a_cell_never_gets_a_cut_file(
    tmp_path: Path, nested: bool
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "wide.txt").write_text("x" * 5000 + "\n")
    (ws / "rows.csv").write_text("id,name\n1,ada\n")
    if nested:
        model = Cells(
            "const rows = await tools.read_file({path: 'rows.csv'});\n"
            "let wide; try { await tools.read_file({path: 'wide.txt'}); } "
            "catch (e) { wide = String(e.message || e); }\n"
            "return {rows, wide};"
        )
        agent = make_agent(tmp_path, model, TOOLS)
        await agent.run("go", session="s")
        t2s = await _nested_t2s(agent)
        assert t2s[0] == "id,name\n1,ada"
        assert "too large for one read_file in a code cell" in t2s[1]
    else:
        from lodger import Agent, ScriptedModel

        script = [{"calls": [{"name": "read_file", "args": {"path": "rows.csv"}}]}, {"text": "ok"}]
        agent = Agent(
            model=ScriptedModel(script), tools=TOOLS, workspace=ws, storage=tmp_path / "st"
        )
        await agent.run("go", session="s")
        events = await agent.session("s").events()
        (t2,) = [e.body.content for e in events if isinstance(e.body, ToolResponded)]
        assert t2 == "     1\tid,name\n     2\t1,ada"
    await agent.close()

"""TestModel leaves tools that write alone unless asked (issue 30 item 10): ``lodger run
--model test`` in a directory leaves the directory as it was. A real ``lodger`` process
over the built-in workspace tools, and library agents over SQLite.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lodger import Agent, TestModel, tool
from lodger.errors import UsageError
from lodger.events import ToolDispatched
from lodger.storage import Storage


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".lodger" not in p.parts
    }


async def _dispatched(state: Path) -> list[str]:
    storage = Storage.local(state)
    try:
        (session,) = await storage.log.list_sessions()
        events = await storage.log.read_all(session)
        return [e.body.tool for e in events if isinstance(e.body, ToolDispatched)]
    finally:
        await storage.close()


def test_lodger_run_with_the_test_model_leaves_the_directory_unchanged(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("print('hi')\n")
    before = _tree(tmp_path)
    ran = subprocess.run(
        [sys.executable, "-m", "lodger", "run", "look around", "--model", "test"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
        env={**os.environ, "LODGER_MODEL": ""},
    )
    assert ran.returncode == 0, ran.stderr
    assert _tree(tmp_path) == before  # no file made, changed or removed
    called = asyncio.run(_dispatched(tmp_path / ".lodger"))
    assert called, "the test model called no tool at all"
    assert not {"write_file", "edit_file", "shell", "run_python"} & set(called), called


def _agent(tmp_path: Path, model: TestModel, wrote: list[str]) -> Agent:
    @tool
    def lookup(key: str) -> str:
        """Read a value."""
        return "v"

    @tool(writes=True)
    def store(key: str) -> str:
        """Store a value."""
        wrote.append(key)
        return "stored"

    @tool(approval=True)
    def deploy(target: str) -> str:
        """Deploy (needs approval)."""
        wrote.append(target)
        return "deployed"

    return Agent(model=model, tools=[lookup, store, deploy], storage=tmp_path / "state")


def test_tools_that_write_or_need_approval_run_only_when_asked(tmp_path: Path) -> None:
    wrote: list[str] = []
    with _agent(tmp_path / "a", TestModel(), wrote) as agent:
        result = agent.run_sync("go")
    assert result.status == "completed" and wrote == []
    assert '"lookup"' in (result.answer or "")  # the read-only tool ran

    with _agent(tmp_path / "b", TestModel(call_tools=["store"]), wrote) as agent:
        agent.run_sync("go")
    assert wrote == ["a"]  # named: it runs

    wrote.clear()
    with _agent(tmp_path / "c", TestModel(call_tools="all"), wrote) as agent:
        agent.run_sync("go")
    assert wrote == ["a"]  # all: store ran; deploy asked and nobody approved


def test_one_tool_name_instead_of_a_list_is_refused() -> None:
    with pytest.raises(UsageError, match="not a list"):
        TestModel(call_tools="store")

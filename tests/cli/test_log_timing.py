"""``lodger log show --timing``: per-call wait and run times and overlap, from the log."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lodger.authority import ResourceClaim
from lodger.cli import main
from lodger.cli._timing import step_timings
from lodger.engine.settings import Services
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.testing import MemoryArtifactStore
from lodger.tools import Tool, ToolContext, tool


def _claim(arguments: dict[str, Any], ctx: ToolContext) -> list[ResourceClaim]:
    return [ResourceClaim.file(ctx.require_workspace() / arguments["path"], mode="write")]


def _tools() -> list[Tool]:
    meet = asyncio.Barrier(2)

    @tool(claims=_claim)
    async def together(path: str) -> str:
        """Runs only when its partner runs at the same time."""
        await meet.wait()
        return path

    @tool(claims=_claim)
    async def alone(path: str) -> str:
        """Yields once."""
        await asyncio.sleep(0)
        return path

    return [together, alone]


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """Session "s1": step 0 runs two independent calls, step 1 two conflicting ones."""
    script = [
        {"calls": [{"name": "together", "args": {"path": p}} for p in ("a", "b")]},
        {"calls": [{"name": "alone", "args": {"path": "c"}} for _ in range(2)]},
        {"text": "done"},
    ]
    (tmp_path / "ws").mkdir()

    async def run() -> None:
        agent = Agent(
            model=ScriptedModel(script),
            tools=_tools(),
            storage=Storage(
                log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
            ),
            workspace=tmp_path / "ws",
            services=Services(clock=ManualClock(tick_us=1000), ids=SequentialIds("id")),
        )
        async with agent:
            assert (await agent.run("go", session="s1")).status == "completed"

    asyncio.run(run())
    return tmp_path / "state"


def _show(state: Path, *extra: str) -> str:
    runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "LODGER_STATE": None})
    args = ["log", "show", "s1", "--state", str(state), "--timing", *extra]
    result = runner.invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_timing_shows_overlap_and_serialization(state: Path) -> None:
    lines = _show(state).splitlines()
    headers = [line for line in lines if line.startswith("step ")]
    assert len(headers) == 2
    assert "2 call(s)" in headers[0] and "x parallel" in headers[0]
    calls = [line for line in lines if line.startswith("  call-")]
    assert [line.split()[0] for line in calls] == ["call-0-1", "call-0-2", "call-1-1", "call-1-2"]
    assert all(" wait " in line and " run " in line and line.count("|") == 2 for line in calls)
    bars = [line.split("|")[1] for line in calls]
    # Step 0: both bars cover a common instant; step 1: the second starts after the first.
    assert any(x == y == "#" for x, y in zip(bars[0], bars[1], strict=True))
    assert bars[3].index("#") >= bars[2].rindex("#")


def test_timing_json_is_computed_from_the_log(state: Path) -> None:
    steps = json.loads(_show(state, "--json"))["steps"]
    assert [s["index"] for s in steps] == [0, 1]
    assert steps[0]["parallelism"] > 1.0  # the two calls ran at once
    assert steps[1]["parallelism"] <= 1.0  # the two edits of one file took turns
    second = steps[1]["calls"][1]
    assert second["wait_us"] > steps[0]["calls"][1]["wait_us"]  # it waited for the lease
    assert {c["status"] for s in steps for c in s["calls"]} == {"ok"}


def test_no_dispatched_calls_says_so() -> None:
    assert step_timings([]) == []

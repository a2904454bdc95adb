"""``lodger log show`` gives ``call_accepted`` a line (its handle, whether the turn waits)
and shows a call the remote side still runs as ``running``; its result, when it comes,
as the call's T2."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner
from tests.tools.idempotent_server import serve
from tests.tools.remote_tools import build_tool

from lodger import Agent, ScriptedModel
from lodger.cli import main

BUILD = {"calls": [{"name": "build", "args": {"target": "app"}}]}


def show(state: Path) -> str:
    env = {"COLUMNS": "200", "NO_COLOR": "1", "LODGER_STATE": None, "LODGER_DEBUG": None}
    result = CliRunner(env=env).invoke(
        main, ["log", "show", "s1", "--state", str(state), "--all"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return result.stdout


def test_log_show_has_a_line_for_call_accepted_and_a_running_state(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with serve() as (base, ledger):
        turns = [[BUILD, {"text": "started"}], [{"text": "done"}]]

        async def first() -> None:
            async with Agent(
                model=ScriptedModel(turns=turns), tools=[build_tool(base)], storage=state
            ) as agent:
                await agent.run("build", session="s1")

        asyncio.run(first())
        out = show(state)
        assert "accepted  op=" in out and "running remotely, turn continues" in out
        assert 'handle={"job": "job-1"}' in out
        call = next(line for line in out.splitlines() if "call build(" in line)
        assert "running" in call and "no response" in call

        ledger.jobs["job-1"] = "app built"

        async def second() -> None:
            async with Agent(
                model=ScriptedModel(turns=turns[1:]), tools=[build_tool(base)], storage=state
            ) as agent:
                await agent.run("anything?", session="s1")

        asyncio.run(second())
    out = show(state)
    assert 'T2 ok  "build finished: app built"' in out

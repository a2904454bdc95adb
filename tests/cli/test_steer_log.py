"""``lodger log show`` gives every steering and queue fact a line of its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from lodger import Agent, FunctionModel, tool
from lodger.cli import main
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import tool_call


async def _session(state: Path) -> None:
    running, release = asyncio.Event(), asyncio.Event()

    @tool
    async def wait_here() -> str:
        """Wait until released."""
        running.set()
        await release.wait()
        return "ok"

    def model(request: ModelRequest) -> ModelResponse:
        if any(isinstance(m, ToolResultMessage) for m in request.messages):
            return ModelResponse(text="done")
        return ModelResponse(calls=(tool_call("wait_here"),))

    async with Agent(model=FunctionModel(model), tools=[wait_here], storage=state) as agent:
        turn = asyncio.create_task(agent.run("go", session="s1"))
        await running.wait()
        await agent.steer("s1", "mind the tests", who="cli:ana")
        queued = await agent.enqueue("s1", "next please", who="cli:bo")
        await agent.edit_queued("s1", queued.message_id, text="next, please", who="cli:bo")
        release.set()
        await turn
        gone = await agent.enqueue("s1", "never mind")
        await agent.retract_queued("s1", gone.message_id, who="cli:ana")
        await agent.run_queued("s1")


def test_log_show_has_a_line_for_each_steering_fact(tmp_path: Path) -> None:
    state = tmp_path / "state"
    asyncio.run(_session(state))
    env = {"COLUMNS": "200", "NO_COLOR": "1", "LODGER_STATE": None, "LODGER_DEBUG": None}
    result = CliRunner(env=env).invoke(
        main, ["log", "show", "s1", "--state", str(state), "--all"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "steer received" in out and '"mind the tests"' in out and "by cli:ana" in out
    assert "steer delivered  at step 1:" in out
    assert "message queued" in out and "policy=enqueue" in out and "by cli:bo" in out
    assert "queue edit" in out and '"next, please"' in out
    assert "queue retract" in out
    assert "queue delivered" in out

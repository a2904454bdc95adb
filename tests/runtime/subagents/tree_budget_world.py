"""The agent of the tree-budget crash test, run in a child process
(``python tree_budget_world.py STATE MODE``): the parent delegates a first child that
spends the whole tree budget (3 steps of 3), then calls ``hold``, then delegates again.

Modes: ``crash`` SIGKILLs the process inside ``hold`` (the first child settled, the
parent's delegate T2 committed); ``none`` runs on (the resume, in the test's process).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from subagent_world import routed

from lodger import Agent, tool
from lodger.events import ToolDispatched
from lodger.runtime.subagents import SubagentPolicy
from lodger.tools.spec import ProbeResult, ToolContext

PARENT_TASK = "parent task"
TREE_STEPS = 3


def budget_agent(state: Path, mode: str) -> Agent:
    async def held(dispatched: ToolDispatched, ctx: ToolContext) -> ProbeResult:
        return ProbeResult(applied=True, observation="held", content="held")

    @tool(recovery="queryable", probe=held)
    def hold() -> str:
        """Wait here."""
        if mode == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        return "held"

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    first = {"name": "delegate", "args": {"task": "first", "budget": {"steps": 5}}}
    second = {"name": "delegate", "args": {"task": "second"}}
    parent = [
        {"calls": [first]},
        {"calls": [{"name": "hold", "args": {}}]},
        {"calls": [second]},
        {"text": "parent done"},
    ]
    three_steps = [
        {"calls": [{"name": "add", "args": {"a": 1, "b": 1}}]},
        {"calls": [{"name": "add", "args": {"a": 2, "b": 2}}]},
        {"text": "4"},
    ]
    return Agent(
        model=routed({PARENT_TASK: parent, "first": three_steps, "second": [{"text": "no"}]}),
        tools=[add, hold],
        storage=state,
        subagents=SubagentPolicy(tree_steps=TREE_STEPS),
    )


async def _main(state: Path, mode: str) -> None:
    async with budget_agent(state, mode) as agent:
        await agent.run(PARENT_TASK, session="parent-1")


if __name__ == "__main__":
    asyncio.run(_main(Path(sys.argv[1]), sys.argv[2]))

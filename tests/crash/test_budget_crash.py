"""Budgets are read from the log: a process SIGKILLed mid-turn loses none of the spend
it committed, so the resume in another process parks on it (and a raised budget goes on)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

from budget_world import PER_REQUEST, PRICES, budget_agent

from lodger.engine.budgets import Budgets
from lodger.events import BudgetReached, ModelOutput, ToolDispatched

WORLD = Path(__file__).with_name("budget_world.py")


def _crash(state: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(WORLD), str(state), "crash"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


async def test_spend_before_a_sigkill_counts_in_the_resume(tmp_path: Path) -> None:
    state = tmp_path / "state"
    await asyncio.to_thread(_crash, state)
    exact = Budgets(session_usd=PER_REQUEST / 1_000_000, prices=PRICES)
    async with budget_agent(state, "none", exact) as agent:
        before = await agent.log.read_all("s")
        assert before[-1].body.kind == "tool_dispatched"  # killed inside hold, after T1
        parked = await agent.resume("s")
        after = await agent.log.read_all("s")
    assert parked.status == "parked"
    assert parked.budget == BudgetReached(
        budget="session_cost",
        limit=PER_REQUEST,
        spent=PER_REQUEST,
        unit="micro_usd",
        scope="session",
    )
    # the resume settled the interrupted call first (idempotent: run again once), then
    # parked before asking the model anything
    assert sum(isinstance(e.body, ModelOutput) for e in after) == 1
    assert sum(isinstance(e.body, ToolDispatched) for e in after) == 2
    raised = Budgets(session_usd="0.01", prices=PRICES)
    async with budget_agent(state, "none", raised) as agent:
        done = await agent.resume("s")
    assert done.status == "completed" and done.answer == "done"
    assert len(done.usage.requests) == 2  # the killed run's request and the resumed one

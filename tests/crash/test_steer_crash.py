"""SIGKILL around a steer's delivery: the log verifies, and after the resume the steer
has been delivered exactly once and the model read it exactly once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from steer_world import STEER, steer_agent, steers_seen

from lodger.events import SteerDelivered, SteerReceived, TurnEnded
from lodger.providers.base import ModelRequest

WORLD = Path(__file__).with_name("steer_world.py")


def _crash(state: Path, mode: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(WORLD), str(state), mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


@pytest.mark.parametrize("mode", ["before", "after"])
async def test_a_steer_killed_around_its_delivery_is_delivered_once(
    tmp_path: Path, mode: str
) -> None:
    state = tmp_path / "state"
    await asyncio.to_thread(_crash, state, mode)
    requests: list[ModelRequest] = []
    async with steer_agent(state, "none", requests) as agent:
        await agent.log.verify("s")
        before = await agent.log.read_all("s")
        assert sum(isinstance(e.body, SteerReceived) for e in before) == 1
        delivered = sum(isinstance(e.body, SteerDelivered) for e in before)
        assert delivered == (1 if mode == "after" else 0)
        assert not any(isinstance(e.body, TurnEnded) for e in before)
        result = await agent.resume("s")
        after = await agent.log.read_all("s")
        await agent.log.verify("s")
    assert result.status == "completed"
    assert result.answer == f"done: {STEER}"
    assert sum(isinstance(e.body, SteerDelivered) for e in after) == 1
    assert [steers_seen(r) for r in requests] == [[STEER]]  # the resumed run's one request

"""Steering sessions that run on workers, over real parts: a real PostgreSQL control
plane, a ``file://`` object store, a real ``lodger worker`` subprocess and the host on
loopback. A steer for a session a worker runs reaches its running turn through the
control plane (``session_steers``) and is delivered at the next step; a steer for a
dormant session is a wake, run as its next turn."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lodger.client import HostClient

from ._support import Setup
from .test_distributed import distributed_host, setup, worker

__all__ = ["setup"]  # the fixture, imported for pytest

pytestmark = pytest.mark.slow


async def _facts(client: HostClient, sid: str, kind: str, count: int) -> list[dict]:  # type: ignore[type-arg]
    """The session's facts once ``count`` of ``kind`` are in (polled, bounded)."""
    async with asyncio.timeout(60):
        while True:
            facts = await client.events(sid)
            if sum(f.kind == kind for f in facts) >= count:
                return [f.data for f in facts]
            await asyncio.sleep(0.05)


async def test_a_steer_reaches_a_worker_run_turn_and_a_dormant_session_wakes(
    setup: Setup, gates: Path
) -> None:
    setup.script([{"calls": [{"name": "gate", "args": {"name": "g"}}]}, {"text": "done"}])
    async with distributed_host(setup) as host, host.client() as client:
        sid = await client.create_session(session_id="st1")
        await client.send(sid, "go", key="1")
        with worker(setup):
            async with asyncio.timeout(60):
                while not (gates / "g.starts").exists():  # noqa: ASYNC110 - the worker's tool
                    await asyncio.sleep(0.02)
            steered = await client.steer(sid, "check the README too")
            assert steered["status"] == "steer" and steered["offset"] is None
            async with asyncio.timeout(60):  # the worker takes it into the running turn
                while True:
                    facts = [f.data for f in await client.events(sid)]
                    if any(f["kind"] == "steer_received" for f in facts):
                        break
                    await asyncio.sleep(0.05)
            (gates / "g").touch()
            facts = await _facts(client, sid, "turn_ended", 1)
            received = [f["body"] for f in facts if f["kind"] == "steer_received"]
            assert [(r["steer_id"], r["text"]) for r in received] == [
                (steered["steer_id"], "check the README too")
            ]
            assert received[0]["who"].startswith("token:")
            delivered = [f["body"] for f in facts if f["kind"] == "steer_delivered"]
            assert delivered == [
                {"kind": "steer_delivered", "steer_ids": [steered["steer_id"]], "step": 1}
            ]
            # the session is dormant once the worker lets it go: a steer is its next turn
            async with asyncio.timeout(60):
                while (await client.show(sid))["running"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            later = await client.steer(sid, "and then this")
            assert later["status"] == "queued"
            facts = await _facts(client, sid, "turn_ended", 2)
        inputs = [f["body"]["input"] for f in facts if f["kind"] == "turn_started"]
        assert inputs == ["go", "and then this"]
        assert sum(f["kind"] == "steer_received" for f in facts) == 1  # never twice
        assert await host.plane.take_steers(session_id=sid, holder="test") == []
        # the follow-up queue is the control plane's (tests/host/test_distributed_queue.py)
        assert (await client.queue(sid))["messages"] == []

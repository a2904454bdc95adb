"""``POST /v1/sessions/{id}/messages`` with a ``policy`` on the embedded host, over a
real host on loopback and a SQLite store: ``reject`` is refused while a turn runs and
taken when idle; ``interrupt`` stops the running turn once its call settles (it ends
cancelled) and runs before an older waiting message; ``rollback`` abandons it; a repeat
of the same key stops nothing twice."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lodger.client import HostClient
from lodger.errors import HostConflictError

from ._support import running_host, write_script

pytestmark = pytest.mark.slow

GATED = [{"calls": [{"name": "gate", "args": {"name": "g"}}]}, {"text": "done"}]


async def _turns(client: HostClient, sid: str, count: int) -> list[tuple[str, str]]:
    async with asyncio.timeout(60):
        while True:
            facts = [f.data for f in await client.events(sid)]
            ends = [f["body"]["status"] for f in facts if f["kind"] == "turn_ended"]
            if len(ends) >= count:
                inputs = [f["body"]["input"] for f in facts if f["kind"] == "turn_started"]
                return list(zip(inputs, ends, strict=False))
            await asyncio.sleep(0.05)


async def _gate_started(gates: Path) -> None:
    async with asyncio.timeout(60):
        while not (gates / "g.starts").exists():  # noqa: ASYNC110 - the host's tool
            await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    ("policy", "ended"), [("interrupt", "cancelled"), ("rollback", "abandoned")]
)
async def test_an_urgent_message_stops_the_turn_and_runs_first(
    tmp_path: Path, gates: Path, policy: str, ended: str
) -> None:
    model = write_script(tmp_path / "script.json", GATED)
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session(session_id="p1")
        await c.send(sid, "go", key="1")
        await _gate_started(gates)
        with pytest.raises(HostConflictError) as refused:
            await c.send(sid, "not while busy", key="r", policy="reject")
        assert refused.value.code == "session_busy"
        await c.send(sid, "older", key="2")
        sent = await c.send(sid, "urgent", key="3", policy=policy)
        repeat = await c.send(sid, "urgent", key="3", policy=policy)
        assert repeat["created"] is False and repeat["message"]["id"] == sent["message"]["id"]
        (gates / "g").touch()
        turns = await _turns(c, sid, 3)
        assert turns == [("go", ended), ("urgent", "completed"), ("older", "completed")]
        done: dict[str, Any] = await c.wait_message(sid, sent["message"]["id"])
        assert done["status"] == "done"
        # idle now: reject is taken
        taken = await c.send(sid, "now it is fine", key="r2", policy="reject")
        assert (await c.wait_message(sid, taken["message"]["id"]))["status"] == "done"
        assert (await _turns(c, sid, 4))[3] == ("now it is fine", "completed")

"""The console's routes on a distributed host (a real PostgreSQL control plane, a
``file://`` store, a real ``lodger worker``): the session list sees the worker's turn and
its parked call, the approval carries its arguments, and an "always" is refused (the
control plane records allow or deny) while an allow goes through."""

from __future__ import annotations

import asyncio

import httpx2
import pytest

from ._support import Setup
from .test_distributed import distributed_host, setup, worker

pytestmark = pytest.mark.slow

__all__ = ["setup"]  # the fixture, used by name


async def test_the_console_routes_over_a_distributed_host(setup: Setup) -> None:
    setup.script([{"calls": [{"name": "deploy", "args": {"target": "prod"}}]}, {"text": "over"}])
    with worker(setup):
        async with (
            distributed_host(setup) as host,
            host.client() as c,
            httpx2.AsyncClient(
                base_url=host.url, headers={"Authorization": f"Bearer {host.token}"}
            ) as http,
        ):
            sid = await c.create_session(session_id="dc1")
            sent = await c.send(sid, "ship it", key="1")
            async with asyncio.timeout(60):
                while not (pending := await c.approvals(sid)):  # noqa: ASYNC110 - a worker
                    await asyncio.sleep(0.05)
            (listed,) = (await http.get("/v1/approvals")).json()["approvals"]
            assert listed["arguments"] == '{"target": "prod"}'
            rows = (await http.get("/v1/console/sessions")).json()["sessions"]
            assert [(r["session_id"], r["status"], r["parked"]) for r in rows] == [
                (sid, "waiting_approval", 1)
            ]
            call = pending[0]["call_id"]
            refused = await http.post(
                f"/v1/sessions/{sid}/approvals/{call}", json={"decision": "always"}
            )
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "usage"
            await c.answer(sid, call, allow=True)
            done = await c.wait_message(sid, sent["message"]["id"], within=60)
            assert done["status"] == "done"
            async with asyncio.timeout(30):
                while await _status(http) != "completed":  # noqa: ASYNC110 - a worker's facts
                    await asyncio.sleep(0.05)
            usage = (await http.get(f"/v1/sessions/{sid}/usage")).json()
            assert usage["turns"][0]["status"] == "completed"


async def _status(http: httpx2.AsyncClient) -> str:
    return str((await http.get("/v1/console/sessions")).json()["sessions"][0]["status"])

"""The console's JSON routes against a real host and store: the session list with its
columns and filters (status, parked calls, cost, parents), each turn's usage priced with
the host's table, approvals with their arguments, and the static pages' headers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2

from lodger.engine.budgets import Budgets
from lodger.engine.prices import ModelPrice, PriceTable
from lodger.events import Usage

from ._support import running_host, write_script

#: the host's ``test`` model runs as ``test:test``: priced here, free by default
PRICES = PriceTable.defaults().with_prices({"test:test": ModelPrice.of(2, 1, 8)})


async def test_the_session_list_shows_status_cost_and_parents(tmp_path: Path) -> None:
    async with (
        running_host(tmp_path / "state", budgets=Budgets(prices=PRICES)) as host,
        host.client() as c,
        httpx2.AsyncClient(
            base_url=host.url, headers={"Authorization": f"Bearer {host.token}"}
        ) as http,
    ):
        sid = await c.create_session(session_id="priced")
        for i, text in enumerate(("hello there", "and a second turn")):
            sent = await c.send(sid, text, key=str(i))
            await c.wait_message(sid, sent["message"]["id"])
        starts = [f.offset for f in await c.events(sid) if f.kind == "turn_started"]
        fork = await c.fork(sid, at=starts[1])  # the first turn, not the second
        await c.create_session(session_id="empty")
        rows = {
            r["session_id"]: r for r in (await http.get("/v1/console/sessions")).json()["sessions"]
        }
        facts = await c.events(sid)
        outputs = [f.data for f in facts if f.kind == "model_output"]
        expected = sum(ModelPrice.of(2, 1, 8).cost(_usage(o["body"]["usage"])) for o in outputs)
        assert expected > 0
        row = rows[sid]
        assert row["status"] == "completed" and row["turns"] == 2 and row["parked"] == 0
        assert row["cost_micro_usd"] == expected
        assert row["events"] == len(facts) and row["last_activity_us"] == facts[-1].data["ts"]
        assert row["last_input"] == "and a second turn"
        forked = rows[fork]
        assert (forked["parent"], forked["relation"]) == (sid, "fork")
        # a copy-free fork: its columns count its own events (the prefix is its parent's)
        assert (forked["events"], forked["turns"], forked["status"]) == (1, 0, "new")
        assert forked["cost_micro_usd"] == 0
        assert rows["empty"]["status"] == "new" and rows["empty"]["events"] == 0
        # filters on the server too
        found = (await http.get("/v1/console/sessions", params={"q": "PRIC"})).json()
        assert [r["session_id"] for r in found["sessions"]] == [sid]
        found = (await http.get("/v1/console/sessions", params={"status": "new"})).json()
        assert sorted(r["session_id"] for r in found["sessions"]) == sorted([fork, "empty"])
        # a session's token sees only its own session
        mine = await c.make_token(session_id="empty")
        only = await http.get("/v1/console/sessions", headers={"Authorization": f"Bearer {mine}"})
        assert [r["session_id"] for r in only.json()["sessions"]] == ["empty"]
        # each turn's usage, priced; the total is the sum
        usage = (await http.get(f"/v1/sessions/{sid}/usage")).json()
        assert [t["input"] for t in usage["turns"]] == ["hello there", "and a second turn"]
        assert sum(t["cost_micro_usd"] for t in usage["turns"]) == expected
        assert usage["total"]["cost_micro_usd"] == expected
        assert usage["total"]["output_tokens"] == sum(
            o["body"]["usage"]["output_tokens"] for o in outputs
        )
        refused = await http.get(
            f"/v1/sessions/{sid}/usage", headers={"Authorization": f"Bearer {mine}"}
        )
        assert refused.status_code == 403


async def test_approvals_carry_the_call_arguments(tmp_path: Path, gates: Path) -> None:
    model = write_script(
        tmp_path / "s.json",
        [{"calls": [{"name": "deploy", "args": {"target": "<prod>"}}]}, {"text": "done"}],
    )
    async with (
        running_host(tmp_path / "state", models=(model,)) as host,
        host.client() as c,
        httpx2.AsyncClient(
            base_url=host.url, headers={"Authorization": f"Bearer {host.token}"}
        ) as http,
    ):
        sid = await c.create_session()
        sent = await c.send(sid, "deploy", key="1")
        async with asyncio.timeout(20):
            while not await c.approvals():  # noqa: ASYNC110 - another task parks it
                await asyncio.sleep(0.02)
        (approval,) = (await http.get("/v1/approvals")).json()["approvals"]
        assert approval["arguments"] == '{"target": "<prod>"}'
        rows = (await http.get("/v1/console/sessions")).json()["sessions"]
        assert (rows[0]["status"], rows[0]["parked"]) == ("waiting_approval", 1)
        answered = await http.post(
            f"/v1/sessions/{sid}/approvals/{approval['call_id']}", json={"decision": "always"}
        )
        assert answered.json()["status"] == "allow"
        done = await c.wait_message(sid, sent["message"]["id"])
        assert done["result"]["answer"] == "done"
        facts = await c.events(sid)
        (decided,) = [f.data["body"] for f in facts if f.kind == "permission_decided"]
        assert decided["decision"] == "allow" and decided["who"].startswith("token:tok_")
        assert "always" in decided["reason"]
        # the console's page and assets: static, no token, a strict CSP
        async with httpx2.AsyncClient(base_url=host.url) as anonymous:
            page = await anonymous.get("/console")
        assert page.status_code == 200
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


def _usage(raw: dict[str, int]) -> Usage:
    return Usage(**raw)

"""A call that asks for approval in a hosted run parks as a pending approval, visible over
the API and the stream; an answer from any client continues the run; two answers at once
give one decision."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lodger.client import HostClient, StreamedFact
from lodger.errors import HostConflictError, UsageError

from ._support import running_host, write_script

SCRIPT = [{"calls": [{"name": "deploy", "args": {"target": "prod"}}]}, {"text": "over"}]


async def _until(client: HostClient, sid: str, kind: str, seen: list[StreamedFact]) -> StreamedFact:
    async for fact in client.stream(sid, after=seen[-1].offset if seen else None):
        seen.append(fact)
        if fact.kind == kind:
            return fact
    raise AssertionError("stream ended")


@pytest.mark.slow
@pytest.mark.parametrize("allow", [True, False])
async def test_an_answer_from_another_client_continues_the_run(tmp_path: Path, allow: bool) -> None:
    model = write_script(tmp_path / "s.json", SCRIPT)
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as operator:
        sid = await operator.create_session()
        token = await operator.make_token(session_id=sid, label="reviewer")
        async with host.client(token) as reviewer:
            sent = await operator.send(sid, "ship it", key="1")
            seen: list[StreamedFact] = []
            asked = await asyncio.wait_for(_until(reviewer, sid, "permission_requested", seen), 30)
            call_id = asked.data["call_id"]
            pending = await reviewer.approvals(sid)
            assert [(p["call_id"], p["tool"], p["status"]) for p in pending] == [
                (call_id, "deploy", "pending")
            ]
            assert [p["call_id"] for p in await operator.approvals()] == [call_id]
            metrics = await operator.metrics()
            assert "lodger_host_pending_approvals 1" in metrics
            decided = await reviewer.answer(sid, call_id, allow=allow)
            assert decided["status"] == ("allow" if allow else "deny")
            done = await operator.wait_message(sid, sent["message"]["id"])
            assert done["status"] == "done"
            facts = await operator.events(sid)
            decision = [f for f in facts if f.kind == "permission_decided"]
            assert [(d.data["body"]["decision"], d.data["body"]["by"]) for d in decision] == [
                ("allow" if allow else "deny", "user")
            ]
            responded = [f for f in facts if f.kind == "tool_responded"]
            rejected = [f for f in facts if f.kind == "call_rejected"]
            if allow:
                assert responded[0].data["body"]["content"] == "deployed prod"
            else:
                assert not responded and rejected[0].data["body"]["reason"] == "denied"
            assert await operator.approvals() == []
            with pytest.raises(HostConflictError) as late:
                await operator.answer(sid, call_id, allow=True)
            assert late.value.code == "already_answered"


async def test_two_answers_at_once_give_one_decision(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", SCRIPT)
    async with (
        running_host(tmp_path / "state", models=(model,)) as host,
        host.client() as a,
        host.client() as b,
    ):
        sid = await a.create_session()
        sent = await a.send(sid, "ship it", key="1")
        seen: list[StreamedFact] = []
        asked = await asyncio.wait_for(_until(a, sid, "permission_requested", seen), 30)
        call_id = asked.data["call_id"]
        results = await asyncio.gather(
            a.answer(sid, call_id, allow=True),
            b.answer(sid, call_id, allow=False),
            return_exceptions=True,
        )
        wins = [r for r in results if isinstance(r, dict)]
        losses = [r for r in results if isinstance(r, HostConflictError)]
        assert len(wins) == 1 and len(losses) == 1, results
        assert losses[0].code == "already_answered"
        await a.wait_message(sid, sent["message"]["id"])
        facts = await a.events(sid)
        decided = [f.data["body"]["decision"] for f in facts if f.kind == "permission_decided"]
        assert decided == [wins[0]["status"]]  # the log holds the winner's decision, once


async def test_answering_an_unknown_call_is_404(tmp_path: Path) -> None:
    async with running_host(tmp_path / "state") as host, host.client() as c:
        sid = await c.create_session()
        with pytest.raises(UsageError) as caught:
            await c.answer(sid, "call-nope", allow=True)
        assert caught.value.code == "no_such_call"
        assert caught.value.status == 404  # type: ignore[attr-defined]

"""Tools that declare global claims: two agents (two workers' worth of calls) share one
control plane's semaphore and named lease."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from lodger import Agent, ScriptedModel, tool
from lodger.engine.settings import Limits
from lodger.errors import StaleTokenError, UsageError
from lodger.runtime.claims import GlobalClaims, Quota, with_global_claims
from lodger.storage import Storage
from lodger.storage.control import SqliteControlPlane
from lodger.tools.spec import ToolContext


def _batch(name: str, n: int) -> list[dict[str, object]]:
    return [{"calls": [{"name": name, "args": {"n": i}} for i in range(n)]}, {"text": "done"}]


async def test_a_global_semaphore_spans_agents(tmp_path: Path) -> None:
    controls = [SqliteControlPlane(tmp_path / "control.sqlite3") for _ in range(2)]
    for control in controls:
        await control.start()
    active, most = 0, 0

    @tool
    async def fetch(n: int) -> str:
        """Call the shared API."""
        nonlocal active, most
        active += 1
        most = max(most, active)
        deadline = time.monotonic() + 2.0
        while active < 2 and time.monotonic() < deadline:  # noqa: ASYNC110 - a test probe
            await asyncio.sleep(0.01)  # give a second holder the chance to overlap
        await asyncio.sleep(0.02)
        active -= 1
        return str(n)

    agents = [
        Agent(model=ScriptedModel(_batch("fetch", 3)), storage=Storage.memory(),
              tools=[with_global_claims(fetch, control, GlobalClaims(permits={"api": 2}))])
        for control in controls
    ]  # fmt: skip
    try:
        results = await asyncio.gather(*(agent.run("go") for agent in agents))
        assert [r.status for r in results] == ["completed", "completed"]
        assert most == 2  # two at once across both agents, never three
        events = await agents[0].session(results[0].session_id).events()
        t1 = [e for e in events if e.body.kind == "tool_dispatched"]
        assert all("capacity:global:api" in e.body.resources for e in t1)
    finally:
        for control in controls:
            await control.close()


async def test_named_lease_tokens_reach_the_tool_and_fence_late_writes(tmp_path: Path) -> None:
    control = SqliteControlPlane(tmp_path / "control.sqlite3")
    await control.start()
    writes: list[int] = []

    @tool
    async def click(n: int, ctx: ToolContext) -> str:
        """Click in the shared browser tab."""
        token = ctx.extras["fencing_tokens"]["tab"]
        await control.admit_token(name="tab", token=token)  # the resource's check
        writes.append(token)
        return f"clicked {n}"

    wrapped = with_global_claims(click, control, GlobalClaims(leases=("tab",)))
    agent = Agent(model=ScriptedModel(_batch("click", 3)), storage=Storage.memory(),
                  tools=[wrapped])  # fmt: skip
    try:
        result = await agent.run("go")
        assert result.status == "completed"
        assert sorted(writes) == [1, 2, 3]  # one holder at a time, a new token each
        with pytest.raises(StaleTokenError):  # a holder from before writes late
            await control.admit_token(name="tab", token=writes[0])
    finally:
        await control.close()


async def test_a_quota_makes_calls_wait_and_bad_limits_are_refused(tmp_path: Path) -> None:
    control = SqliteControlPlane(tmp_path / "control.sqlite3")
    await control.start()
    try:
        for _ in range(2):
            assert await control.take_quota(name="api", per_minute=2) == 0.0

        @tool
        async def ping(n: int) -> str:
            """Ping."""
            return "pong"

        with pytest.raises(UsageError):
            with_global_claims(ping, control, GlobalClaims(permits={"api": 0}))
        limited = with_global_claims(
            ping, control, GlobalClaims(quotas={"api": Quota(per_minute=2)})
        )
        agent = Agent(
            model=ScriptedModel(_batch("ping", 1)),
            storage=Storage.memory(),
            tools=[limited],
            limits=Limits(default_timeout=0.5),
        )  # fmt: skip
        result = await agent.run("go")
        events = await agent.session(result.session_id).events()
        (t2,) = [e for e in events if e.body.kind == "tool_responded"]
        assert t2.body.status == "timed_out"  # still waiting for the quota when stopped
    finally:
        await control.close()

"""Idempotency keys minted by T1 (issue 33 part 4), against a real HTTP server on
loopback that stores results by ``Idempotency-Key``: every call carries its own key, a
re-dispatch of an idempotent call after a lost T2 re-sends its first attempt's key, and
the server runs the effect once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.tools.idempotent_server import serve
from tests.tools.remote_tools import pay_tool as remote_pay

from lodger.engine.settings import Services
from lodger.errors import CommitFailedError, ToolCallError
from lodger.events import ToolDispatched
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.storage.logstore import Record
from lodger.testing import FaultyLogStore, MemoryArtifactStore
from lodger.tools import Tool, ToolContext
from lodger.tools.http import http_request
from lodger.tools.spec import idempotency_key


def agent(tmp_path: Path, tools: list[Tool], script: list[Any], **kw: Any) -> Agent:
    store = kw.pop("store", None) or SqliteLogStore(tmp_path / "state")
    return Agent(
        model=ScriptedModel(script),
        tools=tools,
        storage=Storage(log=EventLog(store), artifacts=MemoryArtifactStore()),
        services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds(kw.pop("ids", "a"))),
    )


def _t2(records: list[Record]) -> bool:
    return any(b'"kind":"tool_responded"' in r.data for r in records)


async def test_each_call_sends_its_own_key(tmp_path: Path) -> None:
    script = [
        {"calls": [{"name": "pay", "args": {"amount": 3}}, {"name": "pay", "args": {"amount": 4}}]},
        {"text": "paid twice"},
    ]
    seen: list[str] = []
    with serve() as (base, ledger):
        a = agent(tmp_path, [pay_tool(base, seen)], script)
        result = await a.run("pay", session="s1")
        await a.close()
    assert result.status == "completed"
    assert sorted(k for k in ledger.keys if k) == sorted(seen)
    assert len(set(seen)) == 2 and all(k.startswith("lodger-") for k in seen)
    assert len(ledger.executed) == 2


def pay_tool(base: str, seen: list[str]) -> Tool:
    inner = remote_pay(base)

    async def handler(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        seen.append(ctx.idempotency_key)
        return await inner.handler(arguments, ctx)

    return inner.with_options(handler=handler)


async def test_a_redispatch_resends_the_first_attempts_key_and_nothing_runs_twice(
    tmp_path: Path,
) -> None:
    script = [{"calls": [{"name": "pay", "args": {"amount": 5}}]}, {"text": "paid"}]
    seen: list[str] = []
    with serve() as (base, ledger):
        # the charge reaches the server, then T2 fails to commit: T1 without T2
        store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=_t2)
        first = agent(tmp_path, [pay_tool(base, seen)], script, store=store)
        with pytest.raises(CommitFailedError):
            await first.run("pay", session="s1")
        await first.close()
        second = agent(tmp_path, [pay_tool(base, seen)], script, ids="b")
        result = await second.resume("s1")
        await second.close()
    assert result.status == "completed" and result.answer == "paid"
    log = EventLog(SqliteLogStore(tmp_path / "state"))
    t1s = [e.body for e in await log.read_all("s1") if isinstance(e.body, ToolDispatched)]
    await log.close()
    assert len(t1s) == 2 and t1s[1].retry_of == t1s[0].operation_id
    assert seen == [idempotency_key("s1", t1s[0].operation_id)] * 2
    assert ledger.keys == seen  # both requests carried the key
    assert len(ledger.executed) == 1  # the server ran the charge once
    assert '"replayed": true' in str(result.messages)


async def test_a_key_set_by_the_tool_wins_and_bad_urls_are_refused() -> None:
    ctx = ToolContext(
        session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o",
        idempotency_key="lodger-x",
    )  # fmt: skip
    with serve() as (base, ledger):
        await http_request(
            ctx, "POST", f"{base}/charges", json={}, headers={"idempotency-key": "mine"}
        )
        await http_request(ctx, "POST", f"{base}/charges", json={})
    assert ledger.keys == ["mine", "lodger-x"]
    with pytest.raises(ToolCallError, match="http:// or https://"):
        await http_request(ctx, "GET", "file:///etc/passwd")

"""The cell host on its own, with a nested caller made of asyncio events (no threads, so
"every runnable task has run" is a fact after a few yields, not a hope)."""

from __future__ import annotations

import asyncio
from typing import Any

from lodger.errors import CommitFailedError
from lodger.substrates.codemode import CellLimits
from lodger.substrates.codemode._host import CellHost
from lodger.tools import Tool, tool
from lodger.tools.spec import NestedResult


@tool(nestable=True)
def ping(n: int) -> int:
    """Echo."""
    return n


class GatedCalls:
    """A nested caller whose calls wait until the test releases them, one by one."""

    def __init__(self, *, fail_on: int | None = None) -> None:
        self.started: list[int] = []
        self.gates: dict[int, asyncio.Event] = {}
        self.fail_on = fail_on

    def callable_tools(self) -> list[Tool]:
        return [ping]

    def tool(self, name: str) -> Tool | None:
        return ping if name == "ping" else None

    def bound_names(self) -> list[str]:
        return ["ping"]

    async def call(self, name: str, arguments: dict[str, Any]) -> NestedResult:
        n = int(arguments["n"])
        self.started.append(n)
        if n == self.fail_on:
            raise CommitFailedError("injected", session_id="s")
        gate = self.gates.setdefault(n, asyncio.Event())
        await gate.wait()
        return NestedResult(call_id=f"c{n}", status="ok", content=str(n))


async def settle_loop() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_in_flight_calls_wait_for_a_slot() -> None:
    calls = GatedCalls()
    host = CellHost(calls, CellLimits(nested_in_flight=2))
    replies = [asyncio.ensure_future(host.call("ping", {"n": n})) for n in range(5)]
    await settle_loop()
    assert calls.started == [0, 1]
    calls.gates[0].set()
    await settle_loop()
    assert calls.started == [0, 1, 2]
    for n in range(5):
        calls.gates.setdefault(n, asyncio.Event()).set()
        await settle_loop()
    assert [r.result() for r in replies] == [{"ok": n} for n in range(5)]


async def test_a_failed_commit_starts_no_further_call() -> None:
    calls = GatedCalls(fail_on=1)
    host = CellHost(calls, CellLimits(nested_in_flight=1))
    first = asyncio.ensure_future(host.call("ping", {"n": 0}))
    failing = asyncio.ensure_future(host.call("ping", {"n": 1}))
    later = asyncio.ensure_future(host.call("ping", {"n": 2}))
    await settle_loop()
    calls.gates[0].set()
    await settle_loop()
    assert first.result() == {"ok": 0}
    assert failing.result()["error"]["code"] == "commit_failed"
    assert later.result()["error"]["code"] == "cell_stopped"
    assert calls.started == [0, 1]
    assert host.failure is not None and host.stopped.is_set()
    assert (await host.call("ping", {"n": 3}))["error"]["code"] == "cell_stopped"
    assert calls.started == [0, 1]


async def test_the_call_budget_is_sticky() -> None:
    calls = GatedCalls()
    host = CellHost(calls, CellLimits(nested_calls=1))
    calls.gates[0] = asyncio.Event()
    calls.gates[0].set()
    assert await host.call("ping", {"n": 0}) == {"ok": 0}
    assert (await host.call("ping", {"n": 1}))["error"]["code"] == "limit_exceeded"
    assert host.exceeded == "nested_calls" and host.stop_reason is not None
    assert calls.started == [0]

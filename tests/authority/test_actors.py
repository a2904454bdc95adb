"""Actors: one operation at a time per single-state resource, in arrival order."""

from __future__ import annotations

import asyncio

import pytest

from lodger.authority import ActorAuthority, ResourceClaim
from lodger.errors import AuthorityMisuseError

from ._support import settle


async def test_one_operation_at_a_time_in_arrival_order() -> None:
    actors = ActorAuthority()
    running = 0
    peak = 0
    order: list[str] = []
    gates = {f"op{i}": asyncio.Event() for i in range(4)}

    async def operation(name: str) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        order.append(name)
        await gates[name].wait()
        running -= 1
        return name.upper()

    tasks = []
    for name in gates:  # arrival order op0, op1, op2, op3
        tasks.append(asyncio.create_task(actors.run(name, "shell", lambda n=name: operation(n))))
        await settle()
    assert order == ["op0"] and actors.busy("shell") == "op0"
    assert [w.owner for w in actors.statistics().waiters] == ["op1", "op2", "op3"]
    # Finishing out of order changes nothing: the next to run is the next to arrive.
    gates["op3"].set()
    gates["op2"].set()
    await settle()
    assert order == ["op0"]
    gates["op0"].set()
    gates["op1"].set()
    assert await asyncio.gather(*tasks) == ["OP0", "OP1", "OP2", "OP3"]
    assert order == ["op0", "op1", "op2", "op3"] and peak == 1
    stats = actors.statistics()
    assert (stats.acquisitions, stats.waits, stats.holders) == (4, 3, ())


async def test_different_actors_run_together() -> None:
    actors = ActorAuthority()
    both = asyncio.Barrier(2)

    async def meet() -> str:
        await both.wait()  # deadlocks unless the two actors run at the same time
        return "met"

    async with asyncio.timeout(5):
        results = await asyncio.gather(
            actors.run("a", "shell", meet), actors.run("b", "browser", meet)
        )
    assert results == ["met", "met"]


async def test_a_failing_operation_frees_the_actor() -> None:
    actors = ActorAuthority()

    async def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await actors.run("a", "shell", boom)
    assert actors.busy("shell") is None

    async def fine() -> int:
        return 1

    assert await actors.run("b", "shell", fine) == 1


async def test_actor_leases_know_their_owner() -> None:
    actors = ActorAuthority()
    lease = await actors.acquire("a", [ResourceClaim.actor("shell")])
    with pytest.raises(AuthorityMisuseError, match="cannot be released by call 'b'"):
        lease.release(owner="b")
    lease.release(owner="a")
    with pytest.raises(AuthorityMisuseError, match="already released"):
        lease.release(owner="a")

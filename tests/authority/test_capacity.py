"""Capacity: semaphores with a limit that never serialize work below it."""

from __future__ import annotations

import asyncio

import pytest

from lodger.authority import CapacityAuthority, ResourceClaim
from lodger.errors import UsageError

from ._support import settle

GITHUB = ResourceClaim.capacity("mcp:github")
SEARCH = ResourceClaim.capacity("mcp:search")


async def test_the_limit_caps_how_many_run_at_once() -> None:
    capacity = CapacityAuthority({"mcp:github": 2})
    leases = [capacity.request(f"c{i}", [GITHUB]) for i in range(4)]
    tasks = [asyncio.create_task(lease.acquire()) for lease in leases]
    await settle()
    assert [lease.state for lease in leases] == ["held", "held", "waiting", "waiting"]
    assert capacity.in_use("mcp:github") == 2
    leases[1].release(owner="c1")
    await settle()
    assert [lease.state for lease in leases] == ["held", "released", "held", "waiting"]
    leases[0].release(owner="c0")
    leases[2].release(owner="c2")
    await asyncio.gather(*tasks)
    leases[3].release(owner="c3")
    stats = capacity.statistics()
    assert (stats.acquisitions, stats.waits, stats.holders) == (4, 2, ())


async def test_below_the_limit_nothing_is_serialized() -> None:
    capacity = CapacityAuthority({"mcp:github": 3}, default_limit=1)
    meet = asyncio.Barrier(3)

    async def call(owner: str) -> None:
        lease = await capacity.acquire(owner, [GITHUB])
        await meet.wait()  # all three must be inside at once
        lease.release(owner=owner)

    async with asyncio.timeout(5):
        await asyncio.gather(call("a"), call("b"), call("c"))
    assert capacity.statistics().waits == 0


async def test_keys_are_independent_and_waiters_keep_arrival_order() -> None:
    capacity = CapacityAuthority({"mcp:github": 1, "mcp:search": 1})
    first = await capacity.acquire("a", [GITHUB])
    queued = [capacity.request(name, [GITHUB]) for name in ("b", "c")]
    tasks = [asyncio.create_task(lease.acquire()) for lease in queued]
    other = await capacity.acquire("d", [SEARCH])  # another server: not held up
    await settle()
    assert [lease.state for lease in queued] == ["waiting", "waiting"]
    first.release(owner="a")
    await settle()
    assert [lease.state for lease in queued] == ["held", "waiting"]
    queued[0].release(owner="b")
    await asyncio.gather(*tasks)
    other.release(owner="d")


async def test_unconfigured_keys_use_the_default_and_limits_are_checked() -> None:
    unlimited = CapacityAuthority()
    leases = [await unlimited.acquire(f"c{i}", [GITHUB]) for i in range(10)]
    assert unlimited.limit("mcp:github") is None and unlimited.in_use("mcp:github") == 10
    for i, lease in enumerate(leases):
        lease.release(owner=f"c{i}")
    assert CapacityAuthority(default_limit=2).limit("anything") == 2
    with pytest.raises(UsageError, match="at least 1"):
        CapacityAuthority({"mcp:github": 0})

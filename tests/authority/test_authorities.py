"""Reservations across authorities: emission order, fixed acquisition order, cleanup."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lodger.authority import Authorities, CapacityAuthority, ResourceClaim
from lodger.errors import AuthorityMisuseError

from ._support import read, settle, write

SHELL = ResourceClaim.actor("shell")
GITHUB = ResourceClaim.capacity("mcp:github")


async def test_reservation_order_decides_among_conflicting_calls(root: Path) -> None:
    authorities = Authorities()
    # Reserved in emission order; asked for in the opposite order (permission finished late).
    first = authorities.reserve("c1", [write(root / "a.txt")])
    second = authorities.reserve("c2", [read(root / "link-to-a")])
    independent = authorities.reserve("c3", [read(root / "sub/b.txt")])
    second_task = asyncio.create_task(second.acquire())
    await independent.acquire()
    await settle()
    assert not second.held and independent.held
    await first.acquire()
    assert first.held and not second.held
    assert second.resources() == (f"read file:{root}/a.txt",)
    first.close()
    await second_task
    assert second.held
    second.close()
    independent.close()
    assert all(not s.holders and not s.waiters for s in authorities.statistics())


async def test_no_deadlock_across_files_actors_and_capacity(root: Path) -> None:
    authorities = Authorities(capacity=CapacityAuthority({"mcp:github": 1}))
    # c1 reserved first but is slow to ask; c2 must not take the capacity unit and then
    # wait for c1's file while c1 waits for that unit.
    c1 = authorities.reserve("c1", [write(root / "a.txt"), SHELL, GITHUB])
    c2 = authorities.reserve("c2", [GITHUB, write(root / "a.txt")])
    c2_task = asyncio.create_task(c2.acquire())
    await settle()
    assert authorities.capacity.in_use("mcp:github") == 0  # c2 waits on the file first
    async with asyncio.timeout(5):
        await c1.acquire()
        c1.close()
        await c2_task
    assert c2.held
    c2.close()


async def test_cancelled_acquire_gives_back_what_it_held(root: Path) -> None:
    authorities = Authorities(capacity=CapacityAuthority({"mcp:github": 1}))
    blocker = authorities.reserve("b", [GITHUB])
    await blocker.acquire()
    call = authorities.reserve("c", [write(root / "a.txt"), GITHUB])
    task = asyncio.create_task(call.acquire())
    await settle()
    assert [h.owner for h in authorities.files.statistics().holders] == ["c"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert authorities.files.statistics().holders == ()
    assert authorities.capacity.statistics().waiters == ()
    call.close()  # idempotent after the fact
    blocker.close()


async def test_a_call_may_only_acquire_once_and_claims_are_deduplicated(root: Path) -> None:
    authorities = Authorities()
    reservation = authorities.reserve("c", [write(root / "a.txt"), write(root / "link-to-a")])
    assert len(reservation.claims) == 1
    await reservation.acquire()
    with pytest.raises(AuthorityMisuseError, match="already acquired"):
        await reservation.acquire()
    reservation.close()
    empty = authorities.reserve("e", [])
    await empty.acquire()
    assert empty.held and empty.resources() == ()

"""File leases: canonical keys, shared/exclusive modes, subtrees, fairness, owners, statistics."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from lodger.authority import FileLeaseAuthority, ResourceClaim
from lodger.errors import AuthorityMisuseError, UsageError

from ._support import read, settle, write

# ---------------------------------------------------------------- claims and keys


def test_every_spelling_of_a_file_is_one_key(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(root / "sub")
    spellings = [
        root / "a.txt",
        root / "link-to-a",
        root / "sub" / ".." / "a.txt",
        root / "dir-link" / ".." / "a.txt",  # the kernel resolves the link, then '..'
        "../a.txt",  # relative to the working directory
        f"{root}//./a.txt",
    ]
    keys = {write(p).key for p in spellings}
    assert keys == {str(root / "a.txt")}
    assert write(root / "dir-link" / "b.txt").key == str(root / "sub" / "b.txt")


def test_claim_rendering_and_validation(root: Path) -> None:
    claim = ResourceClaim.file(root / "link-to-a", mode="read", root=root)
    assert claim.render() == "read file:a.txt"
    assert claim == read(root / "a.txt")  # the label does not take part in equality
    assert ResourceClaim.file(root, mode="write", scope="subtree", root=root).render() == (
        "write file:./**"
    )
    assert write(root / "sub", "subtree").render() == f"write file:{root}/sub/**"
    assert ResourceClaim.actor("shell").render() == "actor:shell"
    assert ResourceClaim.capacity("mcp:github").render() == "capacity:mcp:github"
    with pytest.raises(UsageError, match="not absolute"):
        ResourceClaim(kind="file", key="a.txt")
    with pytest.raises(UsageError, match="not a canonical path"):
        ResourceClaim(kind="file", key="/w/sub/../a.txt")
    with pytest.raises(UsageError, match="subtree"):
        ResourceClaim(kind="actor", key="shell", scope="subtree")


# ---------------------------------------------------------------- modes


async def test_aliases_conflict_through_a_symlink(root: Path) -> None:
    files = FileLeaseAuthority()
    first = await files.acquire("c1", [write(root / "a.txt")])
    second = files.request("c2", [write(root / "link-to-a")])
    waiter = asyncio.create_task(second.acquire())
    await settle()
    assert second.state == "waiting"
    first.release(owner="c1")
    await waiter
    assert second.state == "held"


async def test_reads_share_and_writes_exclude(root: Path) -> None:
    files = FileLeaseAuthority()
    r1 = await files.acquire("r1", [read(root / "a.txt")])
    r2 = await files.acquire("r2", [read(root / "link-to-a")])  # shared: granted at once
    w = files.request("w", [write(root / "a.txt")])
    w_task = asyncio.create_task(w.acquire())
    await settle()
    assert (r1.state, r2.state, w.state) == ("held", "held", "waiting")
    r1.release(owner="r1")
    await settle()
    assert w.state == "waiting"  # one reader still holds it
    r2.release(owner="r2")
    await w_task
    r3 = files.request("r3", [read(root / "a.txt")])
    r3_task = asyncio.create_task(r3.acquire())
    await settle()
    assert r3.state == "waiting"  # a writer excludes readers too
    w.release(owner="w")
    await r3_task


@pytest.mark.parametrize(
    ("held", "asked", "conflict"),
    [
        (("", "subtree", "read"), ("a.txt", "exact", "write"), True),
        (("sub", "subtree", "write"), ("sub/b.txt", "exact", "read"), True),
        (("sub/b.txt", "exact", "write"), ("", "subtree", "read"), True),
        (("", "subtree", "write"), ("sub", "subtree", "read"), True),
        (("sub", "subtree", "read"), ("", "subtree", "write"), True),
        (("sub", "subtree", "write"), ("a.txt", "exact", "write"), False),
        (("sub", "subtree", "read"), ("sub/b.txt", "exact", "read"), False),
        (("sub", "subtree", "write"), ("sub2/c.txt", "exact", "write"), False),  # not a prefix
        (("sub", "exact", "write"), ("sub/b.txt", "exact", "write"), False),  # exact: dir only
    ],
)
async def test_subtree_leases_conflict_with_any_lease_inside(
    root: Path,
    held: tuple[str, str, str],
    asked: tuple[str, str, str],
    conflict: bool,
) -> None:
    def claim(rel: str, scope: str, mode: str) -> ResourceClaim:
        return ResourceClaim.file(root / rel, mode=mode, scope=scope)  # type: ignore[arg-type]

    files = FileLeaseAuthority()
    await files.acquire("held", [claim(*held)])
    lease = files.request("asked", [claim(*asked)])
    task = asyncio.create_task(lease.acquire())
    await settle()
    assert (lease.state == "waiting") is conflict
    assert ("held" in files.holders_of(claim(*asked))) is conflict
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# ---------------------------------------------------------------- fairness


async def test_a_later_reader_never_overtakes_a_queued_writer(root: Path) -> None:
    files = FileLeaseAuthority()
    granted: list[str] = []

    async def take(owner: str, claim: ResourceClaim, hold: asyncio.Event) -> None:
        lease = await files.acquire(owner, [claim])
        granted.append(owner)
        await hold.wait()
        lease.release(owner=owner)

    done = {name: asyncio.Event() for name in ("r1", "w", "r2", "other")}
    tasks = [asyncio.create_task(take("r1", read(root / "a.txt"), done["r1"]))]
    await settle()
    tasks.append(asyncio.create_task(take("w", write(root / "a.txt"), done["w"])))
    await settle()
    tasks.append(asyncio.create_task(take("r2", read(root / "link-to-a"), done["r2"])))
    tasks.append(asyncio.create_task(take("other", write(root / "sub/b.txt"), done["other"])))
    await settle()
    # r2 could share with r1, but w is queued first; independent work is not held up.
    assert granted == ["r1", "other"]
    stats = files.statistics()
    assert [w.owner for w in stats.waiters] == ["w", "r2"]
    done["r1"].set()
    await settle()
    assert granted == ["r1", "other", "w"]
    done["w"].set()
    await settle()
    assert granted == ["r1", "other", "w", "r2"]
    for event in done.values():
        event.set()
    await asyncio.gather(*tasks)


async def test_a_reserved_lease_holds_its_place_until_acquired_or_withdrawn(root: Path) -> None:
    files = FileLeaseAuthority()
    writer = files.request("w", [write(root / "a.txt")])  # reserved, not yet asked for
    reader = files.request("r", [read(root / "a.txt")])
    independent = files.request("i", [read(root / "sub/b.txt")])
    reader_task = asyncio.create_task(reader.acquire())
    await independent.acquire()
    await settle()
    assert (writer.state, reader.state, independent.state) == ("reserved", "waiting", "held")
    writer.withdraw(owner="w")
    await reader_task
    assert reader.state == "held"
    assert files.statistics().withdrawals == 1


async def test_cancelling_a_waiter_withdraws_it_and_lets_the_next_one_in(root: Path) -> None:
    files = FileLeaseAuthority()
    holder = await files.acquire("h", [write(root / "a.txt")])
    cancelled = files.request("c", [write(root / "a.txt")])
    after = files.request("n", [read(root / "a.txt")])
    c_task = asyncio.create_task(cancelled.acquire())
    n_task = asyncio.create_task(after.acquire())
    await settle()
    c_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await c_task
    assert cancelled.state == "withdrawn"
    holder.release(owner="h")
    await n_task
    assert after.state == "held"


async def test_a_grant_that_races_a_cancellation_is_given_back(root: Path) -> None:
    files = FileLeaseAuthority()
    holder = await files.acquire("h", [write(root / "a.txt")])
    lease = files.request("c", [write(root / "a.txt")])
    task = asyncio.create_task(lease.acquire())
    await settle()
    holder.release(owner="h")  # grants c synchronously ...
    task.cancel()  # ... but c is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lease.state == "released"
    assert files.statistics().holders == ()


async def test_a_release_between_a_waiters_cancel_and_its_withdrawal_grants_the_next(
    root: Path,
) -> None:
    """A waiter's future is cancelled at once, its withdrawal only when its task runs; a
    release in between must not grant the cancelled future (InvalidStateError) and must
    let the lease behind it in."""
    files = FileLeaseAuthority()
    holder = await files.acquire("h", [write(root / "a.txt")])
    cancelled = files.request("c", [write(root / "a.txt")])
    after = files.request("n", [write(root / "a.txt")])
    c_task = asyncio.create_task(cancelled.acquire())
    n_task = asyncio.create_task(after.acquire())
    await settle()
    c_task.cancel()  # cancels the awaited grant future now; c withdraws when it runs
    holder.release(owner="h")  # before c's task has run
    with pytest.raises(asyncio.CancelledError):
        await c_task
    await n_task
    assert (cancelled.state, after.state) == ("withdrawn", "held")


# ---------------------------------------------------------------- owners and misuse


async def test_misuse_raises_precise_errors(root: Path) -> None:
    files = FileLeaseAuthority()
    lease = await files.acquire("c1", [write(root / "a.txt")])
    with pytest.raises(AuthorityMisuseError, match="cannot be released by call 'c2'") as info:
        lease.release(owner="c2")
    assert (info.value.owner, info.value.holder, info.value.code) == (
        "c2",
        "c1",
        "authority_misuse",
    )
    with pytest.raises(AuthorityMisuseError, match="already has a files lease"):
        files.request("c1", [read(root / "sub/b.txt")])
    with pytest.raises(AuthorityMisuseError, match="is held; release it instead"):
        lease.withdraw(owner="c1")
    with pytest.raises(AuthorityMisuseError, match="already held"):
        await lease.acquire()
    lease.release(owner="c1")
    with pytest.raises(AuthorityMisuseError, match="was already released"):
        lease.release(owner="c1")
    waiting = files.request("c3", [write(root / "a.txt")])
    with pytest.raises(AuthorityMisuseError, match="not been granted yet"):
        waiting.release(owner="c3")
    waiting.withdraw(owner="c3")
    with pytest.raises(AuthorityMisuseError, match="is withdrawn"):
        waiting.withdraw(owner="c3")
    with pytest.raises(UsageError, match="does not handle actor claims"):
        files.request("c4", [ResourceClaim.actor("shell")])


async def test_withdrawn_from_elsewhere_wakes_its_owner_with_an_error(root: Path) -> None:
    files = FileLeaseAuthority()
    await files.acquire("h", [write(root / "a.txt")])
    lease = files.request("c", [write(root / "a.txt")])
    task = asyncio.create_task(lease.acquire())
    await settle()
    lease.close()
    with pytest.raises(AuthorityMisuseError, match="withdrawn while its owner waited"):
        await task


# ---------------------------------------------------------------- statistics


async def test_statistics_show_holders_waiters_and_counters(root: Path) -> None:
    now = [100.0]
    files = FileLeaseAuthority(clock=lambda: now[0])
    first = await files.acquire("c1", [ResourceClaim.file(root / "a.txt", mode="write", root=root)])
    second = files.request("c2", [read(root / "a.txt")])
    task = asyncio.create_task(second.acquire())
    await settle()
    stats = files.statistics()
    assert stats.authority == "files"
    assert [(h.owner, h.resources) for h in stats.holders] == [("c1", ("write file:a.txt",))]
    assert [(w.owner, w.resources) for w in stats.waiters] == [
        ("c2", (f"read file:{root}{os.sep}a.txt",))
    ]
    assert (stats.acquisitions, stats.waits) == (1, 0)
    now[0] = 102.5
    first.release(owner="c1")
    await task
    stats = files.statistics()
    assert (stats.acquisitions, stats.waits, stats.wait_seconds) == (2, 1, 2.5)
    assert [h.owner for h in stats.holders] == ["c2"] and stats.waiters == ()
    assert second.wait_seconds == 2.5

"""Forks copy nothing, share the parent's prefix byte for byte, verify it on every read,
and go on independently, on SQLite and on the object store (file and S3)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import obstore
import pytest

from lodger.errors import CorruptLogError, UsageError
from lodger.events import EventDraft, SessionStarted, TurnStarted, WorkspaceSnapshot
from lodger.ids import ManualClock, SequentialIds
from lodger.storage import Storage
from lodger.storage.forks import fork_session, read_lineage
from lodger.storage.objectstore import ObjectLogStore

from ._s3server import S3Server

PARENT = "parent"


# the S3 server (moto) is the slowest backend: the fast lane leaves it to the full run
@pytest.fixture(
    params=["sqlite", "objects-file", pytest.param("objects-s3", marks=pytest.mark.slow)]
)
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    if request.param == "sqlite":
        made = Storage.local(tmp_path / "state")
    elif request.param == "objects-file":
        made = Storage.from_url(f"file://{tmp_path / 'objects'}")
    else:
        server: S3Server = request.getfixturevalue("s3")
        made = Storage.from_url(server.url())
    yield made
    await made.close()


def draft(n: int, body: object | None = None) -> EventDraft:
    return EventDraft(id=f"e{n}", ts=n, body=body or TurnStarted(input=f"say {n}"))  # type: ignore[arg-type]


async def _parent(storage: Storage, count: int) -> None:
    async with await storage.log.open_writer(PARENT) as writer:
        await writer.append([draft(0, SessionStarted(workspace="/ws"))], expected_offset=0)
        for n in range(1, count):
            body = WorkspaceSnapshot(ref=f"{n:064x}", files=1, size=1) if n == 3 else None
            await writer.append([draft(n, body)], expected_offset=n)


def _objects(storage: Storage) -> set[str]:
    store = storage.log.store
    if not isinstance(store, ObjectLogStore):
        return set()
    return {str(m["path"]) for chunk in obstore.list(store.store) for m in chunk}


async def test_fork_shares_the_prefix_and_both_go_on(storage: Storage) -> None:
    clock, ids = ManualClock(), SequentialIds()
    await _parent(storage, 6)
    before = _objects(storage)
    parent_records = await storage.log.store.read_records(session_id=PARENT, start=0, end=None)
    made = await fork_session(storage.log, PARENT, fork_id="child", at=4, clock=clock, ids=ids)
    assert (made.parent.session_id, made.parent.high_water) == (PARENT, 4)
    assert made.parent.digest == parent_records[3].digest
    assert made.snapshot == f"{3:064x}"  # the parent's snapshot at that point, by reference
    started = made.started.body
    assert isinstance(started, SessionStarted) and started.workspace == "/ws"
    # nothing of the parent was copied: only the fork's own objects are new
    new = _objects(storage) - before
    assert all(key.startswith("sessions/child/") for key in new), new
    assert len(new) <= 3  # one segment, one head, one manifest
    # both go on independently and both verify
    async with await storage.log.open_writer(PARENT) as writer:
        await writer.append([draft(6)], expected_offset=6)
    async with await storage.log.open_writer("child") as writer:
        await writer.append([draft(100)], expected_offset=1)
    assert (await storage.log.verify(PARENT)).high_water == 7
    assert (await storage.log.verify("child")).high_water == 2
    lineage = await read_lineage(storage.log, "child")
    assert [sid for sid, _ in lineage.parts] == [PARENT, "child"]
    shared = lineage.parts[0][1]
    # the shared prefix is the parent's stored bytes, byte for byte
    again = await storage.log.store.read_records(session_id=PARENT, start=0, end=4)
    assert again == parent_records[:4]
    assert [e.digest for e in shared] == [r.digest for r in parent_records[:4]]
    assert [e.id for e in lineage.events] == ["e0", "e1", "e2", "e3", "id-000001", "e100"]


async def test_a_fork_of_a_fork_reads_its_whole_lineage(storage: Storage) -> None:
    clock, ids = ManualClock(), SequentialIds()
    await _parent(storage, 5)
    await fork_session(storage.log, PARENT, fork_id="child", clock=clock, ids=ids)
    await fork_session(storage.log, "child", fork_id="grandchild", clock=clock, ids=ids)
    lineage = await read_lineage(storage.log, "grandchild")
    assert [sid for sid, _ in lineage.parts] == [PARENT, "child", "grandchild"]
    assert len(lineage.events) == 5 + 1 + 1


async def test_changed_parent_prefix_fails_the_forks_read(tmp_path: Path) -> None:
    # a parent rewritten (validly re-chained) under the fork is caught by the recorded digest
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    clock, ids = ManualClock(), SequentialIds()
    await _parent(storage, 5)
    await fork_session(storage.log, PARENT, fork_id="child", at=3, clock=clock, ids=ids)
    store = storage.log.store
    assert isinstance(store, ObjectLogStore)
    for chunk in obstore.list(store.store, f"sessions/{PARENT}/"):
        for meta in chunk:
            obstore.delete(store.store, str(meta["path"]))
    async with await storage.log.open_writer(PARENT) as writer:
        for n in range(5):
            await writer.append([draft(n + 50)], expected_offset=n)
    with pytest.raises(CorruptLogError) as info:
        await read_lineage(storage.log, "child")
    assert (info.value.session_id, info.value.offset, info.value.code) == (
        "child",
        0,
        "digest_mismatch",
    )
    await storage.close()


async def test_fork_beyond_the_head_is_refused(storage: Storage) -> None:
    await _parent(storage, 3)
    with pytest.raises(UsageError) as info:
        await fork_session(
            storage.log, PARENT, fork_id="c", at=9, clock=ManualClock(), ids=SequentialIds()
        )
    assert info.value.code == "fork_beyond_head"
    assert not await storage.log.exists("c")


async def test_a_fork_at_offset_zero_is_refused_as_sharing_nothing(storage: Storage) -> None:
    await _parent(storage, 3)
    with pytest.raises(UsageError) as info:
        await fork_session(
            storage.log, PARENT, fork_id="c", at=0, clock=ManualClock(), ids=SequentialIds()
        )
    assert info.value.code == "usage"  # not fork_beyond_head: 0 is not past the head
    assert "shares at least the parent's first event" in info.value.message
    assert not await storage.log.exists("c")

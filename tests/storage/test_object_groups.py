"""Group commit across sessions on a local-directory object store (``_object_sync``).

Puts of different sessions that arrive while a group is being written and synced wait
for it and then go together: one job, one sync. Each session keeps its own segment key
(its expected-offset check), nothing is acknowledged before its group's sync returned,
and a sync that fails fails every append of its group.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from lodger.errors import CommitFailedError
from lodger.storage import EventLog
from lodger.storage._object_sync import GroupSync, syncfs_available
from lodger.storage._segments import seg_key
from lodger.storage.objectstore import ObjectLogStore, open_object_store

from ._object_writer import make_draft

SESSIONS = ("a", "b", "c", "d")

needs_syncfs = pytest.mark.skipif(not syncfs_available(), reason="group sync needs syncfs")


class HeldSync:
    """The store's real sync, recorded per group; ``hold()`` makes the next group wait
    on its thread until ``release()``, and ``fail`` makes a group's sync raise."""

    def __init__(self, real: Callable[[Path, Sequence[Path]], None]) -> None:
        self.real = real
        self.groups: list[list[str]] = []
        self.entered = threading.Event()
        self._gate: threading.Event | None = None
        self._held = threading.Event()
        self.fail: Callable[[list[str]], bool] = lambda names: False
        self.before: Callable[[Sequence[Path]], None] = lambda paths: None

    def hold(self) -> None:
        self.entered.clear()
        self._gate = self._held = threading.Event()

    def release(self) -> None:
        self._held.set()

    def __call__(self, root: Path, paths: Sequence[Path]) -> None:
        names = [p.relative_to(root).as_posix() for p in paths]
        self.groups.append(names)
        gate, self._gate = self._gate, None
        self.entered.set()
        if gate is not None:
            gate.wait(timeout=30)
        self.before(paths)
        if self.fail(names):
            raise OSError(5, "Input/output error (injected)")
        self.real(root, paths)


def _store(tmp_path: Path) -> ObjectLogStore:
    where = open_object_store(f"file://{tmp_path / 'objects'}")
    return ObjectLogStore(where.store, identity=where.identity, local_root=where.local_root)


def _held(store: ObjectLogStore) -> tuple[GroupSync, HeldSync]:
    sync = store.local_sync
    assert sync is not None and sync.sync_paths is not None
    held = HeldSync(sync.sync_paths)
    sync.sync_paths = held
    return sync, held


async def _started(log: EventLog) -> dict[str, object]:
    """A writer per session, each with its first event (and head) already stored."""
    writers = {}
    for sid in SESSIONS:
        writer = await log.open_writer(sid)
        await writer.append([make_draft(sid, 0)], expected_offset=0)
        writers[sid] = writer
    return writers


async def _line_up(sync: GroupSync, held: HeldSync, writers: dict, group: asyncio.TaskGroup):  # type: ignore[no-untyped-def,type-arg]
    """Session a's append in a held group, then b, c and d waiting behind it."""
    held.hold()
    tasks = {"a": group.create_task(_outcome(writers["a"], "a"))}
    await asyncio.to_thread(held.entered.wait, 30)
    for sid in SESSIONS[1:]:
        tasks[sid] = group.create_task(_outcome(writers[sid], sid))
    for _ in range(100_000):  # the three puts queue behind the group in flight
        if sync.waiting == 3:
            break
        await asyncio.sleep(0)
    assert sync.waiting == 3, "the appends did not wait for the group in flight"
    return tasks


@needs_syncfs
async def test_appends_arriving_during_a_sync_share_the_next_one(tmp_path: Path) -> None:
    store = _store(tmp_path)
    sync, held = _held(store)
    log = EventLog(store)
    writers = await _started(log)
    groups_before = len(held.groups)
    async with asyncio.TaskGroup() as group:
        tasks = await _line_up(sync, held, writers, group)
        assert not any(t.done() for t in tasks.values())  # nothing acknowledged yet
        held.release()
    assert all(len(t.result()) == 1 for t in tasks.values())  # type: ignore[arg-type]
    # one group for a's segment, then ONE for the three that came while it was synced
    assert held.groups[groups_before:] == [
        [seg_key("a", 1)],
        [seg_key(sid, 1) for sid in SESSIONS[1:]],
    ]
    assert sync.synced - sync.groups > 0
    for sid in SESSIONS:
        await writers[sid].close()  # type: ignore[attr-defined]
        events = await log.read(sid)
        assert [e.body.input for e in events] == [f"{sid} says 0", f"{sid} says 1"]  # type: ignore[attr-defined]
        assert (await log.verify(sid)).high_water == 2
    await log.close()


@needs_syncfs
async def test_a_failed_group_sync_fails_every_append_of_that_group(tmp_path: Path) -> None:
    store = _store(tmp_path)
    sync, held = _held(store)
    held.fail = lambda names: seg_key("b", 1) in names
    log = EventLog(store)
    writers = await _started(log)
    async with asyncio.TaskGroup() as group:
        tasks = await _line_up(sync, held, writers, group)
        held.release()
    assert len(tasks["a"].result()) == 1  # a's group synced: acknowledged
    for sid in SESSIONS[1:]:
        error = tasks[sid].result()
        assert isinstance(error, CommitFailedError), error
        assert error.offset == 1 and "the sync of its group failed" in error.message
    # a failed commit loses nothing committed: every log still verifies
    for sid in SESSIONS:
        assert (await log.verify(sid)).high_water >= (2 if sid == "a" else 1)
    await log.close()


async def _outcome(writer: Any, sid: str) -> object:
    """The session's second append: its events, or the commit error it raised."""
    try:
        return await writer.append([make_draft(sid, 1)], expected_offset=1)
    except CommitFailedError as exc:
        return exc


@needs_syncfs
async def test_an_object_not_kept_after_the_sync_fails_its_append(tmp_path: Path) -> None:
    """The grouped put checks each object's size after the sync (what the HEAD of a
    remote store's put asks): an object the disk did not keep fails its append only."""
    store = _store(tmp_path)
    _, held = _held(store)
    log = EventLog(store)
    writers = await _started(log)

    def truncate(paths: Sequence[Path]) -> None:
        for path in paths:
            if path.name == seg_key("c", 1).rsplit("/", 1)[1] and "/c/" in path.as_posix():
                path.write_bytes(b"")

    held.before = truncate
    results = await asyncio.gather(
        *(writers[sid].append([make_draft(sid, 1)], expected_offset=1) for sid in SESSIONS),  # type: ignore[attr-defined]
        return_exceptions=True,
    )
    errors = {sid: r for sid, r in zip(SESSIONS, results, strict=True) if isinstance(r, Exception)}
    assert list(errors) == ["c"]
    assert isinstance(errors["c"], CommitFailedError)
    assert "0 bytes of the" in errors["c"].message
    await log.close()


async def test_without_group_sync_each_put_syncs_its_own(tmp_path: Path) -> None:
    """Where the platform has no ``syncfs``: obstore's put, then the object and its
    directory fsynced, one put at a time (the HEAD confirms it)."""
    store = _store(tmp_path)
    sync = store.local_sync
    assert sync is not None
    sync.sync_paths = None
    log = EventLog(store)
    async with await log.open_writer("a") as writer:
        for n in range(3):
            await writer.append([make_draft("a", n)], expected_offset=n)
    assert sync.groups == sync.synced == store.stats.puts
    assert store.stats.heads == store.stats.puts
    assert (await log.verify("a")).high_water == 3
    await log.close()


@needs_syncfs
async def test_an_append_cancelled_while_it_waits_leaves_its_group(tmp_path: Path) -> None:
    store = _store(tmp_path)
    sync, held = _held(store)
    log = EventLog(store)
    writers = await _started(log)
    async with asyncio.TaskGroup() as group:
        tasks = await _line_up(sync, held, writers, group)
        tasks["b"].cancel()  # queued behind a's group: it leaves, c and d still commit
        held.release()
    assert tasks["b"].cancelled()
    for sid in ("a", "c", "d"):
        assert len(tasks[sid].result()) == 1  # type: ignore[arg-type]
        assert (await log.verify(sid)).high_water == 2
    await log.close()

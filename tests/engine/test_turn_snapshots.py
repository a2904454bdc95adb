"""Each turn's end records the workspace it left: a content-addressed, incremental
snapshot, committed with the turn's end, that restores byte for byte; on by default on
the object store, on request elsewhere; a fork starts from its parent's snapshot."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from lodger import Agent, ScriptedModel, tool
from lodger.engine.settings import Services
from lodger.errors import StorageError, UsageError
from lodger.events import ArtifactRef, RunEnded, TurnEnded, WorkspaceSnapshot
from lodger.ids import ManualClock, SequentialIds
from lodger.storage import Storage
from lodger.storage.artifacts import ArtifactStore
from lodger.storage.forks import fork_session
from lodger.storage.objectartifacts import ObjectArtifactStore
from lodger.storage.snapshots import (
    WorkspaceSnapshotter,
    latest_snapshot,
    restore_snapshot,
)


def _describe(root: Path) -> dict[str, tuple[str, object, int]]:
    """Every entry under ``root``: kind, contents or link target, permission bits."""
    found: dict[str, tuple[str, object, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            info = path.lstat()
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(info.st_mode):
                found[rel] = ("link", os.readlink(path), 0)
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = ("dir", None, stat.S_IMODE(info.st_mode))
            else:
                found[rel] = ("file", path.read_bytes(), stat.S_IMODE(info.st_mode))
    return found


def _workspace(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("a = 1\n")
    (root / "src" / "b.py").write_text("b = 2\n")
    os.chmod(root / "src" / "b.py", 0o755)
    (root / "empty").mkdir()
    os.symlink("src/a.py", root / "link")
    return root


def _age(root: Path) -> None:
    """Date every file an hour back (so none is 'racy' for the next snapshot)."""
    past = time.time() - 3600
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            os.utime(Path(dirpath) / name, (past, past), follow_symlinks=False)


def _agent(storage: Storage, ws: Path, prefix: str, **kw: object) -> Agent:
    @tool
    async def write_note(name: str, text: str) -> str:
        """Write a note into the workspace."""
        (ws / name).write_text(text)
        return "written"

    script = [
        {"calls": [{"name": "write_note", "args": {"name": "note.txt", "text": prefix}}]},
        {"text": "done"},
    ]
    return Agent(
        model=ScriptedModel(script),
        tools=[write_note],
        storage=storage,
        workspace=ws,
        services=Services(clock=ManualClock(tick_us=1), ids=SequentialIds(prefix)),
        **kw,  # type: ignore[arg-type]
    )


async def test_a_turn_on_the_object_store_ends_with_a_snapshot_that_restores(
    tmp_path: Path,
) -> None:
    ws = _workspace(tmp_path / "ws")
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    agent = _agent(storage, ws, "one")
    result = await agent.run("write a note", session="s1")
    assert result.status == "completed"
    events = await storage.log.read_all("s1")
    # committed together with the turn's end: snapshot, run end, turn end, in one append
    tail = [type(e.body) for e in events[-3:]]
    assert tail == [WorkspaceSnapshot, RunEnded, TurnEnded]
    snap = latest_snapshot(events)
    assert snap is not None and snap.files == 3  # a.py, b.py, note.txt
    await restore_snapshot(snap.ref, storage.artifacts, tmp_path / "restored")
    assert _describe(tmp_path / "restored") == _describe(ws)
    assert (tmp_path / "restored" / "note.txt").read_text() == "one"
    await storage.close()


async def test_the_next_turn_uploads_and_reads_only_what_changed(tmp_path: Path) -> None:
    ws = _workspace(tmp_path / "ws")
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    blobs = storage.artifacts
    assert isinstance(blobs, ObjectArtifactStore)
    await _agent(storage, ws, "one").run("first", session="s1")
    first = latest_snapshot(await storage.log.read_all("s1"))
    _age(ws)
    puts = blobs.puts
    agent = _agent(storage, ws, "two")
    await agent.run("second", session="s1")
    second = latest_snapshot(await storage.log.read_all("s1"))
    assert first is not None and second is not None and second.ref != first.ref
    assert blobs.puts - puts == 2  # the changed note and the snapshot's manifest
    await restore_snapshot(first.ref, blobs, tmp_path / "r1")
    await restore_snapshot(second.ref, blobs, tmp_path / "r2")
    assert (tmp_path / "r1" / "note.txt").read_text() == "one"
    assert _describe(tmp_path / "r2") == _describe(ws)
    await storage.close()


async def test_the_snapshotter_reads_only_changed_or_racy_files(tmp_path: Path) -> None:
    ws = _workspace(tmp_path / "ws")
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    snapshotter = WorkspaceSnapshotter(storage.artifacts)
    first = await snapshotter.take(ws)
    assert (first.files, first.read, first.uploaded) == (2, 2, 2)
    # files changed just before the previous snapshot may hide a change: read again
    racy = await snapshotter.take(ws)
    assert (racy.read, racy.uploaded, racy.ref) == (2, 0, first.ref)
    _age(ws)
    await snapshotter.take(ws)
    quiet = await snapshotter.take(ws)
    assert (quiet.read, quiet.ref) == (0, first.ref)
    # a change of size, a new file and a removed one are all seen
    (ws / "src" / "a.py").write_text("a = 100\n")
    (ws / "src" / "c.py").write_text("c = 3\n")
    (ws / "src" / "b.py").unlink()
    changed = await snapshotter.take(ws)
    assert (changed.files, changed.read, changed.uploaded) == (2, 2, 2)
    await restore_snapshot(changed.ref, storage.artifacts, tmp_path / "r")
    assert _describe(tmp_path / "r") == _describe(ws)
    await storage.close()


async def test_sqlite_sessions_snapshot_by_default_and_never_the_state_dir(
    tmp_path: Path,
) -> None:
    ws = _workspace(tmp_path / "ws")
    storage = Storage.local(ws / ".lodger")  # the state directory inside the workspace
    await _agent(storage, ws, "off", snapshots=False).run("no snapshot", session="s1")
    assert latest_snapshot(await storage.log.read_all("s1")) is None  # turned off
    await _agent(storage, ws, "on").run("snapshot", session="s2")  # on: rewind needs them
    snap = latest_snapshot(await storage.log.read_all("s2"))
    assert snap is not None
    await restore_snapshot(snap.ref, storage.artifacts, tmp_path / "restored")
    assert not (tmp_path / "restored" / ".lodger").exists()
    described = _describe(ws)
    assert _describe(tmp_path / "restored") == {
        k: v for k, v in described.items() if not k.startswith(".lodger")
    }
    await storage.close()


def test_snapshots_need_a_workspace(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="need a workspace"):
        Agent(model=ScriptedModel([{"text": "x"}]), storage=tmp_path / "s", snapshots=True)


class _FailingBlobs:
    """A real artifact store whose puts fail while ``failing`` is set."""

    def __init__(self, inner: ArtifactStore) -> None:
        self.inner = inner
        self.failing = True

    async def put(self, data: bytes, *, media_type: str = "text/plain") -> ArtifactRef:
        if self.failing:
            raise StorageError("injected: the bucket refused the put", code="artifact_write")
        return await self.inner.put(data, media_type=media_type)

    async def get(self, sha256: str) -> bytes:
        return await self.inner.get(sha256)


async def test_a_snapshot_that_cannot_be_stored_leaves_the_turn_open(tmp_path: Path) -> None:
    ws = _workspace(tmp_path / "ws")
    real = Storage.from_url(f"file://{tmp_path / 'objects'}")
    blobs = _FailingBlobs(real.artifacts)
    storage = Storage(log=real.log, artifacts=blobs, state_dir=real.state_dir)  # type: ignore[arg-type]
    with pytest.raises(StorageError, match="injected"):
        await _agent(storage, ws, "one").run("write", session="s1")
    events = await storage.log.read_all("s1")
    assert not any(isinstance(e.body, TurnEnded) for e in events)  # never ends without it
    assert (ws / "note.txt").read_text() == "one"  # the work itself is recorded
    blobs.failing = False
    resumed = await _agent(storage, ws, "two").resume("s1")
    assert resumed.status == "completed"
    events = await storage.log.read_all("s1")
    assert isinstance(events[-1].body, TurnEnded)
    assert latest_snapshot(events) is not None
    await real.close()


async def test_a_fork_starts_from_the_parent_snapshot_at_its_fork_point(tmp_path: Path) -> None:
    ws = _workspace(tmp_path / "ws")
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    await _agent(storage, ws, "one").run("first", session="parent")
    after_first = len(await storage.log.read_all("parent"))
    await _agent(storage, ws, "two").run("second", session="parent")
    fork = await fork_session(
        storage.log,
        "parent",
        fork_id="fork",
        at=after_first,
        clock=ManualClock(),
        ids=SequentialIds("f"),
    )
    assert fork.snapshot is not None
    await restore_snapshot(fork.snapshot, storage.artifacts, tmp_path / "fork-ws")
    assert (tmp_path / "fork-ws" / "note.txt").read_text() == "one"  # not "two"
    await storage.close()


async def test_a_compaction_records_the_newest_snapshot_in_the_manifest(tmp_path: Path) -> None:
    from lodger.storage.objectstore import ObjectLogStore

    ws = _workspace(tmp_path / "ws")
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    store = storage.log.store
    assert isinstance(store, ObjectLogStore)
    store.compact_after = 2
    await _agent(storage, ws, "one").run("first", session="s1")
    manifest = await store.manifest("s1")
    events = await storage.log.read_all("s1")
    snap = latest_snapshot(events)
    assert manifest is not None and snap is not None
    offset = next(e.offset for e in events if isinstance(e.body, WorkspaceSnapshot))
    assert manifest.snapshots[-1] == (offset + 1, snap.ref)
    await storage.close()

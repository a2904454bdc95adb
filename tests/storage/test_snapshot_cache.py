"""The persistent stat cache of workspace snapshots, over a real workspace, a real file
artifact store and real SQLite sessions: an unchanged workspace is snapshotted by the next
process without reading a file or a blob, a change the time stamps hide is still caught
by ctime and inode, a damaged cache is ignored, and rewinds over cached snapshots are
exact."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from lodger.events import WorkspaceSnapshot
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.builtin import workspace_tools
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage
from lodger.storage.artifacts import FileArtifactStore
from lodger.storage.snapshots import WorkspaceSnapshotter, restore_snapshot


class CountingStore(FileArtifactStore):
    """A real file artifact store that counts what is read back and stored."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gets = 0
        self.puts = 0

    async def get(self, sha256: str) -> bytes:
        self.gets += 1
        return await super().get(sha256)

    async def put(self, data: bytes, *, media_type: str = "text/plain") -> Any:
        self.puts += 1
        return await super().put(data, media_type=media_type)


def _tree(root: Path, files: int = 50) -> Path:
    for i in range(files):
        path = root / f"d{i % 5}" / f"f{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"{i:04}\n".encode() * 64)
    time.sleep(0.05)  # older than the next cache's own time stamp: not racy
    return root


def _describe(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".lodger" not in p.parts
    }


def _cache_files(cache: Path) -> list[Path]:
    return [p for p in cache.iterdir() if p.suffix == ".json"]


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, CountingStore, Path]:
    return _tree(tmp_path / "ws"), CountingStore(tmp_path / "artifacts"), tmp_path / "cache"


async def test_an_unchanged_tree_is_snapshotted_by_the_next_process_without_reading(
    world: tuple[Path, CountingStore, Path],
) -> None:
    ws, blobs, cache = world
    first = await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)
    assert (first.files, first.read, first.uploaded) == (50, 50, 50)
    await asyncio.sleep(0.05)
    gets, puts = blobs.gets, blobs.puts
    (written,) = _cache_files(cache)
    inode = written.stat().st_ino
    again = await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)  # a new process
    assert (again.ref, again.read, again.uploaded, again.size) == (first.ref, 0, 0, first.size)
    assert (blobs.gets, blobs.puts) == (gets, puts)  # no blob read back, not even the manifest
    assert _cache_files(cache) == [written] and written.stat().st_ino == inode  # not rewritten
    assert [p.name for p in cache.iterdir()] == [written.name]  # and no temporary file left
    # the uncached snapshot of the same tree agrees
    plain = await WorkspaceSnapshotter(blobs).take(ws)
    assert (plain.ref, plain.read) == (first.ref, 50)


async def test_an_unchanged_tree_reads_no_file(
    world: tuple[Path, CountingStore, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, blobs, cache = world
    await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)
    await asyncio.sleep(0.05)
    opened: list[str] = []
    real = Path.read_bytes

    def spy(self: Path) -> bytes:
        if ws in self.parents:
            opened.append(str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", spy)
    await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)
    assert opened == []
    (ws / "d0" / "f0.txt").write_text("new\n")
    changed = await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)
    assert changed.read == 1 and opened == [str(ws / "d0" / "f0.txt")]


@pytest.mark.parametrize("cached", [True, False], ids=["on-disk", "in-memory"])
async def test_a_same_size_change_with_the_old_mtime_is_caught_by_ctime_and_inode(
    world: tuple[Path, CountingStore, Path], cached: bool
) -> None:
    """In memory (no cache directory) the racy rule reads this machine's clock and the
    mtime only, so it is the stat's ctime and inode alone that catch these changes."""
    ws, blobs, cache = world
    past = time.time_ns() - 3600 * 10**9
    for path in ws.rglob("*.txt"):
        os.utime(path, ns=(past, past))
    await asyncio.sleep(0.05)
    snapshotter = WorkspaceSnapshotter(blobs, cache_dir=cache if cached else None)
    await snapshotter.take(ws)
    await asyncio.sleep(0.05)
    if cached:
        snapshotter = WorkspaceSnapshotter(blobs, cache_dir=cache)  # a new process
    target = ws / "d1" / "f1.txt"
    old = target.stat()
    target.write_bytes(b"X" * old.st_size)  # same size, in place: the ctime changes
    os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns))  # touch -d back
    other = ws / "d2" / "f2.txt"
    was = other.stat()
    fresh = ws / "replacement"
    fresh.write_bytes(b"Y" * was.st_size)
    os.utime(fresh, ns=(was.st_atime_ns, was.st_mtime_ns))
    fresh.replace(other)  # same size and mtime, another inode
    assert target.stat().st_mtime_ns == old.st_mtime_ns and target.stat().st_size == old.st_size
    taken = await snapshotter.take(ws)
    assert (taken.read, taken.uploaded) == (2, 2)
    await restore_snapshot(taken.ref, blobs, ws.parent / "restored")
    assert _describe(ws.parent / "restored") == _describe(ws)


async def test_a_file_changed_within_the_cache_tick_is_read_again(
    world: tuple[Path, CountingStore, Path],
) -> None:
    """A file whose time stamps are not older than the cache's own may have changed again
    after it was hashed, within the same tick: it is read by the next snapshot."""
    ws, blobs, cache = world
    snapshotter = WorkspaceSnapshotter(blobs, cache_dir=cache)
    await snapshotter.take(ws)
    (ws / "late.txt").write_text("late")
    # as if the write fell in the tick the cache was stamped in
    os.utime(ws / "late.txt", ns=(time.time_ns(), time.time_ns() + 10**9))
    await snapshotter.take(ws)
    await asyncio.sleep(0.05)
    again = await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)
    assert again.read == 1  # late.txt: its mtime is newer than the cache's stamp


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda raw: raw[: len(raw) // 2], id="torn"),
        pytest.param(lambda raw: b"\x00" * len(raw), id="zeroed"),
        pytest.param(lambda raw: raw.replace(b"snapcache 1 ", b"snapcache 9 ", 1), id="version"),
        pytest.param(lambda raw: raw.replace(b'"ref":"', b'"ref":"0', 1), id="edited"),
        pytest.param(lambda raw: b"[]", id="not-an-object"),
    ],
)
async def test_a_damaged_cache_is_ignored(
    world: tuple[Path, CountingStore, Path], damage: Any
) -> None:
    ws, blobs, cache = world
    first = await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)
    (path,) = _cache_files(cache)
    path.write_bytes(damage(path.read_bytes()))
    await asyncio.sleep(0.05)
    again = await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)
    assert (again.ref, again.read) == (first.ref, 50)
    # the next cache written is whole again
    await asyncio.sleep(0.05)
    assert (await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)).read == 0


async def test_a_cache_whose_sums_do_not_match_its_body_is_ignored(
    world: tuple[Path, CountingStore, Path],
) -> None:
    """An entry edited to name other bytes (the check no longer matches) is not trusted."""
    ws, blobs, cache = world
    await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)
    (path,) = _cache_files(cache)
    header, _, data = path.read_bytes().partition(b"\n")
    body = json.loads(data)
    body["files"]["d0/f0.txt"][-1] = hashlib.sha256(b"something else").hexdigest()
    path.write_bytes(header + b"\n" + json.dumps(body).encode())
    await asyncio.sleep(0.05)
    again = await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)
    assert again.read == 50
    await restore_snapshot(again.ref, blobs, ws.parent / "restored")
    assert _describe(ws.parent / "restored") == _describe(ws)


async def test_a_blob_the_cache_names_but_the_store_lost_is_stored_again(
    world: tuple[Path, CountingStore, Path],
) -> None:
    ws, blobs, cache = world
    first = await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)
    sha = hashlib.sha256((ws / "d3" / "f3.txt").read_bytes()).hexdigest()
    (blobs.root / sha[:2] / sha).unlink()
    (blobs.root / first.ref[:2] / first.ref).unlink()  # the manifest too
    await asyncio.sleep(0.05)
    again = await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)
    assert (again.ref, again.read, again.uploaded) == (first.ref, 1, 1)
    await restore_snapshot(again.ref, blobs, ws.parent / "restored")
    assert _describe(ws.parent / "restored") == _describe(ws)


def _write(path: str, content: str) -> dict[str, Any]:
    return {"calls": [{"name": "write_file", "args": {"path": path, "content": content}}]}


async def test_rewinds_over_cached_snapshots_restore_exactly(tmp_path: Path) -> None:
    """Each turn runs a new agent (as each ``lodger run`` process does) whose snapshotter
    starts from the cache; a change outside lodger that keeps size and mtime is in the
    next turn's snapshot, and rewinding to each turn puts back exactly its files."""
    ws = _tree(tmp_path / "ws", files=30)
    storage = Storage.local(ws / ".lodger")
    seen: list[dict[str, bytes]] = []
    async with Sessions(storage) as sessions:

        async def turn(*steps: dict[str, Any]) -> None:
            binding = Binding(
                model=ScriptedModel([*steps, {"text": "done"}]),
                tools=workspace_tools(),
                workspace=ws,
            )
            result = await sessions.run("go", binding=binding, session="s")
            assert result.status == "completed", result
            seen.append(_describe(ws))
            await asyncio.sleep(0.05)

        await turn(_write("a.txt", "one!"))
        target = ws / "d1" / "f1.txt"
        old = target.stat()
        target.write_bytes(b"Z" * old.st_size)
        os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns))
        await turn()  # nothing by the model: the outside change only
        await turn()  # nothing at all: the same tree, the same ref
        await turn(_write("a.txt", "two!"))
        events = await storage.log.read_all("s")
        refs = [e.body.ref for e in events if isinstance(e.body, WorkspaceSnapshot)]
        assert len(refs) == 4 and refs[1] != refs[0] and refs[2] == refs[1] != refs[3]
        assert _cache_files(ws / ".lodger" / "snapcache")
        for number in (4, 2):
            await sessions.rewind("s", turn=number, branch="s", force=True)
            assert _describe(ws) == seen[number - 2], number


async def test_a_killed_snapshot_leaves_no_cache_file_forever(
    world: tuple[Path, CountingStore, Path],
) -> None:
    ws, blobs, cache = world
    cache.mkdir()
    old, young = cache / ".snapcache-old.tmp", cache / ".snapcache-young.tmp"
    for path in (old, young):
        path.write_bytes(b"{")
    past = time.time_ns() - 2 * 3600 * 10**9
    os.utime(old, ns=(past, past))
    await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)
    assert not old.exists() and young.exists()  # a live snapshot's may be young
    assert len(_cache_files(cache)) == 1


async def test_a_cache_directory_that_cannot_be_written_costs_only_the_cache(
    world: tuple[Path, CountingStore, Path],
) -> None:
    ws, blobs, cache = world
    cache.write_text("a file where the directory should be")
    snapshotter = WorkspaceSnapshotter(blobs, cache_dir=cache)
    first = await snapshotter.take(ws)
    again = await WorkspaceSnapshotter(blobs, cache_dir=cache).take(ws)
    assert (first.read, again.read, again.ref) == (50, 50, first.ref)
    await restore_snapshot(again.ref, blobs, ws.parent / "restored")
    assert _describe(ws.parent / "restored") == _describe(ws)

"""Workspace snapshots: restoring reproduces any tree byte for byte (files, modes,
symlinks, empty directories), and a second snapshot uploads only what changed."""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lodger.errors import StorageError
from lodger.storage.artifacts import MemoryArtifactStore
from lodger.storage.objectartifacts import ObjectArtifactStore
from lodger.storage.objectstore import open_object_store
from lodger.storage.snapshots import restore_snapshot, snapshot_workspace

_NAMES = st.text(alphabet="abcdefgh_.-", min_size=1, max_size=6).filter(
    lambda n: n not in (".", "..")
)
_FILE = st.tuples(
    st.just("file"), st.binary(max_size=300), st.sampled_from([0o644, 0o600, 0o755, 0o444])
)
_LINK = st.tuples(st.just("link"), st.sampled_from(["x", "../y", "sub/z", "/abs/path"]), st.none())
_TREE = st.recursive(
    st.one_of(_FILE, _LINK),
    lambda children: st.tuples(
        st.just("dir"),
        st.dictionaries(_NAMES, children, max_size=4),
        st.sampled_from([0o755, 0o700, 0o750]),
    ),
    max_leaves=12,
)
_ROOTS = st.dictionaries(_NAMES, _TREE, max_size=5)


def _build(root: Path, tree: dict[str, tuple[str, object, object]]) -> None:
    for name, (kind, content, mode) in tree.items():
        path = root / name
        if kind == "file":
            assert isinstance(content, bytes) and isinstance(mode, int)
            path.write_bytes(content)
            os.chmod(path, mode)
        elif kind == "link":
            os.symlink(str(content), path)
        else:
            path.mkdir()
            _build(path, content)  # type: ignore[arg-type]
            assert isinstance(mode, int)
            os.chmod(path, mode)


def _describe(root: Path) -> dict[str, tuple[str, object, int]]:
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


@pytest.mark.slow
@settings(max_examples=40)
@given(_ROOTS)
def test_restore_reproduces_any_tree_byte_for_byte(tree: dict) -> None:  # type: ignore[type-arg]
    blobs = MemoryArtifactStore()
    with tempfile.TemporaryDirectory() as tmp:
        source, restored = Path(tmp) / "src", Path(tmp) / "dst"
        source.mkdir()
        _build(source, tree)
        made = asyncio.run(snapshot_workspace(source, blobs))
        asyncio.run(restore_snapshot(made.ref, blobs, restored))
        assert _describe(restored) == _describe(source)
        # the same tree gives the same ref (the manifest is canonical)
        assert asyncio.run(snapshot_workspace(source, blobs)).ref == made.ref


async def test_second_snapshot_uploads_only_the_changed_file(tmp_path: Path) -> None:
    where = open_object_store(f"file://{tmp_path / 'objects'}")
    blobs = ObjectArtifactStore(where.store)
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    for n in range(5):
        (ws / "pkg" / f"m{n}.py").write_text(f"value = {n}\n")
    first = await snapshot_workspace(ws, blobs)
    assert (first.files, first.uploaded) == (5, 5)
    (ws / "pkg" / "m2.py").write_text("value = 'changed'\n")
    second = await snapshot_workspace(ws, blobs)
    assert (second.files, second.uploaded) == (5, 1)
    assert second.ref != first.ref
    # both snapshots restore to the tree they were taken of
    await restore_snapshot(first.ref, blobs, tmp_path / "r1")
    await restore_snapshot(second.ref, blobs, tmp_path / "r2")
    assert (tmp_path / "r1" / "pkg" / "m2.py").read_text() == "value = 2\n"
    assert _describe(tmp_path / "r2") == _describe(ws)


class _OverlappingLookups(MemoryArtifactStore):
    """Artifacts whose ``exists`` holds each lookup until another one is in flight: a
    snapshot that looks files up one after another never finishes (the timeout fails it)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most = 0
        self._overlapped = asyncio.Event()

    async def exists(self, sha256: str, *, size: int) -> bool:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        if self.in_flight > 1:
            self._overlapped.set()
        try:
            await self._overlapped.wait()
            try:
                await self.get(sha256)
            except StorageError:
                return False
            return True
        finally:
            self.in_flight -= 1


async def test_a_snapshot_looks_its_files_up_concurrently(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    for i in range(20):
        (workspace / f"f{i}.txt").write_text(f"file {i}")
    blobs = _OverlappingLookups()
    async with asyncio.timeout(30):
        result = await snapshot_workspace(workspace, blobs)
    assert (result.files, result.uploaded) == (20, 20)
    assert 1 < blobs.most <= 8  # a few lanes at once, never all of a large tree
    target = tmp_path / "restored"
    await restore_snapshot(result.ref, blobs, target)
    assert sorted(p.name for p in target.iterdir()) == sorted(f"f{i}.txt" for i in range(20))

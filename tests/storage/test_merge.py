"""Three-way application of a child's workspace changes (base snapshot -> final snapshot)
to its parent's workspace as it is now: real directories, real snapshots."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from lodger.errors import StorageError
from lodger.storage.artifacts import MemoryArtifactStore
from lodger.storage.merge import MergeReport, apply_snapshot_changes
from lodger.storage.snapshots import restore_snapshot, snapshot_workspace


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _read(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


async def _child_edits(
    tmp_path: Path, base_files: dict[str, str], edit: object
) -> tuple[MemoryArtifactStore, str, str, Path]:
    """The parent's workspace (from ``base_files``), the base snapshot, a child's copy
    edited by ``edit(child_dir)`` and its final snapshot."""
    blobs = MemoryArtifactStore()
    parent = tmp_path / "parent"
    _tree(parent, base_files)
    base = await snapshot_workspace(parent, blobs)
    child = tmp_path / "child"
    await restore_snapshot(base.ref, blobs, child)
    edit(child)  # type: ignore[operator]
    final = await snapshot_workspace(child, blobs)
    return blobs, base.ref, final.ref, parent


def test_the_childs_changes_arrive_when_the_parent_changed_nothing(tmp_path: Path) -> None:
    def edit(child: Path) -> None:
        (child / "keep.txt").write_text("edited by the child")
        (child / "gone.txt").unlink()
        shutil.rmtree(child / "old")
        _tree(child, {"new/deep/file.py": "print(1)"})
        os.symlink("keep.txt", child / "link")
        os.chmod(child / "script.sh", 0o755)

    async def scenario() -> None:
        blobs, base, final, parent = await _child_edits(
            tmp_path,
            {"keep.txt": "v1", "gone.txt": "x", "old/a.txt": "a", "script.sh": "#!/bin/sh"},
            edit,
        )
        report = await apply_snapshot_changes(base, final, blobs, parent)
        assert report.conflicts == []
        assert "keep.txt" in report.applied and "old" in report.applied
        # the parent's workspace is now exactly the child's
        assert (await snapshot_workspace(parent, blobs)).ref == final
        again = await apply_snapshot_changes(base, final, blobs, parent)  # a recovery
        assert again.applied == report.applied and again.conflicts == []
        assert (await snapshot_workspace(parent, blobs)).ref == final

    asyncio.run(scenario())


def test_what_both_changed_keeps_the_parents_version_and_is_reported(tmp_path: Path) -> None:
    def edit(child: Path) -> None:
        (child / "shared.txt").write_text("child's")
        (child / "mine.txt").write_text("child's only")
        shutil.rmtree(child / "dir")

    async def scenario() -> None:
        blobs, base, final, parent = await _child_edits(
            tmp_path,
            {"shared.txt": "v1", "mine.txt": "v1", "dir/a.txt": "a", "dir/b.txt": "b"},
            edit,
        )
        # meanwhile the parent edits one file and adds one inside the directory the
        # child removed
        (parent / "shared.txt").write_text("parent's")
        (parent / "dir" / "added.txt").write_text("parent's new file")
        report = await apply_snapshot_changes(base, final, blobs, parent)
        assert report.conflicts == ["dir", "shared.txt"]
        assert report.applied == ["dir/a.txt", "dir/b.txt", "mine.txt"]
        assert _read(parent) == {
            "dir/added.txt": "parent's new file",
            "mine.txt": "child's only",
            "shared.txt": "parent's",
        }

    asyncio.run(scenario())


def test_a_symlink_planted_in_the_parent_is_never_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()

    def edit(child: Path) -> None:
        (child / "sub" / "f.txt").write_text("through the link?")

    async def scenario() -> None:
        blobs, base, final, parent = await _child_edits(tmp_path, {"sub/f.txt": "v1"}, edit)
        shutil.rmtree(parent / "sub")
        os.symlink(outside, parent / "sub")
        report = await apply_snapshot_changes(base, final, blobs, parent)
        assert report == MergeReport(applied=[], conflicts=["sub/f.txt"])
        assert list(outside.iterdir()) == []

    asyncio.run(scenario())


def test_a_manifest_naming_a_path_outside_its_root_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        blobs = MemoryArtifactStore()
        (tmp_path / "ws").mkdir()
        base = await snapshot_workspace(tmp_path / "ws", blobs)
        data = await blobs.put(b"owned", media_type="application/octet-stream")
        hostile = {
            "entries": [
                {
                    "path": "../escape.txt",
                    "type": "file",
                    "mode": 420,
                    "sha256": data.sha256,
                    "size": 5,
                }
            ],
            "v": 1,
        }
        ref = await blobs.put(json.dumps(hostile).encode(), media_type="application/json")
        with pytest.raises(StorageError) as caught:
            await apply_snapshot_changes(base.ref, ref.sha256, blobs, tmp_path / "ws")
        assert caught.value.code == "artifact_corrupt"
        assert not (tmp_path / "escape.txt").exists()

    asyncio.run(scenario())

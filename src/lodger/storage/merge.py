"""Bring a detached child's workspace edits back into its parent's workspace.

A child that runs on another worker starts from a snapshot of its parent's workspace (the
*base*) and ends with its own (the *final* snapshot). When the parent wakes, the
changes between the two are applied to the parent's workspace as it is *now*, path by
path, three-way:

- the child did not change the path: nothing to do;
- the parent's entry is still the base's: the child's version is written (or the path
  removed, when the child removed it);
- the parent's entry is already the child's (a recovery applying the same changes again
  after a crash): counted as applied, nothing written;
- otherwise both changed it: the parent's version is kept and the path is reported as a
  conflict, for the model to sort out.

Files (contents and permission bits), symlinks (never followed) and directories are
compared; a path whose parent directories in the workspace are not plain directories
(a symlink planted there, say) is never written through, and a manifest naming a path
outside its root is refused. Every blob read back is checked against its hash by the
artifact store.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from lodger.errors import StorageError
from lodger.storage.artifacts import ArtifactStore

__all__ = ["MergeReport", "apply_snapshot_changes"]

Entry = dict[str, Any]


@dataclass(frozen=True)
class MergeReport:
    #: paths the child changed that the parent now has as the child left them
    applied: list[str] = field(default_factory=list)
    #: paths both changed: the parent's version was kept
    conflicts: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, list[str]]:
        return {"applied": self.applied, "conflicts": self.conflicts}


async def _entries(ref: str, blobs: ArtifactStore) -> dict[str, Entry]:
    raw = json.loads(await blobs.get(ref))
    out: dict[str, Entry] = {}
    for entry in raw["entries"]:
        path = PurePosixPath(entry["path"])
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise StorageError(
                f"snapshot {ref[:16]} names a path outside its root: {entry['path']!r}",
                hint="the snapshot was written outside lodger",
                code="artifact_corrupt",
            )
        out[path.as_posix()] = entry
    return out


def _same(a: Entry | None, b: Entry | None) -> bool:
    if a is None or b is None:
        return a is b
    if a["type"] != b["type"]:
        return False
    if a["type"] == "file":
        return bool(a["sha256"] == b["sha256"] and a["mode"] == b["mode"])
    if a["type"] == "symlink":
        return bool(a["target"] == b["target"])
    return True  # directories: their modes are not merged


def _safe_parent(root: Path, rel: str) -> bool:
    """Every directory between ``root`` and ``rel`` is a real directory (or missing)."""
    here = root
    for part in PurePosixPath(rel).parts[:-1]:
        here = here / part
        try:
            info = here.lstat()
        except FileNotFoundError:
            return True
        if not stat.S_ISDIR(info.st_mode):
            return False
    return True


def _current(root: Path, rel: str) -> Entry | None:
    """The parent's entry at ``rel`` now, in a manifest's shape (None: absent, or not
    reachable without following a link)."""
    if not _safe_parent(root, rel):
        return {"type": "blocked"}
    path = root / rel
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return {"type": "symlink", "target": os.readlink(path)}
    if stat.S_ISDIR(info.st_mode):
        return {"type": "dir"}
    if stat.S_ISREG(info.st_mode):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return {"type": "file", "sha256": digest, "mode": stat.S_IMODE(info.st_mode)}
    return {"type": "other"}


def _clear(path: Path) -> bool:
    """Remove the file, link or EMPTY directory at ``path``; False when it is a directory
    that still holds something (the parent's own entries: never removed)."""
    info = path.lstat()
    if stat.S_ISDIR(info.st_mode):
        try:
            path.rmdir()
        except OSError:
            return False
    else:
        path.unlink()
    return True


def _write(root: Path, rel: str, entry: Entry, data: bytes | None) -> bool:
    """Write ``entry`` at ``rel`` in place of what is there; False when a directory that
    still holds something is in the way."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if (path.is_symlink() or path.exists()) and not _clear(path):
        return False
    if entry["type"] == "dir":
        path.mkdir(mode=int(entry.get("mode", 0o755)))
    elif entry["type"] == "symlink":
        os.symlink(entry["target"], path)
    else:
        assert data is not None
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(path, int(entry["mode"]))
    return True


async def apply_snapshot_changes(
    base_ref: str, final_ref: str, blobs: ArtifactStore, into: str | os.PathLike[str]
) -> MergeReport:
    """Apply what changed from snapshot ``base_ref`` to ``final_ref`` to the directory
    ``into`` (see the module docstring); idempotent."""
    root = Path(into)
    report = MergeReport()
    if base_ref == final_ref:
        return report
    base, final = await _entries(base_ref, blobs), await _entries(final_ref, blobs)
    changed = [p for p in base.keys() | final.keys() if not _same(base.get(p), final.get(p))]
    depth = {p: len(PurePosixPath(p).parts) for p in changed}
    # removals deepest first (a directory is emptied before it goes), then the rest
    # shallowest first (a directory is made before what goes in it)
    removed = sorted((p for p in changed if p not in final), key=lambda p: (-depth[p], p))
    written = sorted((p for p in changed if p in final), key=lambda p: (depth[p], p))
    for rel in [*removed, *written]:
        now = await asyncio.to_thread(_current, root, rel)
        wanted = final.get(rel)
        if _same(now, wanted):
            report.applied.append(rel)  # absent already, or applied by an earlier try
        elif not _same(now, base.get(rel)):
            report.conflicts.append(rel)  # the parent changed it too: its version stays
        elif wanted is None:
            done = await asyncio.to_thread(_clear, root / rel)
            (report.applied if done else report.conflicts).append(rel)
        else:
            data = await blobs.get(wanted["sha256"]) if wanted["type"] == "file" else None
            done = await asyncio.to_thread(_write, root, rel, wanted, data)
            (report.applied if done else report.conflicts).append(rel)
    report.applied.sort()
    report.conflicts.sort()
    return report

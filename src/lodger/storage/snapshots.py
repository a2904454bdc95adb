"""Content-addressed workspace snapshots.

A snapshot is a manifest of the workspace's entries, stored itself as a blob in an
``ArtifactStore`` (its sha256 is the snapshot's ref)::

    {"entries": [{"path": "a", "type": "dir", "mode": 493},
                 {"path": "a/f.txt", "type": "file", "mode": 420, "sha256": "...", "size": 3},
                 {"path": "a/link", "type": "symlink", "target": "f.txt"}], "v": 1}

File contents are blobs under their sha256, so a snapshot is incremental: a file whose
bytes are already stored (from an earlier snapshot, another session or a fork's parent)
is not uploaded again. Symlinks are recorded, never followed. Restoring into an empty
directory reproduces the tree byte for byte: contents, permission bits, symlinks and
empty directories (not owners or times). Every blob read back is checked against its hash.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lodger.errors import StorageError, UsageError
from lodger.storage.artifacts import ArtifactStore

__all__ = ["SnapshotResult", "restore_snapshot", "snapshot_workspace"]

_MEDIA_TYPE = "application/vnd.lodger.snapshot+json"


@dataclass(frozen=True, kw_only=True)
class SnapshotResult:
    ref: str
    files: int
    size: int
    #: file blobs uploaded by this snapshot (the rest were already stored)
    uploaded: int


def _scan(root: Path) -> list[dict[str, Any]]:
    """Every entry under ``root``, sorted by path, without following symlinks."""
    entries: list[dict[str, Any]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        here = Path(dirpath)
        for name in [*dirnames, *filenames]:
            path = here / name
            rel = path.relative_to(root).as_posix()
            info = path.lstat()
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                entries.append({"path": rel, "type": "symlink", "target": os.readlink(path)})
            elif stat.S_ISDIR(info.st_mode):
                entries.append({"path": rel, "type": "dir", "mode": mode})
            elif stat.S_ISREG(info.st_mode):
                entries.append({"path": rel, "type": "file", "mode": mode, "size": info.st_size})
            # sockets, fifos and devices are not workspace content
        # a symlinked directory shows in dirnames (recorded above as a symlink); never
        # descend into it
        dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()]
    return sorted(entries, key=lambda e: str(e["path"]))


async def snapshot_workspace(root: str | os.PathLike[str], blobs: ArtifactStore) -> SnapshotResult:
    """Store the tree under ``root``; upload only file contents not stored yet."""
    base = Path(root)
    entries = await asyncio.to_thread(_scan, base)
    uploaded = 0
    size = 0
    for entry in entries:
        if entry["type"] != "file":
            continue
        data = await asyncio.to_thread((base / entry["path"]).read_bytes)
        sha256 = hashlib.sha256(data).hexdigest()
        entry["sha256"] = sha256
        entry["size"] = len(data)
        size += len(data)
        if not await _stored(blobs, sha256):
            await blobs.put(data, media_type="application/octet-stream")
            uploaded += 1
    manifest = json.dumps({"entries": entries, "v": 1}, sort_keys=True).encode()
    ref = await blobs.put(manifest, media_type=_MEDIA_TYPE)
    files = sum(1 for e in entries if e["type"] == "file")
    return SnapshotResult(ref=ref.sha256, files=files, size=size, uploaded=uploaded)


async def _stored(blobs: ArtifactStore, sha256: str) -> bool:
    exists = getattr(blobs, "exists", None)
    if exists is not None:
        return bool(await exists(sha256))
    try:
        await blobs.get(sha256)
    except StorageError as exc:
        if exc.code == "artifact_missing":
            return False
        raise
    return True


async def restore_snapshot(
    ref: str, blobs: ArtifactStore, into: str | os.PathLike[str]
) -> SnapshotResult:
    """Recreate snapshot ``ref`` in the empty (or missing) directory ``into``."""
    target = Path(into)
    if await asyncio.to_thread(_not_empty, target):
        raise UsageError(
            f"cannot restore snapshot {ref[:16]} into {target}: the directory is not empty",
            hint="restore into a new, empty directory",
            code="usage",
        )
    raw = json.loads(await blobs.get(ref))
    entries: list[dict[str, Any]] = raw["entries"]
    await asyncio.to_thread(target.mkdir, parents=True, exist_ok=True)
    size = 0
    for entry in entries:
        path = target / entry["path"]
        if ".." in Path(entry["path"]).parts or Path(entry["path"]).is_absolute():
            raise StorageError(
                f"snapshot {ref[:16]} names a path outside its root: {entry['path']!r}",
                hint="the snapshot was written outside lodger",
                code="artifact_corrupt",
            )
        if entry["type"] == "dir":
            await asyncio.to_thread(path.mkdir, exist_ok=True)
        elif entry["type"] == "symlink":
            await asyncio.to_thread(os.symlink, entry["target"], path)
        else:
            data = await blobs.get(entry["sha256"])
            size += len(data)
            await asyncio.to_thread(_write_file, path, data, int(entry["mode"]))
    # directory modes last, deepest first, so a read-only directory can still be filled
    for entry in sorted((e for e in entries if e["type"] == "dir"), key=lambda e: -len(e["path"])):
        await asyncio.to_thread(os.chmod, target / entry["path"], int(entry["mode"]))
    files = sum(1 for e in entries if e["type"] == "file")
    return SnapshotResult(ref=ref, files=files, size=size, uploaded=0)


def _not_empty(path: Path) -> bool:
    return path.exists() and any(path.iterdir())


def _write_file(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)

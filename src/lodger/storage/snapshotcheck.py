"""Checking a session's workspace snapshots against the blobs they name, and repairing them.

A snapshot (``lodger.storage.snapshots``) trusts a blob already stored under a file's
hash after one look: on an object store a HEAD with the size, never reading it back (that
would be a GET per file of every snapshot). A blob damaged outside lodger with its size
kept is therefore found only when a restore reads it. ``check_snapshots`` is the deep
check, run on demand (``lodger store verify --deep``): it reads every blob of the
snapshots back, streamed, and compares its sha256 with its name. With ``repair`` and a
workspace, a damaged or missing blob is stored again from a file of the workspace whose
bytes still hash to the name (the put keeps the damaged copy aside, as found); one no
workspace file matches is reported as unrepairable.

>>> report = await check_snapshots(
...     [("log", ref)], storage.artifacts, session_id="s1", workspace=Path("."), repair=True
... )
>>> report.unrepaired
()
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lodger.errors import StorageError
from lodger.storage.artifacts import ArtifactStore, FileArtifactStore, check_sha256

__all__ = ["BlobDamage", "SnapshotCheck", "check_snapshots"]

Problem = Literal["missing", "corrupt", "size"]


@dataclass(frozen=True, kw_only=True)
class BlobDamage:
    """One blob a snapshot names that does not hold its bytes."""

    session_id: str
    #: the snapshot's ref (the sha256 of its manifest)
    snapshot: str
    #: the workspace path the snapshot stores in this blob ("" for the manifest itself)
    path: str
    sha256: str
    #: where the blob lives in its store (``blobs/ab/ab...`` or the file's path)
    key: str
    problem: Problem
    repaired: bool = False
    #: the workspace file it was repaired from, or why it could not be
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "snapshot": self.snapshot,
            "path": self.path,
            "sha256": self.sha256,
            "key": self.key,
            "problem": self.problem,
            "repaired": self.repaired,
            "note": self.note,
        }


@dataclass(frozen=True, kw_only=True)
class SnapshotCheck:
    session_id: str
    #: the snapshot refs checked, with where each was found (``log``, ``index``)
    snapshots: tuple[tuple[str, str], ...] = ()
    #: distinct blobs read back (or looked at, without ``deep``)
    blobs: int = 0
    bytes_read: int = 0
    damage: tuple[BlobDamage, ...] = field(default_factory=tuple)

    @property
    def unrepaired(self) -> tuple[BlobDamage, ...]:
        return tuple(d for d in self.damage if not d.repaired)

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "snapshots": [{"ref": ref, "found_in": where} for where, ref in self.snapshots],
            "blobs": self.blobs,
            "bytes_read": self.bytes_read,
            "damage": [d.to_dict() for d in self.damage],
            "unrepaired": len(self.unrepaired),
        }


async def check_snapshots(
    refs: Iterable[tuple[str, str]],
    blobs: ArtifactStore,
    *,
    session_id: str,
    deep: bool = True,
    workspace: Path | None = None,
    repair: bool = False,
) -> SnapshotCheck:
    """Check each snapshot of ``refs`` (``(where found, ref)`` pairs) in ``blobs``.

    ``deep``: read every blob back and hash it (else: only whether it is there with its
    size, as a snapshot checks). ``repair``: store a damaged blob again from the file of
    ``workspace`` (at any path the snapshots give it) whose bytes hash to its name."""
    seen: dict[str, int] = {}  # blob -> bytes read
    damage: list[BlobDamage] = []
    checked: list[tuple[str, str]] = []
    for where, ref in refs:
        if any(r == ref for _, r in checked):
            continue
        checked.append((where, ref))
        entries = await _manifest(blobs, ref, session_id, damage)
        if entries is None:
            continue
        by_blob: dict[str, list[dict[str, Any]]] = {}
        for entry in entries:
            if entry.get("type") == "file":
                by_blob.setdefault(str(entry["sha256"]), []).append(entry)
        for sha256, files in sorted(by_blob.items()):
            if sha256 in seen:
                continue
            problem, read = await _look(blobs, sha256, int(files[0]["size"]), deep=deep)
            seen[sha256] = read
            if problem is None:
                continue
            found = BlobDamage(
                session_id=session_id,
                snapshot=ref,
                path=str(files[0]["path"]),
                sha256=sha256,
                key=blob_location(blobs, sha256),
                problem=problem,
            )
            if repair:
                found = await _repair(found, blobs, workspace, [str(f["path"]) for f in files])
            damage.append(found)
    return SnapshotCheck(
        session_id=session_id,
        snapshots=tuple(checked),
        blobs=len(seen),
        bytes_read=sum(seen.values()),
        damage=tuple(damage),
    )


async def _manifest(
    blobs: ArtifactStore, ref: str, session_id: str, damage: list[BlobDamage]
) -> list[dict[str, Any]] | None:
    """The entries of snapshot ``ref``; None (and its damage noted) when it is unreadable."""
    try:
        raw = json.loads(await blobs.get(ref))
        entries = raw["entries"]
        if not isinstance(entries, list):
            raise TypeError("entries is not a list")
        for entry in entries:
            if entry.get("type") == "file":
                check_sha256(str(entry["sha256"]))
                int(entry["size"])
        return entries
    except StorageError as exc:
        problem: Problem = "missing" if exc.code == "artifact_missing" else "corrupt"
        note = "the snapshot's manifest cannot be read; no workspace file repairs it"
    except (ValueError, TypeError, KeyError, AttributeError):
        problem, note = "corrupt", "the snapshot's manifest is not one lodger wrote"
    damage.append(
        BlobDamage(
            session_id=session_id,
            snapshot=ref,
            path="",
            sha256=ref,
            key=blob_location(blobs, ref),
            problem=problem,
            note=note,
        )
    )
    return None


async def _look(
    blobs: ArtifactStore, sha256: str, size: int, *, deep: bool
) -> tuple[Problem | None, int]:
    """What is wrong with the stored copy of ``sha256`` (None: nothing), and the bytes read."""
    if not deep:
        exists = getattr(blobs, "exists", None)
        if exists is not None:
            if await exists(sha256):
                return (None if await exists(sha256, size=size) else "size"), 0
            return "missing", 0
    digest = getattr(blobs, "stored_digest", None)
    if digest is not None:
        found = await digest(sha256)
        if found is None:
            return "missing", 0
        got, read = found
        return (None if got == sha256 else "corrupt"), read
    try:
        data = await blobs.get(sha256)
    except StorageError as exc:
        if exc.code == "artifact_missing":
            return "missing", 0
        if exc.code == "artifact_corrupt":
            return "corrupt", 0
        raise
    return None, len(data)


async def _repair(
    found: BlobDamage, blobs: ArtifactStore, workspace: Path | None, paths: Sequence[str]
) -> BlobDamage:
    if workspace is None:
        return _with(found, note="no workspace given to repair it from (--workspace)")
    for path in paths:
        data = await asyncio.to_thread(_workspace_file, workspace, path)
        if data is not None and hashlib.sha256(data).hexdigest() == found.sha256:
            await blobs.put(data, media_type="application/octet-stream")
            return _with(found, repaired=True, note=f"stored again from {path}")
    return _with(
        found,
        note=f"unrepairable: no file of {workspace} holds these bytes any more "
        f"(looked at {', '.join(paths)})",
    )


def _with(found: BlobDamage, *, repaired: bool = False, note: str) -> BlobDamage:
    return BlobDamage(**{**found.__dict__, "repaired": repaired, "note": note})


def _workspace_file(workspace: Path, relative: str) -> bytes | None:
    """The bytes of the regular file ``relative`` inside ``workspace``; None if it is
    not one (missing, a symlink, a directory, or a path leading out of the workspace)."""
    parts = Path(relative).parts
    if not parts or Path(relative).is_absolute() or ".." in parts:
        return None
    root = os.path.realpath(workspace)
    path = os.path.join(root, *parts)
    if os.path.realpath(os.path.dirname(path)) != os.path.dirname(path):
        return None  # a symlinked directory on the way
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        return handle.read()


def blob_location(blobs: ArtifactStore, sha256: str) -> str:
    """Where ``sha256`` lives in ``blobs``: its object key, or its file's path."""
    if isinstance(blobs, FileArtifactStore):
        return str(blobs.root / sha256[:2] / sha256)
    # an object store's blobs exist only once its module (the ``s3`` extra) is loaded:
    # looked up, not imported, so checking a SQLite state directory needs no obstore
    objects = sys.modules.get("lodger.storage.objectartifacts")
    if objects is not None and isinstance(blobs, objects.ObjectArtifactStore):
        return str(objects.blob_key(sha256))
    return sha256

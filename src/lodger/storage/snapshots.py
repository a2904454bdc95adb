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

``WorkspaceSnapshotter`` takes the snapshots a session records at each turn's end: it
remembers, per file, the ``(size, mtime, ctime, inode, device)`` it last hashed, so a file
that did not change since is not read again, and a tree that did not change is not stored
again (the same manifest, the same ref). With a ``cache_dir`` (a local state directory's
``snapcache``) that memory is kept on disk per workspace (``lodger.storage._snapcache``),
so each ``lodger run`` process starts from the last one's. A file whose time stamps are
not older than the cache's own (the cache file's mtime when the previous scan began, on
the same device), or younger than ``_RACY_S`` seconds before that scan by this machine's
clock (on another device, or with no cache on disk), is always read again: its change may
not show in the time stamp (git's "racy clean" rule). A blob the cache names is looked up
in the store (one ``stat`` for file artifacts, never a read) before a snapshot refers to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lodger.errors import StorageError, UsageError
from lodger.events import Event, WorkspaceSnapshot
from lodger.storage._snapcache import CacheWriter, Stat, StatCache, cache_path
from lodger.storage._snapcache import load as load_cache
from lodger.storage.artifacts import ArtifactStore

__all__ = [
    "SnapshotResult",
    "WorkspaceSnapshotter",
    "latest_snapshot",
    "restore_snapshot",
    "snapshot_workspace",
]

_MEDIA_TYPE = "application/vnd.lodger.snapshot+json"
_RACY_S = 2.0
#: files read, looked up and stored at once by a snapshot
_LANES = 8


@dataclass(frozen=True, kw_only=True)
class SnapshotResult:
    ref: str
    files: int
    size: int
    #: file blobs uploaded by this snapshot (the rest were already stored)
    uploaded: int
    #: files read and hashed (the rest were unchanged since the previous snapshot)
    read: int = 0


def _scan(root: Path, exclude: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Every entry under ``root``, sorted by path, without following symlinks; the
    relative paths in ``exclude`` (and everything under them) are left out. A directory
    that cannot be listed is skipped, as ``os.walk`` does."""
    entries: list[dict[str, Any]] = []
    pending = [(os.fspath(root), "")]
    while pending:
        here, prefix = pending.pop()
        try:
            with os.scandir(here) as listing:
                found = list(listing)
        except OSError:
            continue
        for item in found:
            rel = prefix + item.name
            if rel in exclude:
                continue
            info = item.stat(follow_symlinks=False)
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):  # recorded, never followed nor descended into
                entries.append({"path": rel, "type": "symlink", "target": os.readlink(item)})
            elif stat.S_ISDIR(info.st_mode):
                entries.append({"path": rel, "type": "dir", "mode": mode})
                pending.append((item.path, rel + "/"))
            elif stat.S_ISREG(info.st_mode):
                seen = (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)
                entries.append(
                    {"path": rel, "type": "file", "mode": mode, "size": info.st_size, "_stat": seen}
                )
            # sockets, fifos and devices are not workspace content
    return sorted(entries, key=lambda e: str(e["path"]))


async def snapshot_workspace(
    root: str | os.PathLike[str],
    blobs: ArtifactStore,
    *,
    exclude: Sequence[str | os.PathLike[str]] = (),
) -> SnapshotResult:
    """Store the tree under ``root``; upload only file contents not stored yet.
    ``exclude`` names paths (absolute, or relative to ``root``) left out of it."""
    excluded = await asyncio.to_thread(_relative, Path(root), exclude)
    return await _snapshot(Path(root), blobs, excluded, None)


async def _snapshot(
    base: Path,
    blobs: ArtifactStore,
    exclude: frozenset[str],
    known: dict[str, tuple[Stat, str]] | None,
    fresh: Callable[[Stat], bool] = lambda _: False,
    confirmed: set[str] | None = None,
    last_ref: str | None = None,
) -> SnapshotResult:
    """Store the tree under ``base``. A file whose stat matches its entry in ``known``
    and is ``fresh`` (not racy) keeps the entry's hash unread; its blob is looked up
    unless ``confirmed`` (this process's record of blobs known stored) holds it. ``known``
    is updated to the tree as scanned; ``last_ref`` is the previous snapshot's ref, not
    stored again when the tree did not change."""
    entries = await asyncio.to_thread(_scan, base, exclude)
    confirmed = set() if confirmed is None else confirmed
    size = 0
    todo: list[tuple[dict[str, Any], Stat]] = []
    unchecked: list[tuple[dict[str, Any], Stat]] = []
    for entry in entries:
        if entry["type"] != "file":
            continue
        seen = entry.pop("_stat")
        previous = known.get(entry["path"]) if known is not None else None
        if previous is not None and previous[0] == seen and fresh(seen):
            entry["sha256"] = previous[1]  # unchanged since it was hashed and stored
            if previous[1] not in confirmed:
                unchecked.append((entry, seen))
            size += int(entry["size"])
            continue
        todo.append((entry, seen))
    for entry, seen in await _not_stored(blobs, unchecked, confirmed):
        size -= int(entry["size"])
        todo.append((entry, seen))  # named by the cache, gone from the store: read again
    uploaded = await _store_files(base, blobs, todo, known, confirmed)
    size += sum(int(entry["size"]) for entry, _ in todo)
    if known is not None:
        paths = {e["path"] for e in entries if e["type"] == "file"}
        for gone in [p for p in known if p not in paths]:
            del known[gone]
    manifest = json.dumps({"entries": entries, "v": 1}, sort_keys=True).encode()
    ref = hashlib.sha256(manifest).hexdigest()
    if not (ref == last_ref and await _known_stored(blobs, ref, len(manifest), confirmed)):
        ref = (await blobs.put(manifest, media_type=_MEDIA_TYPE)).sha256
        confirmed.add(ref)
    files = sum(1 for e in entries if e["type"] == "file")
    return SnapshotResult(ref=ref, files=files, size=size, uploaded=uploaded, read=len(todo))


async def _known_stored(blobs: ArtifactStore, sha256: str, size: int, confirmed: set[str]) -> bool:
    if sha256 in confirmed:
        return True
    if await _stored(blobs, sha256, size):
        confirmed.add(sha256)
        return True
    return False


async def _not_stored(
    blobs: ArtifactStore, items: list[tuple[dict[str, Any], Stat]], confirmed: set[str]
) -> list[tuple[dict[str, Any], Stat]]:
    """Those of ``items`` whose blob the store does not hold (the rest are confirmed)."""
    if not items:
        return []
    wanted = sorted({(str(e["sha256"]), int(e["size"])) for e, _ in items})
    many = getattr(blobs, "exists_many", None)
    if many is not None:  # one look at the local disk for all of them
        held = dict(zip(wanted, await many(wanted), strict=True))
    else:
        lanes = asyncio.Semaphore(_LANES)

        async def look(sha256: str, size: int) -> bool:
            async with lanes:
                return await _stored(blobs, sha256, size)

        async with asyncio.TaskGroup() as group:
            tasks = {key: group.create_task(look(*key)) for key in wanted}
        held = {key: task.result() for key, task in tasks.items()}
    confirmed.update(sha for (sha, _), ok in held.items() if ok)
    return [(e, s) for e, s in items if not held[(str(e["sha256"]), int(e["size"]))]]


async def _store_files(
    base: Path,
    blobs: ArtifactStore,
    todo: list[tuple[dict[str, Any], Stat]],
    known: dict[str, tuple[Stat, str]] | None,
    confirmed: set[str],
) -> int:
    """Read, hash and store the files of ``todo`` (filling in their entries); how many
    blobs were uploaded. They are read, looked up and stored a few at a time, not one
    round trip to the store after another (a remote store answers each in milliseconds)."""
    lanes = asyncio.Semaphore(_LANES)

    async def store(entry: dict[str, Any], seen: Stat) -> bool:
        async with lanes:
            data = await asyncio.to_thread((base / entry["path"]).read_bytes)
            sha256 = hashlib.sha256(data).hexdigest()
            entry["sha256"] = sha256
            entry["size"] = len(data)
            put = sha256 not in confirmed and not await _stored(blobs, sha256, len(data))
            if put:
                await blobs.put(data, media_type="application/octet-stream")
            confirmed.add(sha256)
            if known is not None:
                known[entry["path"]] = (seen, sha256)
            return put

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(store(entry, seen)) for entry, seen in todo]
    except BaseExceptionGroup as failed:  # the first failure, as one store's would be
        raise failed.exceptions[0] from failed
    return sum(task.result() for task in tasks)


def _relative(root: Path, paths: Sequence[str | os.PathLike[str]]) -> frozenset[str]:
    """``paths`` as paths relative to ``root`` (those outside it are dropped)."""
    resolved = root.resolve()
    out: set[str] = set()
    for item in paths:
        path = Path(item)
        if not path.is_absolute():
            out.add(path.as_posix())
            continue
        with contextlib.suppress(ValueError):
            out.add(path.resolve().relative_to(resolved).as_posix())
    out.discard(".")
    return frozenset(out)


class WorkspaceSnapshotter:
    """Snapshots of one workspace into ``blobs``, each incremental against the last: a
    file whose size, time stamps, inode and device did not change is taken from the
    previous snapshot without reading it (see the module docstring for the racy rule).
    With ``cache_dir`` (a directory of the state directory), what it knows is kept there
    per workspace, so the next process (the next ``lodger run``) starts from it too.

    >>> snapshotter = WorkspaceSnapshotter(storage.artifacts)
    >>> result = await snapshotter.take(workspace, exclude=[state_dir])
    """

    def __init__(
        self,
        blobs: ArtifactStore,
        *,
        clock_ns: Callable[[], int] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.blobs = blobs
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._clock_ns = clock_ns or time.time_ns
        self._caches: dict[Path, StatCache] = {}
        #: blobs this snapshotter stored or saw stored
        self._confirmed: set[str] = set()

    async def take(
        self, root: str | os.PathLike[str], *, exclude: Sequence[str | os.PathLike[str]] = ()
    ) -> SnapshotResult:
        base = await asyncio.to_thread(Path(root).resolve)
        excluded = await asyncio.to_thread(_relative, base, exclude)
        cache = self._caches.get(base)
        if cache is None and self.cache_dir is not None:
            cache = await asyncio.to_thread(
                load_cache, cache_path(self.cache_dir, base), base, excluded
            )
        cache = cache or StatCache()
        started = self._clock_ns()
        writer = await asyncio.to_thread(self._writer, base, started)
        known = dict(cache.files)
        try:
            result = await _snapshot(
                base, self.blobs, excluded, known, _fresh(cache), self._confirmed, cache.ref
            )
        except BaseException:
            if writer is not None:
                await asyncio.to_thread(writer.discard)
            raise
        stamp_ns, stamp_dev = (writer.stamp_ns, writer.stamp_dev) if writer else (0, -1)
        if writer is not None and (result.read, result.ref, known) == (0, cache.ref, cache.files):
            await asyncio.to_thread(writer.discard)  # the cache on disk says all this already
            stamp_ns, stamp_dev, started = cache.stamp_ns, cache.stamp_dev, cache.wall_ns
        elif writer is not None:
            try:
                await asyncio.to_thread(writer.commit, base, excluded, result.ref, known)
            except OSError:  # a cache not kept costs the next process a full read
                await asyncio.to_thread(writer.discard)
        self._caches[base] = StatCache(
            files=known, ref=result.ref, stamp_ns=stamp_ns, stamp_dev=stamp_dev, wall_ns=started
        )
        return result

    def _writer(self, base: Path, started: int) -> CacheWriter | None:
        if self.cache_dir is None:
            return None
        try:
            return CacheWriter(cache_path(self.cache_dir, base), started)
        except OSError:
            return None


def _fresh(cache: StatCache) -> Callable[[Stat], bool]:
    """Whether a file with this stat, unchanged since ``cache`` hashed it, may be trusted:
    its time stamps are older than the cache's own (same device: the same clock, git's
    rule), or than ``_RACY_S`` before that snapshot began by this machine's clock."""
    wall = cache.wall_ns - int(_RACY_S * 1e9)

    def fresh(seen: Stat) -> bool:
        _, mtime, ctime, _, dev = seen
        if dev == cache.stamp_dev:
            return max(mtime, ctime) < cache.stamp_ns
        return mtime < wall

    return fresh


def latest_snapshot(events: Iterable[Event]) -> WorkspaceSnapshot | None:
    """The newest ``workspace_snapshot`` fact among ``events`` (None when there is none):
    what a worker restores to wake the session."""
    found: WorkspaceSnapshot | None = None
    for event in events:
        if isinstance(event.body, WorkspaceSnapshot):
            found = event.body
    return found


async def _stored(blobs: ArtifactStore, sha256: str, size: int) -> bool:
    """Whether ``blobs`` holds a readable copy of these bytes. A damaged copy counts as
    not stored: the put that follows keeps it aside and stores the bytes again, where a
    snapshot trusting it would be committed referring to bytes no restore can read (and a
    store that checked the hash here would fail every snapshot of the file). An object
    store answers from the object's name and size (one HEAD, no download): damage that
    keeps the size is found only when the blob is read."""
    exists = getattr(blobs, "exists", None)
    if exists is not None:
        return bool(await exists(sha256, size=size))
    try:
        await blobs.get(sha256)
    except StorageError as exc:
        if exc.code in ("artifact_missing", "artifact_corrupt"):
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

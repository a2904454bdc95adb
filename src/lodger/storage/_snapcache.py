"""The persistent stat cache of workspace snapshots (like git's index).

One JSON file per workspace in the state directory maps each file's path to the
``(size, mtime_ns, ctime_ns, inode, device)`` it had when it was hashed, and its sha256,
so the next process to snapshot the workspace need not read or hash it again. The file
also keeps the ref of the last snapshot and the cache's own time stamp: the modification
time the cache file got, from the file system's clock, when the scan it describes began.
A file whose time stamps are not older than that may have changed again within the same
clock tick after it was hashed (git's "racy clean"), so it is read again.

The cache is a hint, never a source of truth: it is written atomically (a temporary file
renamed over it), its first line names the sha256 of the body below, and anything that
does not parse, check or describe this workspace is ignored as if there were none. A blob
it names is still looked up in the artifact store before a snapshot refers to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__: list[str] = []

_VERSION = 1
_SHA256 = re.compile(r"[0-9a-f]{64}")

#: (size, mtime_ns, ctime_ns, inode, device)
Stat = tuple[int, int, int, int, int]


@dataclass
class StatCache:
    """What one workspace's cache file said (empty when there was none to trust)."""

    #: path -> (stat when hashed, sha256)
    files: dict[str, tuple[Stat, str]] = field(default_factory=dict)
    #: the ref of the snapshot the cache was written with
    ref: str | None = None
    #: the cache file's time stamp when that snapshot's scan began, and its device
    stamp_ns: int = 0
    stamp_dev: int = -1
    #: this machine's clock then (for files on another device than the cache)
    wall_ns: int = 0


def cache_path(cache_dir: Path, root: Path) -> Path:
    return cache_dir / f"{hashlib.sha256(str(root).encode()).hexdigest()[:32]}.json"


def _header(data: bytes) -> bytes:
    """The first line of a cache file: its version and the sha256 of the body below."""
    return f"lodger-snapcache {_VERSION} {hashlib.sha256(data).hexdigest()}".encode()


def _entry(value: Any) -> tuple[Stat, str]:
    if not (isinstance(value, list) and len(value) == 6):
        raise ValueError("entry")
    *numbers, sha256 = value
    if not all(type(n) is int for n in numbers) or not (
        isinstance(sha256, str) and _SHA256.fullmatch(sha256)
    ):
        raise ValueError("entry")
    size, mtime, ctime, ino, dev = numbers
    return (size, mtime, ctime, ino, dev), sha256


def load(path: Path, root: Path, exclude: frozenset[str]) -> StatCache:
    """The cache at ``path`` if it is intact and describes ``root`` with ``exclude``;
    an empty one otherwise (missing, torn, edited, another version or workspace)."""
    try:
        header, _, data = path.read_bytes().partition(b"\n")
        if header != _header(data):
            return StatCache()
        body = json.loads(data)
        if body["root"] != str(root) or body["exclude"] != sorted(exclude):
            return StatCache()
        ref = body["ref"]
        if ref is not None and not (isinstance(ref, str) and _SHA256.fullmatch(ref)):
            return StatCache()
        stamp = [body["stamp_ns"], body["stamp_dev"], body["wall_ns"]]
        if not all(type(n) is int for n in stamp):
            return StatCache()
        files = {str(p): _entry(v) for p, v in body["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return StatCache()
    return StatCache(files=files, ref=ref, stamp_ns=stamp[0], stamp_dev=stamp[1], wall_ns=stamp[2])


_ORPHAN_AGE_NS = 3600 * 10**9


def _sweep(directory: Path) -> None:
    """Remove the temporary cache files of processes killed mid-snapshot (an hour old:
    no live snapshot takes that long)."""
    now = time.time_ns()
    for tmp in directory.glob(".snapcache-*.tmp"):
        with contextlib.suppress(OSError):
            if now - tmp.stat().st_mtime_ns > _ORPHAN_AGE_NS:
                tmp.unlink()


class CacheWriter:
    """The next cache file of a workspace: created when its scan begins (its time stamp
    is the cache's own), written and renamed over the old one when the snapshot is
    stored, removed if it never is."""

    def __init__(self, path: Path, wall_ns: int) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        _sweep(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".snapcache-", suffix=".tmp")
        self._fd: int | None = fd
        self._tmp = Path(tmp)
        info = os.fstat(fd)
        self.stamp_ns = info.st_mtime_ns
        self.stamp_dev = info.st_dev
        self.wall_ns = wall_ns

    def commit(
        self, root: Path, exclude: frozenset[str], ref: str, files: dict[str, tuple[Stat, str]]
    ) -> None:
        body = {
            "root": str(root),
            "exclude": sorted(exclude),
            "ref": ref,
            "stamp_ns": self.stamp_ns,
            "stamp_dev": self.stamp_dev,
            "wall_ns": self.wall_ns,
            "files": {p: [*st, sha] for p, (st, sha) in sorted(files.items())},
        }
        data = json.dumps(body, separators=(",", ":")).encode()
        fd, self._fd = self._fd, None
        assert fd is not None
        with os.fdopen(fd, "wb") as handle:
            handle.write(_header(data) + b"\n" + data)
        os.replace(self._tmp, self.path)

    def discard(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        with contextlib.suppress(OSError):
            self._tmp.unlink()

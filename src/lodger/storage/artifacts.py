"""Content-addressed artifact storage for payloads too large for an event.

An artifact is stored under its sha256; storing the same bytes twice stores them once,
and forks share artifacts instead of copying them. The event keeps an ``ArtifactRef``
and a bounded preview.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import re
import stat
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from lodger.errors import StorageError
from lodger.events import ArtifactRef

__all__ = ["ArtifactStore", "FileArtifactStore", "MemoryArtifactStore", "check_sha256"]

_TMP_PREFIX = ".lodger-"
_TMP_SUFFIX = ".tmp"
_ORPHAN_AGE_S = 5.0


class ArtifactStore(Protocol):
    async def put(self, data: bytes, *, media_type: str = "text/plain") -> ArtifactRef: ...

    async def get(self, sha256: str) -> bytes: ...


def _ref(data: bytes, media_type: str) -> ArtifactRef:
    return ArtifactRef(
        sha256=hashlib.sha256(data).hexdigest(), size=len(data), media_type=media_type
    )


def _missing(sha256: str) -> StorageError:
    return StorageError(
        f"artifact {sha256} is not in the artifact store",
        hint="the artifact directory was pruned or belongs to another state directory",
        code="artifact_missing",
    )


_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_sha256(sha256: str) -> str:
    """``sha256`` if it can name an artifact (64 lowercase hex digits). Anything else names
    none: read as a path it could reach outside the store (``../../dev/zero``)."""
    if not _SHA256.fullmatch(sha256):
        raise StorageError(
            f"artifact {sha256[:80]!r} is not in the artifact store: not a sha256 digest",
            hint="an artifact is named by the 64 lowercase hex digits of its sha256",
            code="artifact_missing",
        )
    return sha256


def _check(sha256: str, data: bytes) -> None:
    if hashlib.sha256(data).hexdigest() != sha256:
        raise StorageError(
            f"artifact {sha256} does not match its hash",
            hint="the stored bytes were modified outside lodger",
            code="artifact_corrupt",
        )


def _holds(path: Path, sha256: str) -> bool:
    """Whether the file at ``path`` holds the bytes whose hash is ``sha256``."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except IsADirectoryError:
        return False
    return digest.hexdigest() == sha256


class MemoryArtifactStore:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    async def put(self, data: bytes, *, media_type: str = "text/plain") -> ArtifactRef:
        ref = _ref(data, media_type)
        held = self.blobs.get(ref.sha256)
        if held is None or hashlib.sha256(held).hexdigest() != ref.sha256:
            self.blobs[ref.sha256] = data  # never trust a damaged copy (see FileArtifactStore)
        return ref

    async def get(self, sha256: str) -> bytes:
        try:
            data = self.blobs[sha256]
        except KeyError:
            raise _missing(sha256) from None
        _check(sha256, data)
        return data


class FileArtifactStore:
    """Artifacts as files ``<root>/<first two hex>/<sha256>``, written atomically.

    A write goes to ``.lodger-*.tmp`` beside its final name, holding an ``flock`` on it
    until the rename. A process killed mid-write leaves that file behind, unlocked (the
    kernel drops the lock): the first ``put`` of the next store removes such orphans, and
    nothing ever reads them.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._swept = False

    def _path(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256

    def sweep_orphans(self) -> list[Path]:
        """Remove temporary files no live writer holds; return what was removed. Blocking."""
        removed: list[Path] = []
        for tmp in self.root.glob(f"??/{_TMP_PREFIX}*{_TMP_SUFFIX}"):
            try:
                fd = os.open(tmp, os.O_RDONLY)
            except FileNotFoundError:
                continue  # renamed into place meanwhile
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live writer is still writing it
                # a writer creates the file and locks it at once; a file that old and
                # unlocked is not in that gap
                if time.time() - os.fstat(fd).st_mtime >= _ORPHAN_AGE_S:
                    tmp.unlink(missing_ok=True)
                    removed.append(tmp)
            finally:
                os.close(fd)
        return removed

    async def put(self, data: bytes, *, media_type: str = "text/plain") -> ArtifactRef:
        ref = _ref(data, media_type)
        path = self._path(ref.sha256)

        def write() -> None:
            if not self._swept:
                self._swept = True
                with contextlib.suppress(OSError):  # best effort: orphans are never read
                    self.sweep_orphans()
            if path.exists() and _holds(path, ref.sha256):
                return
            if path.exists():
                # a file under this name whose bytes are not these: damaged outside
                # lodger. Storing the bytes again is the only way this result is kept; the
                # damaged file is kept beside it, as found, for whoever investigates.
                os.replace(path, path.with_name(f"{path.name}.damaged-{time.time_ns()}"))
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                    os.replace(tmp, path)  # still locked: never swept while in flight
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

        try:
            await asyncio.to_thread(write)
        except OSError as exc:
            raise StorageError(
                f"cannot store artifact {ref.sha256} in {path.parent}: {exc}",
                hint="check free disk space and permissions of the state directory",
                code="artifact_write",
            ) from exc
        return ref

    async def stored_digest(self, sha256: str) -> tuple[str, int] | None:
        """The sha256 of the bytes stored under ``sha256`` and how many there are, read in
        chunks (None: nothing is stored there): the deep check of snapshots
        (``lodger.storage.snapshotcheck``). A directory in its place hashes to ""."""
        path = self._path(check_sha256(sha256))

        def digest() -> tuple[str, int] | None:
            hashed = hashlib.sha256()
            read = 0
            try:
                with open(path, "rb") as handle:
                    while chunk := handle.read(1 << 20):
                        hashed.update(chunk)
                        read += len(chunk)
            except FileNotFoundError:
                return None
            except IsADirectoryError:
                return "", 0
            return hashed.hexdigest(), read

        try:
            return await asyncio.to_thread(digest)
        except OSError as exc:
            raise StorageError(
                f"cannot read artifact {sha256} at {path}: {exc.strerror or exc}",
                hint="the artifact store was changed outside lodger, or the disk is failing",
                code="storage",
            ) from exc

    async def get(self, sha256: str) -> bytes:
        path = self._path(check_sha256(sha256))
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            raise _missing(sha256) from None
        except OSError as exc:  # a directory in its place, unreadable: never a traceback
            raise StorageError(
                f"cannot read artifact {sha256} at {path}: {exc.strerror or exc}",
                hint="the artifact store was changed outside lodger, or the disk is failing",
                code="artifact_corrupt" if isinstance(exc, IsADirectoryError) else "storage",
            ) from exc
        _check(sha256, data)
        return data

    async def exists(self, sha256: str, *, size: int | None = None) -> bool:
        """Whether a file is stored under the hash (one ``stat``, nothing read); with
        ``size``, only one of that size counts (as ``ObjectArtifactStore.exists``): a
        truncated or extended copy is damaged, and the caller's put stores the bytes
        again. Damage that keeps the size is found when the blob is read, or by the deep
        check of snapshots (``lodger.storage.snapshotcheck``)."""
        return (await self.exists_many([(sha256, size)]))[0]

    async def exists_many(self, items: Sequence[tuple[str, int | None]]) -> list[bool]:
        """``exists`` for each ``(sha256, size)`` of ``items``, in one thread."""
        root = os.fspath(self.root)
        paths = [(os.path.join(root, sha[:2], check_sha256(sha)), size) for sha, size in items]

        def look() -> list[bool]:
            found: list[bool] = []
            for path, size in paths:
                try:
                    info = os.stat(path)
                except (FileNotFoundError, NotADirectoryError):
                    found.append(False)
                    continue
                found.append(stat.S_ISREG(info.st_mode) and size in (None, info.st_size))
            return found

        try:
            return await asyncio.to_thread(look)
        except OSError as exc:
            raise StorageError(
                f"cannot look artifacts up in {self.root}: {exc.strerror or exc}",
                hint="the artifact store was changed outside lodger, or the disk is failing",
                code="storage",
            ) from exc

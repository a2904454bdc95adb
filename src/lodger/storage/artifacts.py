"""Content-addressed artifact storage for payloads too large for an event.

An artifact is stored under its sha256; storing the same bytes twice stores them once,
and forks share artifacts instead of copying them. The event keeps an ``ArtifactRef``
and a bounded preview.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Protocol

from lodger.errors import StorageError
from lodger.events import ArtifactRef

__all__ = ["ArtifactStore", "FileArtifactStore", "MemoryArtifactStore"]


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


class MemoryArtifactStore:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    async def put(self, data: bytes, *, media_type: str = "text/plain") -> ArtifactRef:
        ref = _ref(data, media_type)
        self.blobs.setdefault(ref.sha256, data)
        return ref

    async def get(self, sha256: str) -> bytes:
        try:
            return self.blobs[sha256]
        except KeyError:
            raise _missing(sha256) from None


class FileArtifactStore:
    """Artifacts as files ``<root>/<first two hex>/<sha256>``, written atomically."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256

    async def put(self, data: bytes, *, media_type: str = "text/plain") -> ArtifactRef:
        ref = _ref(data, media_type)
        path = self._path(ref.sha256)

        def write() -> None:
            if path.exists():
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

        try:
            await asyncio.to_thread(write)
        except OSError as exc:
            raise StorageError(
                f"cannot store artifact {ref.sha256}: {exc}",
                hint="check free disk space and permissions of the state directory",
                code="artifact_write",
            ) from exc
        return ref

    async def get(self, sha256: str) -> bytes:
        path = self._path(sha256)
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            raise _missing(sha256) from None
        if hashlib.sha256(data).hexdigest() != sha256:
            raise StorageError(
                f"artifact {sha256} does not match its hash",
                hint="the file was modified outside lodger",
                code="artifact_corrupt",
            )
        return data

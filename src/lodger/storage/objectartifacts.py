"""Artifacts on object storage, content-addressed beside the sessions' logs.

``blobs/<first two hex>/<sha256>``, written with a create-only put: the same bytes are
stored once, whoever writes them first, and forks share them by reference. Workspace
snapshots keep their files here too (``lodger.storage.snapshots``).

A put that finds an object of that name already stored reads it back and checks its
hash before trusting it: one damaged outside lodger is kept aside, as found, under
``<sha256>.damaged-<ns>`` and the bytes are stored again, as the file store does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lodger._core.extras import require
from lodger.errors import StorageError
from lodger.events import ArtifactRef
from lodger.storage._objectio import first_line, get_retrying, read_failed, stored_size
from lodger.storage.artifacts import check_sha256

with require("s3", "the object store (s3://, file://, memory://)"):
    import obstore
    from obstore.exceptions import AlreadyExistsError, BaseError, NotFoundError
    from obstore.store import LocalStore

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = ["ObjectArtifactStore", "blob_key"]


def blob_key(sha256: str) -> str:
    check_sha256(sha256)  # anything else is no object name (obstore raised ValueError)
    return f"blobs/{sha256[:2]}/{sha256}"


class ObjectArtifactStore:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.puts = 0
        self.skipped = 0

    async def exists(self, sha256: str, *, size: int | None = None) -> bool:
        """Whether an object is stored under the hash (one HEAD, nothing downloaded);
        with ``size``, only one of that size counts: a truncated or extended copy is
        damaged, and the caller's put stores the bytes again."""
        try:
            meta = await obstore.head_async(self.store, blob_key(sha256))
        except (FileNotFoundError, NotFoundError):
            return False
        except (BaseError, OSError) as exc:
            raise _failed("check", sha256, exc) from exc
        return size is None or int(meta["size"]) == size

    async def stored_digest(self, sha256: str) -> tuple[str, int] | None:
        """The sha256 of the object stored under ``sha256`` and its size, streamed (None:
        no such object): the deep check of snapshots (``lodger.storage.snapshotcheck``)
        reads every blob back this way, never holding one whole in memory."""
        hashed = hashlib.sha256()
        read = 0
        try:
            result = await obstore.get_async(self.store, blob_key(sha256))
            async for chunk in result.stream(min_chunk_size=1 << 20):
                hashed.update(chunk)
                read += len(chunk)
        except (FileNotFoundError, NotFoundError):
            if await self._is_folder(blob_key(sha256)):
                return "", 0
            return None
        except (BaseError, OSError) as exc:
            raise _failed("read", sha256, exc) from exc
        return hashed.hexdigest(), read

    async def put(self, data: bytes, *, media_type: str = "text/plain") -> ArtifactRef:
        sha256 = hashlib.sha256(data).hexdigest()
        key = blob_key(sha256)
        self.puts += 1
        try:
            try:
                await obstore.put_async(self.store, key, data, mode="create")
            except AlreadyExistsError:
                if await self._holds(key, sha256, len(data)):
                    self.skipped += 1  # the same bytes are already stored
                else:
                    await self._store_again(key, data)
        except (BaseError, OSError) as exc:
            raise _failed("store", sha256, exc) from exc
        return ArtifactRef(sha256=sha256, size=len(data), media_type=media_type)

    async def _holds(self, key: str, sha256: str, size: int) -> bool:
        """Whether the object under ``key`` holds the ``size`` bytes hashing to ``sha256``.
        One of another size is judged from the response's metadata, its body never read:
        an object planted under the name is not downloaded whatever its size."""
        try:
            result = await obstore.get_async(self.store, key)
            if int(result.meta["size"]) != size:
                return False
            found = bytes(await result.bytes_async())
        except (FileNotFoundError, NotFoundError):  # deleted since the put was refused
            return False
        return hashlib.sha256(found).hexdigest() == sha256

    async def _store_again(self, key: str, data: bytes) -> None:
        """Replace an object under ``key`` whose bytes are not ``data``: damaged outside
        lodger. Storing the bytes again is the only way the caller's result stays
        readable. The damaged object is first copied aside (in the store, as found) for
        whoever investigates. Overwriting is safe although puts are otherwise create-only:
        the name is the hash of ``data``, so every writer of this name writes these same
        bytes, and a put replaces the whole object at once (a reader sees the damaged
        object or these bytes, never a mix)."""
        aside = f"{key}.damaged-{time.time_ns()}"
        with contextlib.suppress(FileNotFoundError, NotFoundError):  # gone: nothing to keep
            await obstore.copy_async(self.store, key, aside)
        await obstore.put_async(self.store, key, data, mode="overwrite")

    async def _is_folder(self, key: str) -> bool:
        """Whether a directory store holds a folder where the object ``key`` belongs
        (obstore reports it as no object at all): damage, as the file store says."""
        root = self.store.prefix if isinstance(self.store, LocalStore) else None
        return root is not None and await asyncio.to_thread(Path(root, key).is_dir)

    async def get(self, sha256: str) -> bytes:
        key = blob_key(sha256)
        data = await get_retrying(self.store, key)  # a failing read is tried again
        if data is None:
            if await self._is_folder(key):
                raise StorageError(
                    f"artifact {sha256} is a directory in the object store",
                    hint="the stored bytes were replaced outside lodger",
                    code="artifact_corrupt",
                ) from None
            raise StorageError(
                f"artifact {sha256} is not in the object store",
                hint="the blob was deleted or belongs to another store",
                code="artifact_missing",
            ) from None
        if hashlib.sha256(data).hexdigest() != sha256:
            # read again before calling it damage: a body cut on the way reads otherwise
            again = await get_retrying(self.store, key)
            if again is not None and hashlib.sha256(again).hexdigest() == sha256:
                return again
            size = await stored_size(self.store, key)
            if again == data and size is not None and size != len(data):
                raise read_failed(key, f"{len(data)} of its {size} bytes arrived", 2)
            raise StorageError(
                f"artifact {sha256} does not match its hash",
                hint="the stored bytes were modified outside lodger",
                code="artifact_corrupt",
            )
        return data


def _failed(action: str, sha256: str, exc: Any) -> StorageError:
    return StorageError(
        f"cannot {action} artifact {sha256} in the object store: {first_line(exc)}",
        hint="check that the object store is reachable and the credentials allow it",
        code="artifact_write" if action == "store" else "object_store",
    )

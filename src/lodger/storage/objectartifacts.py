"""Artifacts on object storage, content-addressed beside the sessions' logs.

``blobs/<first two hex>/<sha256>``, written with a create-only put: the same bytes are
stored once, whoever writes them first, and forks share them by reference. Workspace
snapshots keep their files here too (``lodger.storage.snapshots``).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, NotFoundError

from lodger.errors import StorageError
from lodger.events import ArtifactRef

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = ["ObjectArtifactStore", "blob_key"]


def blob_key(sha256: str) -> str:
    return f"blobs/{sha256[:2]}/{sha256}"


class ObjectArtifactStore:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.puts = 0
        self.skipped = 0

    async def exists(self, sha256: str) -> bool:
        try:
            await obstore.head_async(self.store, blob_key(sha256))
        except (FileNotFoundError, NotFoundError):
            return False
        except (BaseError, OSError) as exc:
            raise _failed("check", sha256, exc) from exc
        return True

    async def put(self, data: bytes, *, media_type: str = "text/plain") -> ArtifactRef:
        sha256 = hashlib.sha256(data).hexdigest()
        self.puts += 1
        try:
            await obstore.put_async(self.store, blob_key(sha256), data, mode="create")
        except AlreadyExistsError:
            self.skipped += 1  # the same bytes are already stored
        except (BaseError, OSError) as exc:
            raise _failed("store", sha256, exc) from exc
        return ArtifactRef(sha256=sha256, size=len(data), media_type=media_type)

    async def get(self, sha256: str) -> bytes:
        try:
            result = await obstore.get_async(self.store, blob_key(sha256))
            data = bytes(await result.bytes_async())
        except (FileNotFoundError, NotFoundError):
            raise StorageError(
                f"artifact {sha256} is not in the object store",
                hint="the blob was deleted or belongs to another store",
                code="artifact_missing",
            ) from None
        except (BaseError, OSError) as exc:
            raise _failed("read", sha256, exc) from exc
        if hashlib.sha256(data).hexdigest() != sha256:
            raise StorageError(
                f"artifact {sha256} does not match its hash",
                hint="the stored bytes were modified outside lodger",
                code="artifact_corrupt",
            )
        return data


def _failed(action: str, sha256: str, exc: Any) -> StorageError:
    first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return StorageError(
        f"cannot {action} artifact {sha256} in the object store: {first_line}",
        hint="check that the object store is reachable and the credentials allow it",
        code="artifact_write" if action == "store" else "object_store",
    )

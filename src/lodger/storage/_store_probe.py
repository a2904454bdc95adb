"""Proof that an object store refuses a second create-only put, before lodger writes to it.

Fencing writers (segments, heads, leases) rests on ``If-None-Match: *`` on PUT. A server
that ignores it tells two writers that both their appends committed, and one is lost.
So on the first write to a store (per bucket and prefix) a probe object is put twice
with create-only semantics; the second put must be refused. A store that takes it is
refused with one line naming it, before any session is written. A store that passes
gets a marker object (``lodger-meta/create-only-ok``): later opens read its metadata
only (one HEAD), and this process remembers the answer per store.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from typing import TYPE_CHECKING

from lodger._core.extras import require
from lodger.errors import StorageError
from lodger.storage._objectio import first_line

with require("s3", "the object store (s3://, file://, memory://)"):
    import obstore
    from obstore.exceptions import AlreadyExistsError, BaseError, NotFoundError

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = ["MARKER_KEY", "ensure_create_only", "forget_probes"]

MARKER_KEY = "lodger-meta/create-only-ok"
_PROBE_PREFIX = "lodger-meta/probe-"
_PROVEN: set[str] = set()  # stores this process has seen pass (by their full URL)


def forget_probes() -> None:
    """Forget what this process knows (tests; a store reconfigured under the same URL)."""
    _PROVEN.clear()


def _failed(action: str, key: str, name: str, exc: BaseException) -> StorageError:
    return StorageError(
        f"object store {name} could not be checked for create-only writes ({action} of "
        f"{key} failed: {first_line(exc)})",
        hint="check that the object store is reachable and the credentials allow it",
        code="object_store",
    )


async def ensure_create_only(store: ObjectStore, *, scope: str, name: str) -> int:
    """Raise ``StorageError`` (code ``store_cannot_fence``) unless ``store`` refuses a
    second create-only put; ``scope`` keys the in-process memory, ``name`` is the store
    as messages show it. Returns the requests made (0 when remembered)."""
    if scope in _PROVEN:
        return 0
    try:
        await obstore.head_async(store, MARKER_KEY)
    except (FileNotFoundError, NotFoundError):
        pass
    except (BaseError, OSError) as exc:
        raise _failed("HEAD", MARKER_KEY, name, exc) from exc
    else:
        _PROVEN.add(scope)
        return 1
    probe = f"{_PROBE_PREFIX}{secrets.token_hex(8)}"
    requests = 1 + await _probe(store, probe, name)
    body = json.dumps({"checked_us": time.time_ns() // 1000, "probe": "If-None-Match"})
    try:
        await obstore.put_async(store, MARKER_KEY, body.encode(), mode="create")
    except AlreadyExistsError:
        pass  # another process proved it at the same time
    except (BaseError, OSError) as exc:
        raise _failed("PUT", MARKER_KEY, name, exc) from exc
    _PROVEN.add(scope)
    return requests + 1


async def _probe(store: ObjectStore, key: str, name: str) -> int:
    try:
        await obstore.put_async(store, key, b"first", mode="create")
        try:
            await obstore.put_async(store, key, b"second", mode="create")
        except AlreadyExistsError:
            return 3
    except (BaseError, OSError) as exc:
        raise _failed("PUT", key, name, exc) from exc
    finally:
        # a leftover probe object is harmless
        with contextlib.suppress(FileNotFoundError, NotFoundError, BaseError, OSError):
            await obstore.delete_async(store, key)
    raise StorageError(
        f"object store {name} cannot fence writers: it accepted a second create-only PUT "
        "of the same key (it lacks If-None-Match on PUT); lodger writes no session there",
        hint="use a store that honours If-None-Match: * on PUT (AWS S3, MinIO, R2, GCS, "
        "moto); reading sessions already there still works",
        code="store_cannot_fence",
    )

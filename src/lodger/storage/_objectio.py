"""Reads and write confirmations of the object-store log that survive a faulty store.

Two faults a store or the network in front of it can show without meaning that the log
is damaged or that another writer won:

- **A write acknowledged and not kept.** ``confirm_stored`` asks the store (one HEAD)
  whether the object a put was just told succeeded is there, with the size written. The
  log calls it before anything names the object (a head, a manifest, the next append's
  expected offset), so a store that drops an acknowledged write fails the append,
  naming the key, instead of leaving a gap every later read trips over.
- **A read that fails on the way** (a connection reset, a body cut short, a
  ``Content-Length`` missing): ``get_retrying`` tries again, a bounded number of times
  with backoff, and when every try failed raises ``StorageError`` with code
  ``object_store_read``: a read failure that may pass, never a verdict on the log.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from lodger._core.extras import require
from lodger.errors import StorageError

with require("s3", "the object store (s3://, file://, memory://)"):
    import obstore
    from obstore.exceptions import (
        BaseError,
        InvalidPathError,
        NotFoundError,
        PermissionDeniedError,
        UnauthenticatedError,
    )

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = [
    "READ_TRIES",
    "confirm_stored",
    "first_line",
    "get_retrying",
    "object_store_error",
    "read_failed",
    "stored_size",
]

#: attempts of one GET before it is reported as a read failure
READ_TRIES = 3
_BACKOFF_S = (0.05, 0.25)
_LASTING = (PermissionDeniedError, UnauthenticatedError, InvalidPathError, PermissionError)


def first_line(exc: BaseException) -> str:
    """obstore's messages can quote request URLs, never credentials; keep the first line."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def object_store_error(action: str, key: str, exc: BaseException) -> StorageError:
    """``action`` of ``key`` failed in the object store (not damage, not another writer)."""
    return StorageError(
        f"object store {action} of {key} failed: {first_line(exc)}",
        hint="check that the object store is reachable and the credentials allow it",
        code="object_store",
    )


def read_failed(key: str, why: str, tries: int) -> StorageError:
    return StorageError(
        f"object store read of {key} failed ({tries} {'try' if tries == 1 else 'tries'}): {why}",
        hint="a read failure, not damage to the log: nothing was changed; check that the "
        "object store is reachable and the credentials allow it, then try again",
        code="object_store_read",
    )


async def get_retrying(store: ObjectStore, key: str) -> bytes | None:
    """The object's bytes, None when it does not exist; a failing read is retried
    ``READ_TRIES`` times in all, then reported by ``read_failed``."""
    for attempt in range(READ_TRIES):
        try:
            result = await obstore.get_async(store, key)
            return bytes(await result.bytes_async())
        except (FileNotFoundError, NotFoundError):
            return None
        except _LASTING as exc:  # another try would be refused the same way
            raise read_failed(key, first_line(exc), attempt + 1) from exc
        except (BaseError, OSError) as exc:
            if attempt == READ_TRIES - 1:
                raise read_failed(key, first_line(exc), READ_TRIES) from exc
        await asyncio.sleep(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)])
    raise AssertionError("unreachable")  # pragma: no cover


def _not_kept(key: str, why: str) -> StorageError:
    return StorageError(
        f"the object store acknowledged the write of {key} but {why}",
        hint="the store lost a write it reported as done (a faulty store or a proxy in "
        "front of it); nothing names the object, so the log is unchanged; check the store "
        "before continuing",
        code="object_store_lost_write",
    )


async def confirm_stored(store: ObjectStore, key: str, size: int) -> None:
    """Raise ``StorageError`` unless ``key`` holds an object of ``size`` bytes (one HEAD)."""
    try:
        meta = await obstore.head_async(store, key)
    except (FileNotFoundError, NotFoundError):
        raise _not_kept(key, "does not hold it") from None
    except (BaseError, OSError) as exc:
        raise StorageError(
            f"object store check of {key} after its write failed: {first_line(exc)}",
            hint="check that the object store is reachable and the credentials allow it",
            code="object_store",
        ) from exc
    if int(meta["size"]) != size:
        raise _not_kept(key, f"holds {meta['size']} bytes of the {size} written")


async def stored_size(store: ObjectStore, key: str) -> int | None:
    """The size the store reports for ``key`` (one HEAD), None when it has no such
    object or cannot say."""
    try:
        meta = await obstore.head_async(store, key)
    except (BaseError, OSError):
        return None
    return int(meta["size"])

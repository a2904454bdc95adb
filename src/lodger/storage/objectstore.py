"""``ObjectLogStore``: the event log on object storage (a local directory, memory or an
S3-compatible service), through ``obstore``. DESIGN section 9.

Each append is one immutable segment object keyed by the session and the offset of its
first record, written with a create-only put (``If-None-Match: *``). Two writers that
both believe the log ends at offset ``n`` both try to create ``seg/n``: exactly one put
succeeds, and the other writer is fenced (``WriterFencedError``) with nothing written.
Segments are never overwritten except by a tombstone once compaction has sealed their
records elsewhere; the tombstone keeps the key occupied, so fencing holds forever.

An append costs that one put and one HEAD: before anything names the new segment (a
head, a manifest, the next append's offset) the store is asked whether it kept it, whole,
so a store that acknowledges a write it dropped fails that append instead of leaving a
gap every later read trips over (``_objectio``). On a local directory the puts of
concurrent sessions are written and synced in groups, one ``syncfs`` per group, and the
HEAD is a ``stat`` after the sync (``_object_sync``). Reads that fail on the way (a reset
connection, a body cut short) are tried again, and a segment or manifest that does not
decode is read once more before it is called damage.

The head ``(high_water, digest)`` is kept apart from the events (DESIGN L8) as a
create-only object whose name is the head itself, written at *checkpoints*, not after
every append: when a session's first segment is written, when the writer's lease is
released (the end of every turn the ``Agent`` runs) and on
``checkpoint()``. Readers find the events after the newest head by listing the
create-only segments. Deleting or rolling back segments the head covers fails closed
(``truncated``), a missing segment in the middle is a gap, and a stale writer is fenced by
the segment keys alone. What a head cannot cover is the tail written since the last
checkpoint: a process killed mid-turn whose newest segments are then deleted by someone
else leaves a shorter log that still verifies. ``head_per_append=True`` closes that
window at the cost of a second put per append (the previous behaviour).

``compact`` merges the appended segments into one sealed object (bytes and digests
unchanged) and writes a new manifest version; ``collect_garbage`` tombstones the merged
segments and removes superseded heads and manifests once they are older than a grace
period, so a reader that listed before the compaction keeps working meanwhile.
Releasing a writer compacts on its own once the session has ``compact_after`` appended
segments (64 by default; None turns it off), and first collects what earlier compactions
left once their grace period (``grace_s``, an hour by default) has passed.

With ``cache_dir``, immutable objects read once are kept on local disk, so a worker that
wakes a dormant session fetches only the manifest, a listing and the new tail.

Fold checkpoints (``lodger.engine.checkpoint``: a cache of a long session's decoded fold,
never an authority) are objects too, ``sessions/<id>/checkpoint/<name>`` (``checkpoints``,
an ``ObjectCheckpoints``), so a worker that wakes a long session anywhere decodes only
the events after the newest one.

One ``SessionWriter`` per session: inside a process a module dict refuses a second one;
across processes and machines a lease object in the store does (``_object_lease``), and
the create-only puts fence a writer that lost it. Before the first writer of a store is
let in, the store is proven to refuse a second create-only put (``_store_probe``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lodger._core.extras import require
from lodger.errors import (
    AppendConflictError,
    CommitFailedError,
    CorruptLogError,
    SessionLockedError,
    StorageError,
    UsageError,
    WriterFencedError,
)
from lodger.storage._heads import head_missing
from lodger.storage._object_lease import LEASE_TTL_S, StoreLease
from lodger.storage._object_sync import GroupSync
from lodger.storage._objectio import (
    READ_TRIES,
    confirm_stored,
    get_retrying,
    object_store_error,
    read_failed,
    stored_size,
)
from lodger.storage._segments import (
    Manifest,
    SealedRef,
    decode_manifest,
    decode_segment,
    encode_manifest,
    encode_segment,
    encode_tombstone,
    head_key,
    is_tombstone,
    manifest_key,
    parse_head_key,
    parse_seg_key,
    sealed_key,
    seg_key,
    session_root,
)
from lodger.storage._store_probe import ensure_create_only
from lodger.storage.logstore import Record, check_session_id

with require("s3", "the object store (s3://, file://, memory://)"):
    import obstore
    from obstore.exceptions import AlreadyExistsError, BaseError, NotFoundError

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = [
    "COMPACT_AFTER",
    "GRACE_S",
    "ObjectLogStore",
    "ObjectStats",
    "StoreLocation",
    "open_object_store",
]

_WRITERS: dict[tuple[str, str], int] = {}  # (store identity, session) -> lease number
_LEASES = [0]
_RELIST_ATTEMPTS = 4
_HEAD_TRIES = 3  # reads of the newest head while compactions seal heads away
#: appended segments that make a writer's release compact them (None: never on its own)
COMPACT_AFTER = 64
#: how long merged segments, heads and manifests stay readable after a compaction
GRACE_S = 3600.0


@dataclass
class ObjectStats:
    """Requests this store made (for benchmarks and tests of the wake cost)."""

    puts: int = 0
    gets: int = 0
    lists: int = 0
    heads: int = 0  # HEADs confirming a put was kept
    deletes: int = 0
    cache_hits: int = 0
    bytes_put: int = 0
    bytes_got: int = 0
    compactions: int = 0
    compaction_failures: int = 0


@dataclass(frozen=True)
class _Layout:
    """What a session holds, from one manifest read and two listings."""

    manifest: Manifest | None
    tail: tuple[int, ...]  # first offsets of appended segments at or after sealed_end
    heads: tuple[str, ...] = field(default=())

    @property
    def sealed(self) -> tuple[SealedRef, ...]:
        return self.manifest.sealed if self.manifest else ()

    @property
    def sealed_end(self) -> int:
        return self.manifest.sealed_end if self.manifest else 0


class _Relist(Exception):
    """A segment turned into a tombstone while we read: compaction ran; list again."""


class _ObjectLease:
    def __init__(
        self, store: ObjectLogStore, key: tuple[str, str], number: int, shared: StoreLease
    ) -> None:
        self._store = store
        self._key = key
        self.number = number
        self.session_id = key[1]
        self.shared = shared  # the lease object in the store, across processes

    async def release(self) -> None:
        """Record the head of this writer's appends, compact if due, release the lease."""
        if _WRITERS.get(self._key) != self.number:
            return
        try:
            if self.shared.lost is None:  # a writer that lost its lease writes nothing
                await self._store.checkpoint(self.session_id)
                await self._store._maybe_compact(self.session_id)
        finally:
            if _WRITERS.get(self._key) == self.number:
                del _WRITERS[self._key]
            if self._store._shared.get(self.session_id) is self.shared:
                del self._store._shared[self.session_id]
            await self.shared.release()


def _fenced(session_id: str, offset: int) -> WriterFencedError:
    return WriterFencedError(
        f"writer of session {session_id!r} was fenced at offset {offset}: another writer "
        "committed that offset first",
        hint="this writer's view of the log is stale and nothing of this append was "
        "written; reopen the session to continue from the other writer's events",
        session_id=session_id,
        offset=offset,
    )


class ObjectLogStore:
    """A ``LogStore`` on any ``obstore`` store; see the module docstring.

    ``identity`` names the storage for the in-process writer lease (two stores opened on
    the same URL share it); ``local_root`` is the directory of a ``LocalStore``, whose
    puts are durable before they return (L4), those of concurrent sessions written and
    synced in groups (``local_sync``, see ``_object_sync``); ``clock_us`` dates manifests
    for the garbage collector's grace period. ``lease_ttl_s`` is how long a writer's
    lease object outlives its last renewal (``writer_lease=False`` takes none: only for
    tests of the fence beneath it); ``check_create_only`` (default: unless the
    store is in memory) proves the store fences before its first writer.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        identity: str | None = None,
        local_root: Path | None = None,
        cache_dir: Path | None = None,
        clock_us: Callable[[], int] | None = None,
        head_per_append: bool = False,
        compact_after: int | None = COMPACT_AFTER,
        grace_s: float = GRACE_S,
        lease_ttl_s: float = LEASE_TTL_S,
        check_create_only: bool | None = None,
        probe_scope: str | None = None,
        writer_lease: bool = True,
    ) -> None:
        if compact_after is not None and compact_after < 2:
            raise UsageError(
                f"compact_after must be at least 2 segments, not {compact_after}",
                code="usage",
            )
        self.store = store
        self.head_per_append = head_per_append
        self.compact_after = compact_after
        self.grace_s = grace_s
        self.identity = identity or f"object-store-{id(store)}"
        self.local_root = local_root
        #: makes puts into ``local_root`` durable, one sync per group of concurrent puts
        self.local_sync = GroupSync(local_root) if local_root is not None else None
        self.cache_dir = cache_dir
        self.stats = ObjectStats()
        self._clock_us = clock_us or (lambda: time.time_ns() // 1000)
        self._tails: dict[str, int] = {}  # high-water after this store's own last append
        # the head of this store's newest append not yet recorded in a head object
        self._unheaded: dict[str, tuple[int, str]] = {}
        # appended (not yet compacted) segments of a session, as last listed or appended
        self._tail_segments: dict[str, int] = {}
        self._leases: list[_ObjectLease] = []
        self.lease_ttl_s = lease_ttl_s
        self.writer_lease = writer_lease
        self._shared: dict[str, StoreLease] = {}  # session -> this store's lease object
        if check_create_only is None:
            from obstore.store import MemoryStore

            check_create_only = not isinstance(store, MemoryStore)
        self.check_create_only = check_create_only
        self._probe_scope = probe_scope or self.identity
        #: requests made by lease objects and the create-only probe (not in ``stats``)
        self.lease_requests = 0
        self.probe_requests = 0
        self.fail_put: Callable[[str], bool] | None = None  # fault injection for tests
        #: why the latest compaction on release failed (it is retried on the next one)
        self.last_compaction_error: StorageError | None = None
        #: fold checkpoints beside the log (``lodger.engine.checkpoint``)
        self.checkpoints = ObjectCheckpoints(self)

    # ---------------------------------------------------------------- raw objects

    async def _get(self, key: str, *, immutable: bool = False, fresh: bool = False) -> bytes | None:
        """The object's bytes (None when absent); an immutable one from ``cache_dir`` when
        it is there, unless ``fresh`` (then the store's copy replaces the cached one)."""
        cached = self._cache_path(key) if immutable else None
        if cached is not None and not fresh:
            hit = await asyncio.to_thread(_read_cache, cached)
            if hit is not None:
                self.stats.cache_hits += 1
                return hit
        self.stats.gets += 1
        data = await get_retrying(self.store, key)  # a failing read is tried again
        if data is None:
            return None
        self.stats.bytes_got += len(data)
        if cached is not None:
            with contextlib.suppress(OSError):  # a cache that cannot be written is a miss
                await asyncio.to_thread(_write_cache, cached, data)
        return data

    def _cache_path(self, key: str) -> Path | None:
        if self.cache_dir is None:
            return None
        if any(part in ("", ".", "..") for part in key.split("/")):
            return None  # never a path outside cache_dir, whatever a key holds
        return self.cache_dir / key

    async def _put(self, key: str, data: bytes, *, create: bool) -> bool:
        """Put ``data`` at ``key``; with ``create``, False when the key already holds
        other bytes.

        A create-only put whose response was lost (a dropped connection, a 500 after the
        write) is retried by the client and then refused, the object being there: that
        is this writer's own commit, not another writer's. So "already exists" is read
        back, and the same bytes count as written."""
        if self.fail_put is not None and self.fail_put(key):
            raise StorageError(f"injected put failure of {key}", code="object_store")
        self.stats.puts += 1
        self.stats.bytes_put += len(data)
        if create and self.local_sync is not None and self.local_sync.grouped:
            try:  # written and synced with the other sessions' puts of its group
                return await self.local_sync.put_create(self.local_sync.root / key, data)
            except OSError as exc:
                raise object_store_error("write", key, exc) from exc
        try:
            await obstore.put_async(self.store, key, data, mode="create" if create else "overwrite")
        except AlreadyExistsError:
            return await self._get(key) == data
        except (BaseError, OSError) as exc:
            raise object_store_error("write", key, exc) from exc
        if self.local_sync is not None:
            try:
                await self.local_sync.sync(self.local_sync.root / key)
            except OSError as exc:  # the group's sync failed: this put may not be durable
                raise object_store_error("sync", key, exc) from exc
        return True

    async def _delete(self, key: str) -> None:
        self.stats.deletes += 1
        try:
            await obstore.delete_async(self.store, key)
        except (FileNotFoundError, NotFoundError):
            pass
        except (BaseError, OSError) as exc:
            raise object_store_error("delete", key, exc) from exc

    async def _list(self, prefix: str) -> list[str]:
        """Object paths under ``prefix``, sorted."""
        self.stats.lists += 1
        keys: list[str] = []
        try:
            async for chunk in obstore.list(self.store, prefix):
                keys.extend(str(meta["path"]) for meta in chunk)
        except (FileNotFoundError, NotFoundError):
            return []
        except (BaseError, OSError) as exc:
            raise object_store_error("list", prefix, exc) from exc
        return sorted(keys)

    # ---------------------------------------------------------------- layout

    async def _manifests(self, session_id: str) -> list[str]:
        return await self._list(f"{session_root(session_id)}manifest/")

    async def manifest(self, session_id: str) -> Manifest | None:
        """The session's newest manifest, None when it has none."""
        keys = await self._manifests(session_id)
        if not keys:
            return None
        blob = await self._get(keys[-1], immutable=True)
        for _ in range(READ_TRIES):
            if blob is None:  # garbage-collected between the listing and the read
                return await self.manifest(session_id)
            try:
                return decode_manifest(session_id, keys[-1], blob)
            except CorruptLogError as damage:
                blob = await self._read_again(keys[-1], blob, damage)
        raise read_failed(keys[-1], "its bytes differed at every read", READ_TRIES)

    async def _layout(self, session_id: str, *, with_heads: bool = False) -> _Layout:
        root = session_root(session_id)
        manifest = await self.manifest(session_id)
        sealed_end = manifest.sealed_end if manifest else 0
        tail: list[int] = []
        for key in await self._list(f"{root}seg/"):
            first = parse_seg_key(session_id, key)
            if first >= sealed_end:
                tail.append(first)
        heads = tuple(await self._list(f"{root}head/")) if with_heads else ()
        self._tail_segments[session_id] = len(tail)
        return _Layout(manifest=manifest, tail=tuple(tail), heads=heads)

    async def _segment(self, session_id: str, key: str, first: int) -> list[Record]:
        blob = await self._get(key, immutable=True)
        for _ in range(READ_TRIES):
            if blob is None:
                return []  # deleted behind our back: the log reader reports the gap
            if is_tombstone(blob):
                raise _Relist
            try:
                return decode_segment(session_id, first, key, blob)
            except CorruptLogError as damage:
                blob = await self._read_again(key, blob, damage)
        raise read_failed(key, "its bytes differed at every read", READ_TRIES)

    async def _read_again(self, key: str, blob: bytes, damage: CorruptLogError) -> bytes | None:
        """An object that did not decode, read again from the store: the same bytes are
        stored damage (``damage`` is raised); other bytes (or None: it is gone) mean the
        first read was cut on the way, and are returned to be decoded instead."""
        again = await self._get(key, immutable=True, fresh=True)
        if again == blob:
            size = await stored_size(self.store, key)
            if size is not None and size != len(blob):  # cut the same way twice
                raise read_failed(key, f"{len(blob)} of its {size} bytes arrived", 2)
            raise damage
        return again

    async def _records(
        self, session_id: str, start: int, end: int | None, *, last_only: bool = False
    ) -> list[Record]:
        for _ in range(_RELIST_ATTEMPTS):
            layout = await self._layout(session_id)
            wanted: list[tuple[str, int]] = []
            pieces = [(s.key, s.first, s.end) for s in layout.sealed]
            tail = layout.tail
            for index, first in enumerate(tail):
                upto = tail[index + 1] if index + 1 < len(tail) else None
                pieces.append((seg_key(session_id, first), first, upto or -1))
            if last_only:
                pieces = pieces[-1:]
            for key, first, upto in pieces:
                if (upto == -1 or upto > start) and (end is None or first < end):
                    wanted.append((key, first))
            try:
                chunks = await asyncio.gather(
                    *(self._segment(session_id, key, first) for key, first in wanted)
                )
            except _Relist:
                continue
            records = [r for chunk in chunks for r in chunk]
            return [r for r in records if r.offset >= start and (end is None or r.offset < end)]
        raise StorageError(
            f"session {session_id!r} was compacted {_RELIST_ATTEMPTS} times while being read",
            hint="retry the read",
            code="object_store",
            session_id=session_id,
        )

    # ---------------------------------------------------------------- LogStore

    async def append_records(
        self, *, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        if not records:
            return
        shared = self._shared.get(session_id)
        if shared is not None:  # a writer whose lease was taken over writes nothing
            await shared.check()
        if self._tails.get(session_id) != expected_offset:
            last = await self.last_record(session_id=session_id)
            high_water = last.offset + 1 if last else 0
            if high_water > expected_offset:
                raise _fenced(session_id, expected_offset)
            if high_water != expected_offset:
                raise AppendConflictError(
                    f"append to session {session_id!r} expected offset {expected_offset} "
                    f"but the stored high-water mark is {high_water}",
                    hint="another writer appended first; re-read the log",
                    session_id=session_id,
                    offset=expected_offset,
                )
        key = seg_key(session_id, expected_offset)
        blob = encode_segment(session_id, records)
        try:
            created = await self._put(key, blob, create=True)
            if created:
                # before a head or the next append names it: a store that acknowledged
                # a write it did not keep fails this append, not every later read
                await self._confirm(key, len(blob))
        except StorageError as exc:
            self._tails.pop(session_id, None)
            raise CommitFailedError(
                f"append to session {session_id!r} at offset {expected_offset} failed: "
                f"{exc.message}",
                hint=exc.hint,
                session_id=session_id,
                offset=expected_offset,
            ) from exc
        if not created:
            self._tails.pop(session_id, None)
            raise _fenced(session_id, expected_offset)
        high_water = records[-1].offset + 1
        self._tails[session_id] = high_water
        self._tail_segments[session_id] = self._tail_segments.get(session_id, 0) + 1
        self._unheaded[session_id] = (high_water, records[-1].digest)
        if expected_offset == 0 or self.head_per_append:
            # a session's first segment gets its head at once: a log with segments and
            # no head at all is one whose head was deleted, and fails closed
            await self.checkpoint(session_id)

    async def _confirm(self, key: str, size: int) -> None:
        """The object a put just wrote is there, whole (one HEAD; see ``_objectio``).
        A local store's grouped put checked that already, after its sync."""
        if self.local_sync is not None and self.local_sync.grouped:
            return
        self.stats.heads += 1
        await confirm_stored(self.store, key, size)

    async def checkpoint(self, session_id: str) -> tuple[int, str] | None:
        """Record the head of this store's newest append of the session as a head object
        (one create-only put; nothing when it is recorded already); return it.

        Called when a writer is released; call it directly to narrow the window of
        unrecorded appends for a writer kept open for long.
        """
        head = self._unheaded.get(session_id)
        if head is None:
            return None
        high_water, digest = head
        key = head_key(session_id, high_water, digest)
        try:
            if await self._put(key, b"", create=True):
                await self._confirm(key, 0)  # a head the store dropped is no head
        except StorageError as exc:
            raise CommitFailedError(
                f"session {session_id!r} committed offsets up to {high_water - 1} but could "
                f"not record its head: {exc.message}",
                hint="the events are stored and the stored head lags behind them, which "
                "is a valid prefix; reopen the session to verify and continue",
                session_id=session_id,
                offset=high_water - 1,
            ) from exc
        if self._unheaded.get(session_id) == head:
            del self._unheaded[session_id]
        return head

    async def _maybe_compact(self, session_id: str) -> None:
        """Compaction on release: once ``compact_after`` segments have piled up, collect
        what earlier compactions left (past their grace period) and merge the tail."""
        if self.compact_after is None:
            return
        if self._tail_segments.get(session_id, 0) < self.compact_after:
            return
        try:
            await self.collect_garbage(session_id, grace_s=self.grace_s)
            if await self.compact(session_id) is not None:
                self.stats.compactions += 1
        except StorageError as exc:
            # the appends are durable and readable without it; the next release retries
            self.stats.compaction_failures += 1
            self.last_compaction_error = exc

    async def read_records(self, *, session_id: str, start: int, end: int | None) -> list[Record]:
        return await self._records(session_id, start, end)

    async def last_record(self, *, session_id: str) -> Record | None:
        records = await self._records(session_id, 0, None, last_only=True)
        return records[-1] if records else None

    async def stored_head(self, *, session_id: str) -> tuple[int, str] | None:
        best, manifest = await self._newest_head(session_id)
        if best is not None:
            return best
        # A session's first segment is put before its head: a reader between the two
        # sees one segment and no head, which is no loss. Anything more without a head
        # is a head that was deleted, unless it was put after the heads were listed
        # (every later segment is put after the first's head) or sealed into a newer
        # manifest meanwhile: read both again after the layout before failing closed.
        layout = await self._layout(session_id)
        if not (layout.sealed or len(layout.tail) > 1 or layout.tail not in ((), (0,))):
            return None
        for _ in range(_HEAD_TRIES):
            best, newer = await self._newest_head(session_id)
            if best is not None:
                return best
            if newer == manifest:
                break
            manifest = newer
        last = await self.last_record(session_id=session_id)
        if last is not None:
            raise head_missing(session_id, last.offset + 1, "object")
        return None

    async def _newest_head(self, session_id: str) -> tuple[tuple[int, str] | None, Manifest | None]:
        """The newest head the manifest or a head object names, and the manifest read."""
        root = session_root(session_id)
        manifest = await self.manifest(session_id)
        best = manifest.head if manifest and manifest.head else None
        for key in await self._list(f"{root}head/"):
            head = parse_head_key(session_id, key.rsplit("/", 1)[1])
            if best is None or head[0] > best[0]:
                best = head
        return best, manifest

    def present(self) -> bool:
        return True  # a bucket or directory is only known to be empty by listing it

    async def list_sessions(self) -> list[str]:
        found: set[str] = set()
        for key in await self._list("sessions/"):
            parts = key.split("/")
            if len(parts) != 4:
                continue
            _, session_id, kind, name = parts
            # a head that names no event (``0-``) is a session not started yet; any other
            # head, even one whose name is damaged, lists it so that reading it fails closed
            if kind in ("seg", "sealed", "manifest") or (
                kind == "head" and not (name[:20].isdigit() and int(name[:20]) == 0)
            ):
                found.add(session_id)
        return sorted(found)

    async def acquire_writer(self, *, session_id: str) -> _ObjectLease:
        key = (self.identity, check_session_id(session_id))
        if self.check_create_only:
            self.probe_requests += await ensure_create_only(
                self.store, scope=self._probe_scope, name=self.identity
            )
        holder = _WRITERS.get(key)
        if holder is not None:
            raise SessionLockedError(
                f"session {session_id!r} already has a writer (lease #{holder} in this process)",
                hint="close the other writer first",
                session_id=session_id,
            )
        _LEASES[0] += 1
        number = _LEASES[0]
        _WRITERS[key] = number
        shared = StoreLease(self.store, session_id, ttl_s=self.lease_ttl_s)
        try:
            if self.writer_lease:
                await shared.acquire()
        except BaseException:
            if _WRITERS.get(key) == number:
                del _WRITERS[key]
            raise
        finally:
            self.lease_requests += shared.requests
            shared.requests = 0
        if self.writer_lease:
            self._shared[session_id] = shared
        self._tails.pop(session_id, None)  # a new writer re-checks the stored head
        lease = _ObjectLease(self, key, number, shared)
        self._leases.append(lease)
        return lease

    async def close(self) -> None:
        # only this handle's leases: another handle on the same storage keeps its own
        for lease in self._leases:
            await lease.release()
        self._leases.clear()

    # ---------------------------------------------------------------- manifests

    async def write_manifest(self, session_id: str, **changes: Any) -> Manifest:
        """Write the next manifest version with ``changes`` applied (create-only: a
        concurrent manifest writer makes this one retry on top of the newer version)."""
        while True:
            current = await self.manifest(session_id)
            version = current.version + 1 if current else 1
            base = current or Manifest(session_id=session_id, version=0, created_us=0)
            manifest = replace(base, version=version, created_us=self._clock_us(), **changes)
            key = manifest_key(session_id, version)
            if await self._put(key, encode_manifest(manifest), create=True):
                return manifest

    async def compact(self, session_id: str) -> SealedRef | None:
        """Merge the appended segments into one sealed object; return it (None when
        there is nothing to merge). Event bytes and digests are copied unchanged; the old
        segments stay readable until ``collect_garbage`` after the grace period."""
        check_session_id(session_id)
        for _ in range(_RELIST_ATTEMPTS):
            layout = await self._layout(session_id)
            if len(layout.tail) < 2 and not (layout.tail and layout.sealed):
                return None
            try:
                chunks = await asyncio.gather(
                    *(
                        self._segment(session_id, seg_key(session_id, first), first)
                        for first in layout.tail
                    )
                )
            except _Relist:
                continue
            records = [r for chunk in chunks for r in chunk]
            expected = layout.sealed_end
            for record in records:
                if record.offset != expected:
                    raise StorageError(
                        f"session {session_id!r} cannot be compacted: offset {expected} is missing",
                        hint="verify the session first; a damaged log is never compacted",
                        code="object_store",
                        session_id=session_id,
                        offset=expected,
                    )
                expected += 1
            if not records:
                return None
            ref = SealedRef(
                key=sealed_key(session_id, records[0].offset, expected),
                first=records[0].offset,
                end=expected,
            )
            sealed = encode_segment(session_id, records)
            if await self._put(ref.key, sealed, create=True):
                await self._confirm(ref.key, len(sealed))  # before the manifest names it
            # the manifest's head covers the merged records: a compaction is a checkpoint
            head = await self.stored_head(session_id=session_id)
            if head is None or head[0] < expected:
                head = (expected, records[-1].digest)
            snapshots = layout.manifest.snapshots if layout.manifest else ()
            newest = _newest_snapshot(records)
            if newest is not None:
                snapshots = (*snapshots, newest)
            await self.write_manifest(
                session_id, sealed=(*layout.sealed, ref), head=head, snapshots=snapshots
            )
            self._tail_segments[session_id] = 0
            return ref
        return None

    async def collect_garbage(self, session_id: str, *, grace_s: float) -> int:
        """Tombstone appended segments sealed by manifests older than ``grace_s``, and
        delete heads and manifests they supersede; return how many objects changed."""
        check_session_id(session_id)
        root = session_root(session_id)
        manifest = await self.manifest(session_id)
        if manifest is None or self._clock_us() - manifest.created_us < grace_s * 1e6:
            return 0
        changed = 0
        for key in await self._list(f"{root}seg/"):
            first = parse_seg_key(session_id, key)
            if first >= manifest.sealed_end:
                continue
            blob = await self._get(key)
            if blob is not None and not is_tombstone(blob):
                sealed = next(s.key for s in manifest.sealed if s.first <= first < s.end)
                await self._put(key, encode_tombstone(sealed), create=False)
                changed += 1
        live_sealed = {s.key for s in manifest.sealed}
        for key in await self._list(f"{root}sealed/"):
            if key not in live_sealed:
                await self._delete(key)
                changed += 1
        if manifest.head is not None:
            for key in await self._list(f"{root}head/"):
                if parse_head_key(session_id, key.rsplit("/", 1)[1])[0] <= manifest.head[0]:
                    await self._delete(key)
                    changed += 1
        for key in (await self._manifests(session_id))[:-1]:
            await self._delete(key)
            changed += 1
        return changed

    async def session_bytes(self, session_id: str) -> int:
        """Bytes of every object stored under the session (not its shared blobs)."""
        total = 0
        try:
            async for chunk in obstore.list(self.store, session_root(session_id)):
                total += sum(int(meta["size"]) for meta in chunk)
        except (BaseError, OSError) as exc:
            raise object_store_error("list", session_root(session_id), exc) from exc
        return total


class ObjectCheckpoints:
    """The fold checkpoints of an ``ObjectLogStore`` (a ``CheckpointStore``).

    Every save is a new create-only object, ``sessions/<id>/checkpoint/<name>``, whose
    name is the writer's clock in microseconds and a random tag; once it is written the
    save deletes the session's other checkpoints. A load lists them and reads the one
    whose name sorts last. Objects are never overwritten, so a reader sees a whole
    checkpoint or none, and the store's ``cache_dir`` keeps one like any other immutable
    object: a worker that woke the session before reads it from its own disk. Races only
    cost time: two savers may leave two checkpoints (the newer name wins) or delete each
    other's (the next open decodes everything and writes one), and a checkpoint from a
    skewed clock, or of another history of the session, is still checked against the
    verified chain before anything of it is used.
    """

    def __init__(self, store: ObjectLogStore) -> None:
        self._store = store

    @staticmethod
    def _prefix(session_id: str) -> str:
        return f"{session_root(check_session_id(session_id))}checkpoint/"

    async def load_checkpoint(self, *, session_id: str) -> bytes | None:
        prefix = self._prefix(session_id)
        try:
            keys = await self._store._list(prefix)
            for key in reversed(keys):
                data = await self._store._get(key, immutable=True)
                if data is not None:  # else deleted by a newer save since the listing
                    return data
        except StorageError:  # unreachable or unreadable: a cache miss, never an error
            return None
        return None

    async def save_checkpoint(self, *, session_id: str, data: bytes) -> None:
        prefix = self._prefix(session_id)
        key = f"{prefix}{self._store._clock_us():020d}-{secrets.token_hex(4)}"
        await self._store._put(key, bytes(data), create=True)
        cached = self._store._cache_path(key)
        if cached is not None:  # this worker reads it back from disk
            with contextlib.suppress(OSError):
                await asyncio.to_thread(_write_cache, cached, bytes(data))
        with contextlib.suppress(StorageError):  # a leftover is never read over a newer one
            await self._drop(prefix, keep=key)

    async def discard_checkpoint(self, *, session_id: str) -> None:
        await self._drop(self._prefix(session_id), keep=None)

    async def _drop(self, prefix: str, *, keep: str | None) -> None:
        for key in await self._store._list(prefix):
            if key == keep:
                continue
            await self._store._delete(key)
            cached = self._store._cache_path(key)
            if cached is not None:  # a checkpoint is large: no copy of a dropped one stays
                await asyncio.to_thread(cached.unlink, missing_ok=True)


def _newest_snapshot(records: Sequence[Record]) -> tuple[int, str] | None:
    """``(high_water, ref)`` of the newest ``workspace_snapshot`` fact among ``records``,
    for the manifest: where a waking worker finds the workspace without reading the log
    (the verified log's fact stays the authority)."""
    for record in reversed(records):
        if b'"kind":"workspace_snapshot"' not in record.data:
            continue
        with contextlib.suppress(ValueError, KeyError, TypeError):
            body = json.loads(record.data)["body"]
            if body["kind"] == "workspace_snapshot":
                return record.offset + 1, str(body["ref"])
    return None


# A cached object is its bytes and their sha256: the local copy is checked on every read,
# so a cache damaged on this machine costs a fetch instead of a healthy log reading as
# corrupt (or a cached manifest saying something the store's does not).
_CACHE_TAG = 32


def _write_cache(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data + hashlib.sha256(data).digest())
    os.replace(tmp, path)


def _read_cache(path: Path) -> bytes | None:
    """The cached bytes, or None (a miss) when absent, unreadable or damaged; a damaged
    entry is removed so the fetch that follows replaces it."""
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    data, tag = blob[:-_CACHE_TAG], blob[-_CACHE_TAG:]
    if len(blob) >= _CACHE_TAG and hashlib.sha256(data).digest() == tag:
        return data
    with contextlib.suppress(OSError):
        path.unlink()
    return None


_MEMORY_STORES: dict[str, Any] = {}


@dataclass(frozen=True)
class StoreLocation:
    """An object store opened from a URL: the obstore store, the identity writer leases
    are keyed by, and the local directory (for fsync) when it is one."""

    store: Any
    identity: str
    local_root: Path | None
    url: str


def open_object_store(url: str) -> StoreLocation:
    """``file:///path``, ``memory://name`` or ``s3://bucket/prefix?endpoint=...&region=...``.

    S3 credentials come from the usual AWS environment variables (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``); they are never part
    of the URL and never logged. ``identity`` and every message carry the URL without its
    query string.
    """
    from urllib.parse import parse_qs, urlsplit

    from obstore.store import LocalStore, MemoryStore, S3Store

    parts = urlsplit(url)
    shown = f"{parts.scheme}://{parts.netloc}{parts.path}"

    def bad(why: str) -> UsageError:
        return UsageError(
            f"cannot use object store {shown!r}: {why}",
            hint="use file:///absolute/path, memory:// or s3://bucket/prefix?endpoint=URL",
            code="invalid_store_url",
        )

    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise bad("a file URL needs an absolute path")
        root = Path(parts.path)
        root.mkdir(parents=True, exist_ok=True)
        return StoreLocation(LocalStore(root), f"file://{root.resolve()}", root, shown)
    if parts.scheme == "memory":
        store = _MEMORY_STORES.setdefault(shown, MemoryStore())
        return StoreLocation(store, shown, None, shown)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise bad("an s3 URL needs a bucket")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"endpoint", "region"}
        if unknown:
            raise bad(f"unknown option(s) {', '.join(sorted(unknown))}")
        config: dict[str, Any] = {}
        if "endpoint" in query:
            config["endpoint"] = query["endpoint"]
            if query["endpoint"].startswith("http://"):
                config["allow_http"] = True
        region = query.get("region") or os.environ.get("AWS_REGION") or "us-east-1"
        prefix = parts.path.strip("/") or None
        s3 = S3Store(parts.netloc, prefix=prefix, region=region, **config)
        return StoreLocation(s3, shown, None, shown)
    raise bad(f"unknown scheme {parts.scheme!r}")

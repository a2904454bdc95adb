"""The writer lease of a session in an object store, across processes and machines.

``sessions/<id>/lease/<generation>`` objects, each a JSON record of its holder (host,
pid, a random run id, see ``_liveness``) and the wall-clock time its lease expires. The
newest generation is the lease. A writer takes it with a create-only put:

- no generation yet: it creates generation 1;
- the newest names a live holder whose lease has not expired: refused
  (``SessionLockedError`` naming the holder, as SQLite's lock refuses);
- the newest has lapsed (expired, or its holder is known dead on this machine): it
  creates the next generation. Two takers race for the same key and only one put
  succeeds, so two cannot both win; the loser reads the winner and is refused.

After its put the taker lists the generations once more and backs off if another live
one is there (a taker that raced a release and a fresh start), so at most one writer
runs, at the cost of both retrying in that rare race.

The holder renews its record (an overwrite of its own key) every third of the TTL, after
checking that no newer generation exists; once one does, the lease is lost and the
writer's next append is refused (``LeaseLostError``). An append made after the lease
lapsed on the holder's own clock (a process paused past its TTL) checks the listing first.
Release deletes the holder's key. Expiries compare wall clocks of different machines:
they must agree to well within the TTL; the create-only segment puts fence a writer
whatever the clocks say.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from lodger._core.extras import require
from lodger.errors import LeaseLostError, SessionLockedError, StorageError
from lodger.storage._liveness import alive, describe, this_process
from lodger.storage._objectio import object_store_error
from lodger.storage._segments import session_root

with require("s3", "the object store (s3://, file://, memory://)"):
    import obstore
    from obstore.exceptions import AlreadyExistsError, BaseError, NotFoundError

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = ["LEASE_TTL_S", "TTL_ENVVAR", "StoreLease", "lease_ttl_from_env"]

#: how long a writer lease lasts without renewal (renewed every third of it)
LEASE_TTL_S = 30.0
TTL_ENVVAR = "LODGER_WRITER_LEASE_TTL_S"
_ATTEMPTS = 3


def lease_ttl_from_env(environ: Mapping[str, str] | None = None) -> float:
    """The TTL of writer leases: ``LODGER_WRITER_LEASE_TTL_S`` seconds, else the default."""
    raw = (os.environ if environ is None else environ).get(TTL_ENVVAR, "").strip()
    if not raw:
        return LEASE_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        ttl = math.nan
    if not math.isfinite(ttl) or ttl <= 0:
        raise StorageError(
            f"{TTL_ENVVAR}={raw!r} is not a positive number of seconds",
            hint=f"unset it for the default ({LEASE_TTL_S:g} s)",
            code="usage",
        )
    return ttl


def _until(expires_us: int) -> str:
    moment = datetime.fromtimestamp(expires_us / 1e6, UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


class StoreLease:
    """One writer's lease of ``session_id`` in ``store``; ``acquire`` it, ``check`` it
    before each append, ``release`` it once."""

    def __init__(
        self,
        store: ObjectStore,
        session_id: str,
        *,
        ttl_s: float = LEASE_TTL_S,
        clock_us: Callable[[], int] | None = None,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.ttl_s = ttl_s
        self._clock_us = clock_us or (lambda: time.time_ns() // 1000)
        self._prefix = f"{session_root(session_id)}lease/"
        self.record: dict[str, Any] = {**this_process(), "run": secrets.token_hex(6)}
        self.key: str | None = None
        self.expires_us = 0
        #: why the lease was lost (then every append is refused)
        self.lost: str | None = None
        self.requests = 0
        self._renewer: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- requests

    async def _generations(self) -> list[tuple[int, str]]:
        self.requests += 1
        found: list[tuple[int, str]] = []
        try:
            async for chunk in obstore.list(self.store, self._prefix):
                for meta in chunk:
                    key = str(meta["path"])
                    name = key.rsplit("/", 1)[1]
                    if name.isdigit():
                        found.append((int(name), key))
        except (FileNotFoundError, NotFoundError):
            return []
        except (BaseError, OSError) as exc:
            raise object_store_error("list", self._prefix, exc) from exc
        return sorted(found)

    async def _read(self, key: str) -> dict[str, Any] | None:
        self.requests += 1
        try:
            result = await obstore.get_async(self.store, key)
            data = bytes(await result.bytes_async())
        except (FileNotFoundError, NotFoundError):
            return None
        except (BaseError, OSError) as exc:
            raise object_store_error("read", key, exc) from exc
        try:
            record = json.loads(data)
        except ValueError:
            record = None
        # a damaged record holds nothing: it lapses like one whose holder stopped renewing
        return record if isinstance(record, dict) else {"expires_us": 0}

    async def _write(self, key: str, *, create: bool) -> bool:
        expires = self._clock_us() + int(self.ttl_s * 1e6)
        body = json.dumps({**self.record, "expires_us": expires}).encode()
        self.requests += 1
        try:
            await obstore.put_async(self.store, key, body, mode="create" if create else "overwrite")
        except AlreadyExistsError:
            return False
        except (BaseError, OSError) as exc:
            raise object_store_error("write", key, exc) from exc
        self.expires_us = expires
        return True

    async def _delete(self, key: str) -> None:
        self.requests += 1
        with contextlib.suppress(FileNotFoundError, NotFoundError, BaseError, OSError):
            await obstore.delete_async(self.store, key)

    # ---------------------------------------------------------------- judging

    def _lapsed(self, record: dict[str, Any]) -> bool:
        if alive(record) is False:
            return True  # its holder is dead on this machine: no need to wait
        expires = record.get("expires_us")
        return not isinstance(expires, int) or expires <= self._clock_us()

    def _locked(self, record: dict[str, Any] | None) -> SessionLockedError:
        if record is None:
            holder = "another writer (the lease changed hands while this one looked)"
        else:
            holder = f"{describe(record)} (run {record.get('run')})"
            if isinstance(record.get("expires_us"), int):
                holder += f", whose lease lasts until {_until(record['expires_us'])} unless renewed"
        return SessionLockedError(
            f"session {self.session_id!r} is being written by {holder}",
            hint="wait for that run to finish or stop it; one writer per session",
            session_id=self.session_id,
        )

    # ---------------------------------------------------------------- lifecycle

    async def acquire(self) -> None:
        """Take the lease or raise ``SessionLockedError`` naming its holder."""
        for _ in range(_ATTEMPTS):
            generations = await self._generations()
            generation = 1
            if generations:
                newest, key = generations[-1]
                holder = await self._read(key)
                if holder is None:
                    continue  # released while we looked: list again
                if not self._lapsed(holder):
                    raise self._locked(holder)
                generation = newest + 1
            key = f"{self._prefix}{generation:020d}"
            if not await self._write(key, create=True):
                continue  # another taker won this generation: the next listing names it
            self.key = key
            await self._confirm(generation)
            self._renewer = asyncio.ensure_future(self._renew())
            return
        raise self._locked(None)

    async def _confirm(self, generation: int) -> None:
        """After our put: no other live generation may be there; lapsed older ones are
        cleared away."""
        for other, key in await self._generations():
            if other == generation:
                continue
            holder = await self._read(key)
            if holder is None:
                continue
            if other < generation and self._lapsed(holder):
                await self._delete(key)
                continue
            await self._delete(self.key or key)
            self.key = None
            raise self._locked(holder)

    async def _taken(self) -> str | None:
        """Why the lease is no longer ours (a newer generation, or ours removed by a
        taker after it lapsed), None while it is."""
        keys = [key for _, key in await self._generations()]
        for key in keys:
            if self.key is not None and key > self.key:
                newer = await self._read(key) or {}
                return f"{describe(newer)} (run {newer.get('run')}) took it over"
        if self.key not in keys:
            return "it lapsed and another writer took the session meanwhile"
        return None

    async def _renew(self) -> None:
        while self.lost is None and self.key is not None:
            await asyncio.sleep(self.ttl_s / 3)
            with contextlib.suppress(StorageError):  # retried; an append checks meanwhile
                await self._refresh()

    async def _refresh(self) -> None:
        self.lost = await self._taken()
        if self.lost is None and self.key is not None:
            await self._write(self.key, create=False)

    async def check(self) -> None:
        """Before an append: refuse it when the lease is lost; when it lapsed on our own
        clock (this process was paused), look at the listing before going on."""
        if self.lost is None and self.key is not None and self._clock_us() >= self.expires_us:
            await self._refresh()
        if self.lost is not None:
            raise LeaseLostError(
                f"the writer of session {self.session_id!r} lost its lease: {self.lost}; "
                "nothing of this append was written",
                hint="its lease lapsed while it was not renewed (a paused or stalled "
                "process); reopen the session to continue from the other writer's events",
                session_id=self.session_id,
            )

    async def release(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, StorageError):
                await renewer
        key, self.key = self.key, None
        if key is not None and self.lost is None:
            await self._delete(key)

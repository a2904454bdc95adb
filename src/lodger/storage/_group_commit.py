"""Group commit: appends that arrive while a commit is in flight are committed together.

A store's appends go to one queue. The first append to find the queue idle posts a drain
to the store's I/O thread; appends that arrive before the drain runs (most usefully, while
the previous group's commit waits for its fsync) join the same group. The drain hands the
whole group to the store's ``commit``, which decides each append's outcome: it sets
``error`` on the appends it refused or could not commit and leaves it None on the ones
that are durable. Only then is any caller answered, each on its own event loop, so
nothing is acknowledged before the group's commit returned.

Per group, not per append: one transaction and one fsync for SQLite, one file-identity
check, one head write per session. Each append keeps its own expected-offset check, so a
conflict in one session fails that append only; a failed commit fails every append it
carried.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lodger._core.eager import ShieldableFuture
from lodger.storage._worker import IoThread
from lodger.storage.logstore import Record

__all__ = ["AppendQueue", "GroupStats", "PendingAppend"]


@dataclass(slots=True, eq=False)
class PendingAppend:
    session_id: str
    records: Sequence[Record]
    expected_offset: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    #: set by the store's commit when this append was refused or is not durable
    error: BaseException | None = None

    @property
    def end(self) -> int:
        return self.expected_offset + len(self.records)


@dataclass(slots=True)
class GroupStats:
    """Counters: ``appends`` answered in ``groups`` commits, and how many groups had
    each size."""

    groups: int = 0
    appends: int = 0
    sizes: dict[int, int] = field(default_factory=dict)  # group size -> how many groups

    @property
    def largest(self) -> int:
        return max(self.sizes, default=0)


def _answer(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled; the append still had its outcome
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _answer_all(entries: list[PendingAppend]) -> None:
    for entry in entries:
        _answer(entry.future, entry.error)


class AppendQueue:
    """The pending appends of one store, drained in groups on its I/O thread."""

    def __init__(self, io: IoThread, commit: Callable[[list[PendingAppend]], None]) -> None:
        self._io = io
        self._commit = commit
        self._lock = threading.Lock()
        self._pending: list[PendingAppend] = []
        self._posted = False
        self.stats = GroupStats()

    def waiting(self) -> int:
        """Appends queued for the next group (for tests and statistics)."""
        with self._lock:
            return len(self._pending)

    async def append(
        self, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        loop = asyncio.get_running_loop()
        # a future the journal's shielded wait can wait on directly (``finish_shielded``)
        entry = PendingAppend(
            session_id, records, expected_offset, loop, ShieldableFuture(loop=loop)
        )
        with self._lock:
            self._pending.append(entry)
            post, self._posted = not self._posted, True
        if post:
            try:
                self._io.post(self._drain)
            except BaseException:
                with self._lock:
                    self._pending.remove(entry)
                    self._posted = False
                raise
        await entry.future

    def _drain(self) -> None:
        with self._lock:
            group, self._pending = self._pending, []
            self._posted = False
        if not group:
            return
        try:
            self._commit(group)
        except BaseException as exc:  # noqa: BLE001 - a bug in commit fails its appends
            for entry in group:
                if entry.error is None:
                    entry.error = exc
        stats = self.stats
        stats.groups += 1
        stats.appends += len(group)
        stats.sizes[len(group)] = stats.sizes.get(len(group), 0) + 1
        by_loop: dict[asyncio.AbstractEventLoop, list[PendingAppend]] = {}
        for entry in group:
            by_loop.setdefault(entry.loop, []).append(entry)
        for loop, entries in by_loop.items():
            # one wake-up per event loop, not per append; a closed loop raises
            # RuntimeError: nobody is waiting for these appends any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_answer_all, entries)

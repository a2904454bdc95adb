"""Group commit of a local-directory object store: many sessions' puts, one sync.

A put into a ``file://`` store is durable once its object and its directory entry are on
the device (L4). Done one put at a time through obstore, an append cost a put and a HEAD
(two round trips through obstore's runtime threads) and a thread hop for two ``fsync``
calls; on a filesystem without a journal each ``fsync`` is its own device flush, and
sixteen sessions appending at once queued their pairs behind the default thread pool.

``GroupSync`` commits in groups instead. The first create-only put starts a group at once
(a lone session waits for nothing more than its own put); the puts of other sessions that
arrive while that group is in flight wait for it to end and then form the next group. A
group is one job on one thread: each put is written as obstore's ``LocalStore`` writes it
(a staging file ``<name>#<n>``, hard-linked to the object's name, which refuses a name
that exists: create-only, so each session keeps its own key and is fenced alone), then
one ``syncfs`` of the store's filesystem makes every object and directory entry of the
group durable, then a ``stat`` of each object checks it is there at the size written (what
``_objectio.confirm_stored``'s HEAD asks a remote store). Where there is no ``syncfs``
(not Linux) each put goes through obstore and syncs its own object and directory
(``fsync_object``), as before.

Nothing is acknowledged before its group's sync returned. A put that fails fails alone;
a sync that fails fails every put of its group (each caller gets an ``OSError``, which the
store reports as ``StorageError`` and the log as ``CommitFailedError``). A caller
cancelled while it waits leaves the group; the others still get their answer.

``syncfs`` writes back everything dirty on that filesystem, other programs' files too:
on a disk shared with heavy writers a group waits for their data as well. Give a busy
``file://`` store a filesystem of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import itertools
import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lodger._core.eager import ShieldableFuture

__all__ = ["GroupSync", "fsync_object", "syncfs_available"]


def fsync_object(path: Path) -> None:
    """fsync one object and the directory that names it."""
    for target in (path, path.parent):
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _libc_syncfs() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_SYNCFS = _libc_syncfs()


def syncfs_available() -> bool:
    return _SYNCFS is not None


def syncfs(root: Path, paths: Sequence[Path]) -> None:
    """Sync the filesystem that holds ``root``: every object of ``paths`` (all under it)
    and its directory entry, in one call."""
    assert _SYNCFS is not None
    fd = os.open(root, os.O_RDONLY)
    try:
        if _SYNCFS(fd) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"syncfs of {root} failed: {os.strerror(errno)}")
    finally:
        os.close(fd)


def _write_create_only(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists; False when it holds other bytes.

    As obstore's ``LocalStore`` does it: the bytes go to a staging file ``<name>#<n>`` in
    the same directory (listings skip such names), which is then hard-linked to the
    object's name (atomic, and refused when the name exists) and removed."""
    try:
        fd, staging = _staging(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, staging = _staging(path)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        try:
            os.link(staging, path)
        except FileExistsError:
            return path.read_bytes() == data  # a retried put of the same bytes is ours
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)


_STAGING = itertools.count(secrets.randbelow(1 << 40))


def _staging(path: Path) -> tuple[int, Path]:
    for _ in range(100):
        staging = path.with_name(f"{path.name}#{next(_STAGING)}")
        try:
            return os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), staging
        except FileExistsError:
            continue
    raise FileExistsError(f"no free staging name beside {path}")


@dataclass
class _Op:
    """One caller's part of a group: a create-only put (``data``) or a sync only."""

    path: Path
    data: bytes | None
    done: asyncio.Future[bool]


def _run_group(
    root: Path,
    ops: Sequence[tuple[Path, bytes | None]],
    sync: Callable[[Path, Sequence[Path]], None],
) -> list[bool | OSError]:
    """On a thread: every put of the group, then one sync of all that was written."""
    results: list[bool | OSError] = []
    for path, data in ops:
        try:
            results.append(True if data is None else _write_create_only(path, data))
        except OSError as exc:  # this put failed; the others of the group go on
            results.append(exc)
    written = [path for (path, _), r in zip(ops, results, strict=True) if r is True]
    if not written:
        return results
    try:
        sync(root, written)
    except OSError as exc:  # every put the failed sync was to cover fails
        failed = OSError(exc.errno, f"the sync of its group failed: {exc.strerror or exc}")
        return [failed if r is True else r for r in results]
    for index, ((path, data), result) in enumerate(zip(ops, results, strict=True)):
        if result is True and data is not None:
            results[index] = _kept(path, len(data))
    return results


def _kept(path: Path, size: int) -> bool | OSError:
    """After the sync: the object is there with the size written (what the HEAD of
    ``_objectio.confirm_stored`` asks a remote store)."""
    try:
        stored = os.stat(path).st_size
    except OSError as exc:
        return exc
    if stored != size:
        return OSError(f"{path.name} holds {stored} bytes of the {size} written")
    return True


class GroupSync:
    """Durable puts into ``root``, one sync per group (see the module docstring).

    ``sync_paths(root, paths)`` is the sync a group runs on its thread (``syncfs`` where
    the platform has it; tests replace it to hold a group open or fail it). ``groups``
    counts the jobs run and ``synced`` the puts they covered.
    """

    def __init__(
        self,
        root: Path,
        *,
        sync_paths: Callable[[Path, Sequence[Path]], None] | None = None,
    ) -> None:
        self.root = root
        if sync_paths is None and syncfs_available():
            sync_paths = syncfs
        self.sync_paths = sync_paths
        self.groups = 0
        self.synced = 0
        self._pending: list[_Op] = []
        self._in_flight = False

    @property
    def waiting(self) -> int:
        """Puts waiting for the group in flight to end (they form the next group)."""
        return len(self._pending)

    @property
    def grouped(self) -> bool:
        """Whether puts are written and synced here in groups (else: obstore's put and a
        sync of each put on its own)."""
        return self.sync_paths is not None

    async def put_create(self, path: Path, data: bytes) -> bool:
        """Create ``path`` (under ``root``) holding ``data``, durably, in the next group;
        False when it already holds other bytes."""
        return await self._join(path, data)

    async def sync(self, path: Path) -> None:
        """Return once ``path`` (an object just put under ``root``) is durable."""
        if self.sync_paths is None:  # no group sync here: each put syncs its own
            await asyncio.to_thread(fsync_object, path)
            self.groups += 1
            self.synced += 1
            return
        await self._join(path, None)

    async def _join(self, path: Path, data: bytes | None) -> bool:
        loop = asyncio.get_running_loop()
        # a future the journal's shielded wait can wait on directly (``finish_shielded``)
        op = _Op(path, data, ShieldableFuture(loop=loop))
        self._pending.append(op)
        if not self._in_flight:
            self._start(loop)
        return await op.done

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        group, self._pending = self._pending, []
        self._in_flight = True
        self.groups += 1
        self.synced += len(group)
        sync_paths = self.sync_paths
        assert sync_paths is not None
        ops = [(op.path, op.data) for op in group]
        try:
            job = loop.run_in_executor(None, _run_group, self.root, ops, sync_paths)
        except RuntimeError as exc:  # the loop is shutting down: nothing of it is durable
            self._in_flight = False
            for op in group:
                if not op.done.done():
                    op.done.set_exception(OSError(f"the group sync could not start: {exc}"))
            return
        job.add_done_callback(lambda finished: self._finish(loop, finished, group))

    def _finish(
        self,
        loop: asyncio.AbstractEventLoop,
        job: asyncio.Future[list[bool | OSError]],
        group: list[_Op],
    ) -> None:
        if job.cancelled():
            outcomes: list[bool | BaseException] = [OSError("the group was cancelled")] * len(group)
        elif (error := job.exception()) is not None:
            outcomes = [error] * len(group)
        else:
            outcomes = list(job.result())
        for op, outcome in zip(group, outcomes, strict=True):
            if op.done.done():  # its caller was cancelled while it waited
                continue
            if isinstance(outcome, BaseException):
                op.done.set_exception(outcome)
            else:
                op.done.set_result(outcome)
        self._in_flight = False
        if self._pending:  # the puts that came while this group was in flight
            self._start(loop)

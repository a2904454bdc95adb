"""The disk limit: what one command writes into the workspace and its private ``/tmp``.

``Limits.disk_bytes`` is held three ways, each covering what the others cannot:

- ``RLIMIT_FSIZE`` (set by the trampoline, ``lodger.substrates.sandbox._process``): no
  file can grow past the limit, however fast it is written; the writer gets ``SIGXFSZ``
  (or ``EFBIG`` if it ignores the signal). It bounds one file, not their sum; and in a
  workspace that holds a file larger than the limit already, it is raised by that
  file's size (so the file can still be written), leaving the rest to the watcher.
- the private ``/tmp`` is a tmpfs of that size (``bwrap --size``): it fills up, it never
  grows past the limit.
- a watcher (``DiskWatch``, a thread) counts the rest: inotify watches every directory of
  the workspace; each file a command creates, writes, truncates or moves in is looked at
  again, and what it holds beyond its size before the command counts as written. With
  ``/tmp``'s usage added (a descriptor of it is opened through ``/proc/<pid>/root/tmp``
  of a process inside the sandbox as soon as it is mounted, and held to the end), once
  the total reaches the limit the whole tree is killed. After the command, a last count
  decides: a command that went past the limit and ended before the
  watcher caught it is still reported as stopped by it (``limit="disk"``).

What it does not cover: files are counted by their size (a sparse file counts whole,
an unchanged file moved or hard-linked in counts as new bytes: conservative); deleted
files are not credited; a burst of many files each under the limit can overshoot by what
the writer manages between the watcher's wakeups (a few milliseconds, more on a loaded
machine); anything else writing the workspace at the same time (another tool call in
parallel) counts too; with the gVisor backend ``/tmp`` lives in the Sentry's memory
(bounded by the memory limit and ``RLIMIT_FSIZE`` per file, not by ``disk_bytes`` as a
whole). Directories the watcher cannot watch (inotify's watch limit reached, or events
lost in an overflow) make it count by walking the whole workspace, every ``_RESCAN_S``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import select
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["DiskWatch"]

_IN_MODIFY = 0x00000002
_IN_ATTRIB = 0x00000004
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_FROM = 0x00000040
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
_IN_EXCL_UNLINK = 0x04000000
_IN_ISDIR = 0x40000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_MASK = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_ONLYDIR
    | _IN_DONT_FOLLOW
    | _IN_EXCL_UNLINK
)
_HEADER = struct.Struct("iIII")
#: how often /tmp's usage is read (and the workspace walked, where it is not watched)
_POLL_S = 0.02
_RESCAN_S = 0.25


def _inotify() -> tuple[Callable[[int], int], Callable[[int, bytes, int], int]] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        return libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError):
        return None


_LIBC = _inotify()


class DiskWatch:
    """Counts the bytes one command writes under ``root`` (leaving out ``exclude``,
    absolute paths inside it) and in its sandbox's ``/tmp`` (with ``private_tmp``: a
    tmpfs of ``limit`` bytes, as bubblewrap mounts); calls ``kill`` once the
    count reaches ``limit``. ``prepare`` before the command starts (it records every
    file's size and sets the watches), ``start`` once it runs, ``finish`` after it ended.

    >>> watch = DiskWatch(workspace, limit=1 << 30)
    >>> await asyncio.to_thread(watch.prepare)
    >>> watch.start(pid, kill)
    >>> ...  # the command runs
    >>> await asyncio.to_thread(watch.finish)
    >>> watch.over, watch.written
    """

    def __init__(
        self, root: Path, *, limit: int, exclude: Iterable[Path] = (), private_tmp: bool = True
    ) -> None:
        self.root = root
        self.limit = limit
        self.private_tmp = private_tmp
        self.exclude = frozenset(os.path.realpath(p) for p in exclude)
        #: whether the command reached the limit
        self.over = False
        #: bytes counted as written (workspace and /tmp), as of the last look
        self.written = 0
        self._before: dict[str, int] = {}
        self.file_ceiling = limit
        self._grown: dict[str, int] = {}
        self._grown_total = 0
        self._tmp_used = 0
        self._dirs: dict[int, str] = {}
        self._fd = -1
        self._walking = False  # counting by walking the workspace (no or lost watches)
        self._last_walk = 0.0
        self._pid = 0
        self._kill: Callable[[], None] = lambda: None
        self._stop_r, self._stop_w = -1, -1
        self._tmp_fd = -1
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- before the command --------------------------------------------------------

    def prepare(self) -> None:
        """Record the size of every file and watch every directory (blocking: call it
        in a thread)."""
        if _LIBC is not None:
            self._fd = _LIBC[0](_IN_NONBLOCK | _IN_CLOEXEC)
        if self._fd < 0:
            self._walking = True
        for path, size in self._walk(self.root, watch=True):
            self._before[path] = size
        #: RLIMIT_FSIZE for the command: the limit, above the largest file there already
        #: (else a file larger than the limit could not even be appended to)
        self.file_ceiling = self.limit + max(self._before.values(), default=0)

    def _walk(self, top: Path | str, *, watch: bool) -> Iterable[tuple[str, int]]:
        """``(path, size)`` of every regular file under ``top``, watching each directory
        on the way when ``watch``; symlinks are never followed."""
        pending = [str(top)]
        while pending:
            here = pending.pop()
            if here in self.exclude:
                continue
            if watch and not self._walking:
                self._add_watch(here)
            try:
                entries = os.scandir(here)
            except OSError:
                continue  # gone meanwhile, or unreadable
            with entries:
                for entry in entries:
                    try:
                        mode = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(mode.st_mode):
                        pending.append(entry.path)
                    elif stat.S_ISREG(mode.st_mode) and entry.path not in self.exclude:
                        yield entry.path, mode.st_size

    def _add_watch(self, path: str) -> None:
        wd = _LIBC[1](self._fd, os.fsencode(path), _MASK) if _LIBC is not None else -1
        if wd < 0:
            if ctypes.get_errno() in (errno.ENOSPC, errno.ENOMEM):
                self._walking = True  # out of watches: count by walking instead
            return  # gone, or not a directory any more: nothing to watch there
        self._dirs[wd] = path

    # -- while it runs ---------------------------------------------------------------

    def start(self, pid: int, kill: Callable[[], None]) -> None:
        """Watch the command whose outermost process is ``pid``; ``kill`` stops it."""
        self._pid, self._kill = pid, kill
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="lodger-disk-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._stop_r, select.POLLIN)
        if self._fd >= 0:
            poller.register(self._fd, select.POLLIN)
        while not self.over:
            # until the sandbox's /tmp is found, look every millisecond: it must be held
            # before the command can fill it and end
            wait = _POLL_S if self._tmp_fd >= 0 or not self.private_tmp else 0.001
            ready = {fd for fd, _ in poller.poll(wait * 1000)}
            self.look()
            if self._stop_r in ready:
                return

    def look(self) -> None:
        """Count again what changed; kill the command when it reached the limit."""
        with self._lock:
            changed = self._read_events()
            if self._walking:
                if time.monotonic() - self._last_walk >= _RESCAN_S:
                    self._last_walk = time.monotonic()
                    self._count_everything()
            else:
                for path in changed:
                    self._count(path, _size(path))
            if self.private_tmp and self._tmp_fd < 0 and self._pid > 0:
                self._tmp_fd = _open_tmp(self._pid, self.limit)
            self._tmp_used = max(self._tmp_used, _used(self._tmp_fd))
            self.written = self._grown_total + self._tmp_used
            if self.written >= self.limit and not self.over:
                self.over = True
                self._kill()

    def _read_events(self) -> set[str]:
        changed: set[str] = set()
        while self._fd >= 0:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                self._walking = True
                break
            offset = 0
            while offset + _HEADER.size <= len(data):
                wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
                offset += _HEADER.size
                name = data[offset : offset + length].rstrip(b"\0")
                offset += length
                if mask & _IN_Q_OVERFLOW:
                    self._walking = True  # events were lost: only a walk is sure
                    continue
                if mask & _IN_IGNORED:
                    self._dirs.pop(wd, None)
                    continue
                parent = self._dirs.get(wd)
                if parent is None or not name:
                    continue
                path = os.path.join(parent, os.fsdecode(name))
                if path in self.exclude:
                    continue
                if mask & _IN_ISDIR:
                    if mask & (_IN_CREATE | _IN_MOVED_TO):
                        # new here (or moved: its watches now name the new paths);
                        # what it already holds counts as written
                        changed.update(p for p, _ in self._walk(path, watch=True))
                    else:  # moved away or deleted: what was counted under it is gone
                        changed.update(p for p in self._grown if p.startswith(path + "/"))
                else:
                    changed.add(path)
        return changed

    def _count(self, path: str, size: int) -> None:
        grown = max(0, size - self._before.get(path, 0))
        self._grown_total += grown - self._grown.get(path, 0)
        self._grown[path] = grown

    def _count_everything(self) -> None:
        now = dict(self._walk(self.root, watch=False))
        for path in set(now) | set(self._grown):
            self._count(path, now.get(path, 0))

    # -- after it ended --------------------------------------------------------------

    def finish(self) -> None:
        """Stop watching and count once more: what the command left decides whether it
        went past the limit (blocking: call it in a thread)."""
        if self._thread is not None:
            os.write(self._stop_w, b"x")
            self._thread.join()
        self._last_walk = 0.0
        self.look()
        self.close()

    def close(self) -> None:
        for fd in (self._fd, self._stop_r, self._stop_w, self._tmp_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._stop_r = self._stop_w = self._tmp_fd = -1


def _size(path: str) -> int:
    try:
        info = os.lstat(path)
    except OSError:
        return 0  # deleted (or moved away) since
    return info.st_size if stat.S_ISREG(info.st_mode) else 0


def _open_tmp(pid: int, size: int) -> int:
    """A descriptor of the private ``/tmp`` (a tmpfs of ``size`` bytes) of the sandbox
    whose outermost process is ``pid``, opened through the command's process (its mount
    namespace holds that ``/tmp``); -1 while there is none yet (the sandbox is being set
    up: bubblewrap's init mounts a ``/tmp`` of its own for a moment, which is not it).
    Held open, it keeps the tmpfs readable after the sandbox ended, for the last count."""
    for inside in _grandchildren(pid):
        try:
            fd = os.open(f"/proc/{inside}/root/tmp", os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        mine = os.fstatvfs(fd)
        if abs(mine.f_blocks * mine.f_frsize - size) < max(mine.f_frsize, 1):
            return fd
        os.close(fd)  # not the sandbox's /tmp (not mounted yet, or the host's)
    return -1


def _used(fd: int) -> int:
    if fd < 0:
        return 0
    info = os.fstatvfs(fd)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


def _grandchildren(pid: int) -> list[int]:
    """The children of ``pid``'s children: under bubblewrap, the command (its init's
    child), which starts only once the sandbox is set up."""
    level = [pid]
    for _ in range(2):
        nxt: list[int] = []
        for parent in level:
            try:
                text = Path(f"/proc/{parent}/task/{parent}/children").read_text()
            except OSError:
                continue
            nxt += [int(p) for p in text.split()]
        level = nxt
    return level

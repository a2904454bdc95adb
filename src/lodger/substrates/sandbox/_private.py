"""The entries of the system's configuration that others may not read, walked again only
when something there changed.

bubblewrap binds /etc into every sandbox and covers each entry of it that is private to
its owner or group (``bubblewrap.masked_paths``). Walking /etc for that costs about 3 ms
per command here (1,200 entries, 150 directories), a fifth of a sandbox's start. So the
walk's result is kept, with an inotify watch on every directory the walk entered, added
before the directory is read (a change after the read is an event, a change before it
is in what was read), and the mount table open to poll: an entry created, deleted or
moved, a mode or owner changed (``IN_ATTRIB``), a watched directory moved or deleted, a
queue overflow, or any mount or unmount makes the next command walk again. Where inotify
is missing or out of watches, and in a forked child, every command walks, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import stat
import threading
from collections.abc import Callable, Sequence

__all__ = ["PrivateEntries", "private_entries"]

_IN_ATTRIB = 0x00000004
_IN_MOVED_FROM = 0x00000040
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
_MASK = (
    _IN_ATTRIB
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
    | _IN_DONT_FOLLOW
)
_MOUNTS = "/proc/self/mounts"


def _inotify() -> tuple[Callable[[int], int], Callable[[int, bytes, int], int]] | None:
    try:  # this process's own symbols, libc's among them
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError):
        return None


_LIBC = _inotify()


def private_entries(root: str, watch: Callable[[str], None] | None = None) -> list[str]:
    """Every entry under ``root`` others may not read (a directory: read or enter), not
    looking inside those; symbolic links are skipped (their targets are checked where
    they lie). ``watch`` is called with each directory before it is read."""
    found: list[str] = []
    pending = [root]
    while pending:
        directory = pending.pop()
        if watch is not None:
            watch(directory)
        try:
            entries = os.scandir(directory)
        except OSError:
            continue  # gone, or unreadable to lodger too
        with entries:
            for entry in entries:
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                if stat.S_ISLNK(mode):
                    continue
                if stat.S_ISDIR(mode):
                    if mode & 0o005 != 0o005:
                        found.append(entry.path)
                    else:
                        pending.append(entry.path)
                elif not mode & 0o004:
                    found.append(entry.path)
    return found


class PrivateEntries:
    """``private_entries`` of ``roots``, kept while nothing under them changed."""

    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = tuple(roots)
        self.walks = 0  #: how many times the roots were walked (for tests)
        self._lock = threading.Lock()
        self._found: list[str] | None = None
        self._pid = 0
        self._fd = -1  # the inotify instance of the kept walk
        self._mounts: select.poll | None = None
        self._mounts_file: int = -1

    def get(self) -> list[str]:
        with self._lock:
            if self._found is not None and self._pid == os.getpid() and not self._changed():
                return list(self._found)
            self._close()
            found = self._walk()
            return list(found)

    def _changed(self) -> bool:
        assert self._mounts is not None
        if self._mounts.poll(0):  # POLLPRI | POLLERR: the mount table changed
            return True
        try:
            os.read(self._fd, 4096)
        except BlockingIOError:
            return False  # no event since the walk
        except OSError:
            return True
        return True

    def _walk(self) -> list[str]:
        self.walks += 1
        keep = self._watching()
        failed: list[str] = []

        def watch(directory: str) -> None:
            assert _LIBC is not None
            if _LIBC[1](self._fd, os.fsencode(directory), _MASK) >= 0:
                return
            if ctypes.get_errno() not in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):
                failed.append(directory)  # out of watches (ENOSPC, ENOMEM): not kept

        found: list[str] = []
        for root in self.roots:
            found += private_entries(root, watch if keep else None)
        if keep and not failed:
            self._found, self._pid = found, os.getpid()
        else:
            self._close()
        return found

    def _watching(self) -> bool:
        """Open an inotify instance and the mount table to poll; False where either
        cannot be had (then nothing is kept)."""
        if _LIBC is None:
            return False
        fd = _LIBC[0](os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return False
        try:
            mounts = os.open(_MOUNTS, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(fd)
            return False
        poller = select.poll()
        poller.register(mounts, select.POLLPRI | select.POLLERR)
        poller.poll(0)  # the table as it is now is the one the walk sees
        self._fd, self._mounts_file, self._mounts = fd, mounts, poller
        return True

    def _close(self) -> None:
        self._found = None
        for fd in (self._fd, self._mounts_file):
            if fd >= 0:  # in a forked child, its own copy
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._mounts_file = -1
        self._mounts = None

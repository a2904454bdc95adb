"""The size of every file in a workspace, kept up to date for as long as it is used.

A ``Sizes`` walks its workspace once (in a thread of its own, started when it is first
asked for), then keeps an inotify watch on every directory and a map of every regular
file's size: a thread reads the events as they come, looks again at each file an event
names, and walks each directory made or moved in. Between commands it goes on (what the
host's file tools or the user change updates the map), so a command's disk count
(``lodger.substrates.sandbox._disk``) starts from the map as it stands, after the
events still queued are read: per command the cost is that of the events, not of the
workspace. Each command attached to it is told of every change (the size before and
after) while it runs.

One ``Sizes`` per workspace (its real path and what is left out of it) in this process,
shared by every command run there (``sizes_of``); at most ``KEPT`` of them, the least
recently used one closed first; one unused for ``IDLE_S`` closes itself. Where inotify
is missing or out of watches, it counts by walking instead (``walking``): the map is
walked again when a command starts and every ``RESCAN_S`` while one runs. Events lost in
an overflow make it walk once to catch up.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import os
import select
import stat
import struct
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

__all__ = ["IDLE_S", "KEPT", "RESCAN_S", "Sizes", "close_all", "sizes_of"]

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
#: how many workspaces are watched at once in this process (each holds an inotify
#: instance, a watch per directory and the map: about 250 bytes per file, 16 MB for
#: a project of 64,000 files)
KEPT = 8
#: seconds a watcher no command used closes itself after
IDLE_S = 600.0
#: while a command runs, how often a workspace that cannot be watched is walked again
RESCAN_S = 0.25


def _inotify() -> tuple[Callable[[int], int], Callable[[int, bytes, int], int]] | None:
    try:  # this process's own symbols, libc's among them (find_library runs ldconfig)
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError):
        return None


_LIBC = _inotify()


class Listener(Protocol):
    """What a command's count (``DiskWatch``) is told, under ``Sizes.lock``."""

    def changed(self, path: str, before: int, after: int) -> None: ...

    def recount(self) -> None: ...


class Sizes:
    """Every regular file's size under ``root`` (a real path), leaving out ``exclude``
    (real paths inside it); symlinks are never followed."""

    def __init__(self, root: str, exclude: frozenset[str]) -> None:
        self.root = root
        self.exclude = exclude
        #: every regular file that is not empty, and its size (read under ``lock``)
        self.sizes: dict[str, int] = {}
        #: counting by walking (no inotify, or out of watches)
        self.walking = False
        self.lock = threading.RLock()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.used = time.monotonic()
        #: held weakly: a count dropped without ``close`` does not keep this one busy
        self._listeners: weakref.WeakSet[Listener] = weakref.WeakSet()
        self._largest: int | None = 0
        self._dirs: dict[int, str] = {}
        self._lost = False  # events were lost (an overflow): walk once to catch up
        self._last_walk = 0.0
        self._closed = False
        self._fd = _LIBC[0](os.O_NONBLOCK | os.O_CLOEXEC) if _LIBC is not None else -1
        self.walking = self._fd < 0
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="lodger-disk-sizes", daemon=True)
        self._thread.start()

    # -- commands ----------------------------------------------------------------------

    def attach(self, listener: Listener) -> bool:
        """Tell ``listener`` of every change from now on; the map is up to date first (the
        first walk done, the events queued read; walked again where not watched). False
        if this watcher was closed meanwhile (ask ``sizes_of`` again)."""
        self.ready.wait()
        if self.error is not None:
            raise self.error
        with self.lock:
            if self._closed:
                return False
            self.rescan_now()
            self.refresh(walk=self.walking)
            self._listeners.add(listener)
            self.used = time.monotonic()
            return True

    def detach(self, listener: Listener) -> None:
        with self.lock:
            self._listeners.discard(listener)
            self.used = time.monotonic()

    def baseline(self, path: str) -> int:
        return self.sizes.get(path, 0)

    def largest(self) -> int:
        """The largest file's size (under ``lock``)."""
        if self._largest is None:
            self._largest = max(self.sizes.values(), default=0)
        return self._largest

    def refresh(self, *, walk: bool = False) -> None:
        """Read the events queued (under ``lock``); with ``walk``, walk everything again
        (when not watched: at most every ``RESCAN_S``). Listeners hear of each change."""
        for path in self._read_events():
            self._update(path, _size(path))
        if self._lost or (walk and time.monotonic() - self._last_walk >= RESCAN_S):
            self._lost = False
            self._catch_up()
        for listener in self._listeners:
            listener.recount()

    def rescan_now(self) -> None:
        """Let the next ``refresh(walk=True)`` walk, however recent the last walk."""
        self._last_walk = 0.0

    # -- the map -----------------------------------------------------------------------

    def _update(self, path: str, size: int) -> None:
        before = self.sizes.get(path, 0)
        if size == before:
            return
        if size:
            self.sizes[path] = size
        else:
            del self.sizes[path]
        if self._largest is not None:
            if size > self._largest:
                self._largest = size
            elif before == self._largest:
                self._largest = None  # it shrank: found again when asked
        for listener in self._listeners:
            listener.changed(path, before, size)

    def _catch_up(self) -> None:
        now = dict(self._walk(self.root, watch=not self.walking))
        self._last_walk = time.monotonic()
        for path in [p for p in self.sizes if p not in now]:
            self._update(path, 0)
        for path, size in now.items():
            self._update(path, size)

    def _walk(self, top: str, *, watch: bool) -> Iterator[tuple[str, int]]:
        """``(path, size)`` of every regular file under ``top``, watching each directory
        on the way when ``watch``."""
        pending = [top]
        while pending:
            here = pending.pop()
            if here in self.exclude:
                continue
            if watch and not self.walking:
                self._add_watch(here)
            try:
                entries = os.scandir(here)
            except OSError:
                continue  # gone meanwhile, or unreadable
            with entries:
                for entry in entries:
                    path = entry.path
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(path)
                        elif entry.is_file(follow_symlinks=False) and path not in self.exclude:
                            yield path, entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue  # gone meanwhile

    def _add_watch(self, path: str) -> None:
        wd = _LIBC[1](self._fd, os.fsencode(path), _MASK) if _LIBC is not None else -1
        if wd < 0:
            if ctypes.get_errno() in (errno.ENOSPC, errno.ENOMEM):
                self.walking = True  # out of watches: count by walking instead
            return  # gone, or not a directory any more: nothing to watch there
        self._dirs[wd] = path

    def _read_events(self) -> Iterable[str]:
        """The paths events named since the last read (files, and every file under a
        directory made or moved in, or under one moved away)."""
        changed: set[str] = set()
        gone: list[str] = []
        while self._fd >= 0:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                self._lost = True
                break
            self._parse(data, changed, gone)
        if gone:  # directories moved away: what the map held under them is not there now
            prefixes = tuple(p + "/" for p in gone)
            changed.update(p for p in self.sizes if p.startswith(prefixes))
        return changed

    def _parse(self, data: bytes, changed: set[str], gone: list[str]) -> None:
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            offset += _HEADER.size
            name = data[offset : offset + length].rstrip(b"\0")
            offset += length
            if mask & _IN_Q_OVERFLOW:
                self._lost = True  # events were lost: only a walk is sure
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
            if not mask & _IN_ISDIR:
                changed.add(path)
            elif mask & (_IN_CREATE | _IN_MOVED_TO):
                # new here (or moved: its watches now name the new paths)
                changed.update(p for p, _ in self._walk(path, watch=True))
            elif mask & _IN_MOVED_FROM:
                gone.append(path)
            # a directory deleted was empty: its files' deletions came first

    # -- its thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            with self.lock:
                self._catch_up()
        finally:  # a walk that failed fails the commands that wait for it (not hangs)
            if self._last_walk == 0.0:  # it did not end
                self.error = OSError(f"lodger: the disk watcher could not walk {self.root}")
            self.ready.set()
        poller = select.poll()
        poller.register(self._stop_r, select.POLLIN)
        if self._fd >= 0:
            poller.register(self._fd, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll(min(IDLE_S, 60.0) * 1000)}
            if self._stop_r in ready or self._closed:
                return
            if self._fd in ready:
                with self.lock:
                    self.refresh()
            elif _forget_if_idle(self):
                return

    def idle(self) -> bool:
        with self.lock:
            return not self._listeners and time.monotonic() - self.used >= IDLE_S

    def busy(self) -> bool:
        with self.lock:
            return bool(self._listeners)

    def close(self) -> None:
        """Stop watching (the thread ends; a command still attached counts no more)."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            with contextlib.suppress(OSError):
                os.write(self._stop_w, b"x")
        if threading.current_thread() is not self._thread:
            self._thread.join()
        with self.lock:
            for fd in (self._fd, self._stop_r, self._stop_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fd = self._stop_r = self._stop_w = -1


def _size(path: str) -> int:
    try:
        info = os.lstat(path)
    except OSError:
        return 0  # deleted (or moved away) since
    return info.st_size if stat.S_ISREG(info.st_mode) else 0


_KNOWN: OrderedDict[tuple[str, frozenset[str]], Sizes] = OrderedDict()
_KNOWN_LOCK = threading.Lock()


def sizes_of(root: str, exclude: frozenset[str]) -> Sizes:
    """The watcher of ``root`` (a real path) leaving out ``exclude``: the one this
    process has, or a new one (its first walk started in its thread: ``attach`` waits
    for it). The least recently used ones beyond ``KEPT`` that no command uses close."""
    key = (root, exclude)
    with _KNOWN_LOCK:
        sizes = _KNOWN.get(key)
        if sizes is not None and not sizes._closed:
            _KNOWN.move_to_end(key)
            sizes.used = time.monotonic()
            return sizes
        sizes = _KNOWN[key] = Sizes(root, exclude)
        evicted = [s for k, s in _KNOWN.items() if k != key and not s.busy()]
        evicted = evicted[: max(0, len(_KNOWN) - KEPT)]
        for old in evicted:
            del _KNOWN[(old.root, old.exclude)]
    for old in evicted:
        old.close()
    return sizes


def _forget_if_idle(sizes: Sizes) -> bool:
    with _KNOWN_LOCK:
        if not sizes.idle():
            return False
        if _KNOWN.get((sizes.root, sizes.exclude)) is sizes:
            del _KNOWN[(sizes.root, sizes.exclude)]
    sizes.close()
    return True


@atexit.register
def close_all() -> None:
    """Close every watcher of this process."""
    with _KNOWN_LOCK:
        known = list(_KNOWN.values())
        _KNOWN.clear()
    for sizes in known:
        sizes.close()


def _forget_in_child() -> None:
    # a forked child has the descriptors, not the threads: it starts afresh
    global _KNOWN_LOCK
    _KNOWN_LOCK = threading.Lock()
    for sizes in _KNOWN.values():
        for fd in (sizes._fd, sizes._stop_r, sizes._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
    _KNOWN.clear()


os.register_at_fork(after_in_child=_forget_in_child)

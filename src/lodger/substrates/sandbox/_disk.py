"""The disk limit: what one command writes into the workspace and its private ``/tmp``.

``Limits.disk_bytes`` is held three ways, each covering what the others cannot:

- ``RLIMIT_FSIZE`` (set by the trampoline, ``lodger.substrates.sandbox._process``): no
  file can grow past the limit, however fast it is written; the writer gets ``SIGXFSZ``
  (or ``EFBIG`` if it ignores the signal). It bounds one file, not their sum; and in a
  workspace that holds a file larger than the limit already, it is raised by that
  file's size (so the file can still be written), leaving the rest to the watcher.
- the private ``/tmp`` is a tmpfs of that size (``bwrap --size``): it fills up, it never
  grows past the limit.
- a count (``DiskWatch``) of the rest. The workspace's files and their sizes are kept by
  a watcher that outlives the command (``lodger.substrates.sandbox._sizes``: one per
  workspace in the process, walked once, then kept up to date by inotify, between
  commands too). A command's count starts from that map as it stands when the command
  starts (the events still queued read first), so preparing costs what changed since
  the last command, not a walk of the workspace; only the first command in a workspace
  (in this process, or after the watcher was closed: idle, or pushed out by others)
  waits for the walk. While the command runs, each change the watcher sees is counted:
  what a file holds beyond its size when the command started counts as written. With
  ``/tmp``'s usage added (a descriptor of it is opened through ``/proc/<pid>/root/tmp``
  of a process inside the sandbox as soon as it is mounted, and held to the end), once
  the total reaches the limit the whole tree is killed. After the command, a last count
  decides: a command that went past the limit and ended before the watcher caught it is
  still reported as stopped by it (``limit="disk"``).

What it does not cover: files are counted by their size (a sparse file counts whole,
an unchanged file moved or hard-linked in counts as new bytes, a file rewritten to the
size it had counts nothing); deleted files are not credited; a burst of many files each
under the limit can overshoot by what the writer manages between the watcher's wakeups
(a few milliseconds, more on a loaded machine); anything else writing the workspace
while the command runs (another tool call in parallel, the user) counts too, and
parallel commands in one workspace each count what all of them write (conservative);
what the host changed before the command started is not counted. With the gVisor
backend ``/tmp`` lives in the Sentry's memory (bounded by the memory limit and
``RLIMIT_FSIZE`` per file, not by ``disk_bytes`` as a whole). Where the workspace
cannot be watched (no inotify, or its watch limit reached) each command walks it when
it starts and every ``_sizes.RESCAN_S`` while it runs; events lost in an overflow make the
watcher walk it once to catch up.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from lodger.substrates.sandbox._sizes import Sizes, sizes_of

__all__ = ["DiskWatch", "warm"]

#: how often /tmp's usage is read (and the workspace walked, where it is not watched:
#: at most every ``_sizes.RESCAN_S``)
_POLL_S = 0.02


def warm(root: Path, *, exclude: Iterable[Path] = ()) -> None:
    """Start watching ``root`` now (its first walk in a thread, off the caller's path),
    so that the first command run there need not wait for all of it."""
    sizes_of(os.path.realpath(root), frozenset(os.path.realpath(p) for p in exclude))


class DiskWatch:
    """Counts the bytes one command writes under ``root`` (leaving out ``exclude``,
    absolute paths inside it) and in its sandbox's ``/tmp`` (with ``private_tmp``: a
    tmpfs of ``limit`` bytes, as bubblewrap mounts); calls ``kill`` once the
    count reaches ``limit``. ``prepare`` before the command starts (it attaches to the
    workspace's watcher: the sizes as they are now are the command's baseline), ``start``
    once it runs, ``finish`` after it ended.

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
        self.file_ceiling = limit
        #: the size of each file changed since the command started, as it was before
        self._before: dict[str, int] = {}
        self._grown: dict[str, int] = {}
        self._grown_total = 0
        self._tmp_used = 0
        self._sizes: Sizes | None = None
        self._pid = 0
        self._kill: Callable[[], None] = lambda: None
        self._stop_r, self._stop_w = -1, -1
        self._tmp_fd = -1
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- before the command --------------------------------------------------------

    def prepare(self) -> None:
        """Attach to the workspace's watcher (blocking: call it in a thread; the first
        time in a workspace it waits for the walk)."""
        root = os.path.realpath(self.root)
        while True:
            sizes = sizes_of(root, self.exclude)
            if sizes.attach(self):
                break  # else it was closed meanwhile (pushed out by another workspace)
        self._sizes = sizes
        if self._closed:  # closed meanwhile (its caller was cancelled): not counting
            sizes.detach(self)
        with sizes.lock:
            #: RLIMIT_FSIZE for the command: the limit, above the largest file there
            #: already (else a file larger than the limit could not even be appended to)
            self.file_ceiling = self.limit + sizes.largest()

    def changed(self, path: str, before: int, after: int) -> None:
        """A file's size changed (called by the watcher, under its lock)."""
        grown = max(0, after - self._before.setdefault(path, before))
        self._grown_total += grown - self._grown.get(path, 0)
        self._grown[path] = grown

    def recount(self) -> None:
        """Add up (under the watcher's lock); kill the command at the limit."""
        self.written = self._grown_total + self._tmp_used
        if self.written >= self.limit and not self.over:
            self.over = True
            self._kill()

    # -- while it runs ---------------------------------------------------------------

    def start(self, pid: int, kill: Callable[[], None]) -> None:
        """Watch the command whose outermost process is ``pid``; ``kill`` stops it."""
        with self._locked():
            self._pid, self._kill = pid, kill
            if self.over:  # others wrote that much since ``prepare``
                kill()
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="lodger-disk-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        walking = self._sizes is not None and self._sizes.walking
        if not self.private_tmp and not walking:
            return  # the watcher's thread counts the workspace: nothing to poll
        while not self.over:
            # until the sandbox's /tmp is found, look every millisecond: it must be held
            # before the command can fill it and end
            wait = _POLL_S if self._tmp_fd >= 0 or not self.private_tmp else 0.001
            ready, _, _ = select.select([self._stop_r], [], [], wait)
            self.look()
            if ready:
                return

    def look(self) -> None:
        """Count again what changed; kill the command when it reached the limit."""
        with self._locked():
            if self.private_tmp and self._tmp_fd < 0 and self._pid > 0:
                self._tmp_fd = _open_tmp(self._pid, self.limit)
            self._tmp_used = max(self._tmp_used, _used(self._tmp_fd))
            if self._sizes is not None:
                self._sizes.refresh(walk=self._sizes.walking)  # recounts
            else:
                self.recount()

    def _locked(self) -> contextlib.AbstractContextManager[object]:
        return self._sizes.lock if self._sizes is not None else contextlib.nullcontext()

    # -- after it ended --------------------------------------------------------------

    def finish(self) -> None:
        """Stop watching and count once more: what the command left decides whether it
        went past the limit (blocking: call it in a thread)."""
        if self._thread is not None:
            os.write(self._stop_w, b"x")
            self._thread.join()
        if self._sizes is not None:
            self._sizes.rescan_now()
        self.look()
        self.close()

    def close(self) -> None:
        self._closed = True
        if self._sizes is not None:
            self._sizes.detach(self)
        for fd in (self._stop_r, self._stop_w, self._tmp_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._stop_r = self._stop_w = self._tmp_fd = -1


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

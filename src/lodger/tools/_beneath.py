"""Walking a path beneath the workspace root one component at a time, through directory fds.

The kernel follows symlinks for whoever opens a path by name, so checking a path and then
opening it loses to anything that swaps a directory for a symlink in between (a
``renameat2(RENAME_EXCHANGE)`` loop wins that race within milliseconds). Here every
component is opened relative to the directory fd before it, with ``O_NOFOLLOW``:

- a directory is opened with ``O_DIRECTORY | O_NOFOLLOW`` and its fd becomes the next base,
  so a swap after that point changes names, never which directory the fd is;
- a symlink is read with ``readlink`` and its target walked the same way: from the root when
  it is absolute (and names a place inside the root), from where it sits when relative.
  ``..`` pops the walk's own stack of directory fds, so it never climbs above the root;
- a component that changes type between ``lstat`` and ``open`` is looked at again, a
  bounded number of times.

This is what ``openat2(RESOLVE_BENEATH)`` does in the kernel, written with calls Python has
(it has no ``openat2`` binding). Symlinks that stay inside the workspace keep working, and
the walk yields the canonical path (root plus real directory names) for leases.

Paths in ``hidden`` (lodger's state directory) are refused wherever the walk meets them,
by identity (device and inode) and by name.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

from lodger.errors import ToolCallError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
MAX_SYMLINKS = 40  # as the kernel's MAXSYMLINKS
# How often one component may change type under the walk before it gives up.
MAX_RACES = 100

OUTSIDE_HINT = "use a path relative to the workspace root"


def _is_within(path: PurePath, root: PurePath) -> bool:
    return path == root or path.is_relative_to(root)


def file_kind(mode: int) -> str:
    """A short name for what a mode describes, for messages: 'a FIFO', 'a socket'..."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def not_regular(rel: str, mode: int, action: str) -> ToolCallError:
    return ToolCallError(
        f"cannot {action} {rel!r}: it is {file_kind(mode)}, not a regular file",
        hint="the file tools only work on regular files; choose another path",
        code="not_regular_file",
    )


@dataclass(frozen=True)
class Hidden:
    """Paths no tool may see, by name and (where they exist) by device and inode."""

    paths: tuple[Path, ...]
    ids: frozenset[tuple[int, int]]

    @classmethod
    def of(cls, paths: Sequence[Path]) -> Hidden:
        ids: set[tuple[int, int]] = set()
        real: list[Path] = []
        for path in paths:
            real.append(Path(os.path.realpath(path)))
            try:
                st = os.stat(path)
            except OSError:
                continue  # not created yet: the name check still covers it
            ids.add((st.st_dev, st.st_ino))
        return cls(paths=tuple(real), ids=frozenset(ids))

    def match(self, path: PurePath, st: os.stat_result | tuple[int, int] | None) -> Path | None:
        """The hidden path that ``path`` is or lies in; ``st`` is its stat or (dev, inode)."""
        ident = (st.st_dev, st.st_ino) if isinstance(st, os.stat_result) else st
        if ident is not None and ident in self.ids:
            return Path(path)
        for hidden in self.paths:
            if _is_within(path, hidden):
                return hidden
        return None


def hidden_error(path: str, hidden: Path, root: Path) -> ToolCallError:
    shown = hidden.relative_to(root).as_posix() if _is_within(hidden, root) else str(hidden)
    return ToolCallError(
        f"path {path!r} is inside lodger's state directory {shown!r}; no tool may read or write it",
        hint="choose a path outside it; the session's log is not part of the workspace",
        code="path_hidden",
    )


class Walk:
    """Where a path leads beneath the root; holds open fds until ``close()``.

    ``fds`` and ``names`` are the directories walked into below the root, ``tail`` the
    names after the last of them: empty when the path is a directory, one name for a
    non-directory entry (``stat`` set) or a missing one (``stat`` None), more when
    directories are missing too.
    """

    def __init__(self, root: Path, root_fd: int, *, spellings: Sequence[str]) -> None:
        self.root = root
        self.root_fd = root_fd
        #: the root's absolute spellings an absolute symlink target may start with
        self.spellings = tuple(spellings)
        self.fds: list[int] = []
        self.names: list[str] = []
        self.tail: list[str] = []
        self.stat: os.stat_result | None = None

    # -- the result

    @property
    def dir_fd(self) -> int:
        """The fd of the last directory walked into: the one holding ``tail[0]``."""
        return self.fds[-1] if self.fds else self.root_fd

    @property
    def is_dir(self) -> bool:
        return not self.tail

    @property
    def exists(self) -> bool:
        return not self.tail or self.stat is not None

    @property
    def name(self) -> str:
        """The final entry's name inside ``dir_fd``; only when the path is not a directory."""
        assert len(self.tail) == 1, self.tail
        return self.tail[0]

    @property
    def path(self) -> Path:
        """The canonical path: the real root, the real directory names, then the tail."""
        return self.root.joinpath(*self.names, *self.tail)

    @property
    def rel(self) -> str:
        return self.path.relative_to(self.root).as_posix()

    # -- moving

    def push(self, fd: int, name: str) -> None:
        self.fds.append(fd)
        self.names.append(name)

    def pop(self) -> None:
        os.close(self.fds.pop())
        self.names.pop()

    def reset(self) -> None:
        while self.fds:
            self.pop()

    def close(self) -> None:
        """Close every fd; the names (``path``, ``rel``) stay readable."""
        for fd in (*self.fds, self.root_fd):
            os.close(fd)
        self.fds.clear()
        self.root_fd = -1

    def __enter__(self) -> Walk:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def make_parents(self, path: str) -> list[int]:
        """Create the missing directories of the tail; the fds whose entries changed.

        Each new directory is opened with ``O_NOFOLLOW`` right after ``mkdir``: if something
        put a symlink there in between, the write is refused instead of following it.
        """
        changed: list[int] = []
        while len(self.tail) > 1:
            name = self.tail[0]
            parent = self.dir_fd
            try:
                os.mkdir(name, 0o777, dir_fd=parent)
                changed.append(parent)
            except FileExistsError:
                pass
            try:
                fd = os.open(name, DIR_FLAGS, dir_fd=parent)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                    raise changing_error(path) from None
                raise
            self.push(fd, name)
            del self.tail[0]
        return changed


def changing_error(path: str) -> ToolCallError:
    return ToolCallError(
        f"path {path!r} kept changing while it was being opened",
        hint="something else is renaming files there; try again when it has settled",
        code="path_changing",
    )


def _outside(path: str, *, via_symlink: bool) -> ToolCallError:
    if via_symlink:
        return ToolCallError(
            f"path {path!r} leads outside the workspace through a symlink",
            hint="use a path whose target is inside the workspace root",
            code="path_outside",
        )
    return ToolCallError(
        f"path {path!r} is outside the workspace", hint=OUTSIDE_HINT, code="path_outside"
    )


def _components(text: str) -> list[str]:
    return [part for part in text.split("/") if part not in ("", ".")]


def _relative_part(path: str, roots: Sequence[str]) -> str | None:
    """``path`` relative to the first root it lies under (lexically), or None."""
    for spelling in (path, os.path.normpath(path)):
        for root in roots:
            if spelling == root:
                return ""
            if spelling.startswith(root.rstrip("/") + "/"):
                return spelling[len(root.rstrip("/")) + 1 :]
    return None


def walk(root: Path, path: str, *, hidden: Hidden, must_exist: bool) -> Walk:
    """Walk ``path`` beneath ``root`` and return where it leads (the caller closes it).

    ``path`` is relative to the root, or absolute and under the root's real path or the
    spelling it was given as.

    Raises ``ToolCallError`` for an empty path or a NUL byte, a path outside the root (by
    ``..``, an absolute path, or a symlink), one inside a hidden path, a file used as a
    directory, too many symlinks, or (with ``must_exist``) a path that does not exist.
    """
    if "\x00" in path:
        raise ToolCallError(
            f"path {path!r} contains a NUL byte",
            hint="pass a plain file name relative to the workspace root",
            code="invalid_path",
        )
    if path == "":
        raise ToolCallError(
            "path is empty",
            hint="use '.' for the workspace root or a path relative to it",
            code="invalid_path",
        )
    real_root = Path(os.path.realpath(root))
    roots = list(dict.fromkeys([str(real_root), os.path.abspath(root)]))
    if path.startswith("/"):
        inner = _relative_part(path, roots)
        if inner is None:
            raise _outside(path, via_symlink=False)
        path_rest = inner
    else:
        path_rest = path
    try:
        root_fd = os.open(real_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ToolCallError(
            f"the workspace root {str(root)!r} cannot be opened ({exc.strerror})",
            hint="the session's workspace is missing; ask the operator to restore it",
            code="workspace_missing",
        ) from None
    result = Walk(real_root, root_fd, spellings=roots)
    try:
        _walk_into(result, path, _components(path_rest), hidden=hidden)
        if must_exist and not result.exists:
            raise ToolCallError(
                f"path {path!r} does not exist",
                hint="check the name with list_files",
                code="path_not_found",
            )
    except BaseException:
        result.close()
        raise
    return result


def _walk_into(w: Walk, path: str, pending: list[str], *, hidden: Hidden) -> None:
    pending.reverse()  # a stack: the next component is at the end
    links = 0
    races = 0
    via_symlink = False
    missing: list[str] = []
    while pending:
        name = pending.pop()
        if name == "..":
            if missing:
                missing.pop()
            elif w.fds:
                w.pop()
            else:
                raise _outside(path, via_symlink=via_symlink)
            continue
        if missing:
            missing.append(name)
            continue
        parent = w.dir_fd
        st = _lstat(w, path, parent, name)
        if st is None:
            missing.append(name)
            continue
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                raise ToolCallError(
                    f"path {path!r} goes through too many levels of symbolic links",
                    hint="a symlink probably points at itself; choose another path",
                    code="path_loop",
                )
            try:
                target = os.readlink(name, dir_fd=parent)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOENT):
                    raise
                races = _raced(races, path, pending, name)  # no longer a symlink
                continue
            via_symlink = True
            if target.startswith("/"):
                inner = _relative_part(target, w.spellings)
                if inner is None:
                    raise _outside(path, via_symlink=True)
                w.reset()
                pending.extend(reversed(_components(inner)))
            else:
                pending.extend(reversed(_components(target)))
            continue
        if stat.S_ISDIR(st.st_mode):
            fd = _open_dir(w, path, parent, name)
            if fd is None:
                races = _raced(races, path, pending, name)  # swapped since the lstat
                continue
            w.push(fd, name)
            _refuse_hidden(hidden, w, path, os.fstat(fd))
            continue
        # Not a directory: it must be the last component.
        if pending:
            raise ToolCallError(
                f"cannot use {path!r}: {_rel(w, name)!r} is a file, not a directory",
                hint="choose another path",
                code="not_a_directory",
            )
        w.tail = [name]
        w.stat = st
        _refuse_hidden(hidden, w, path, st)
        return
    w.tail = missing
    _refuse_hidden(hidden, w, path, None)


def _lstat(w: Walk, path: str, parent: int, name: str) -> os.stat_result | None:
    """``name`` in the directory ``parent``, its symlink not followed; None if missing."""
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except PermissionError:
        raise _permission_denied(w, path, name) from None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise ToolCallError(f"path {path!r} has a name that is too long") from None
        raise


def _open_dir(w: Walk, path: str, parent: int, name: str) -> int | None:
    """An fd of the directory ``name`` in ``parent``, or None if it is no longer one."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
            return None
        if exc.errno == errno.EACCES:
            raise _permission_denied(w, path, name) from None
        raise


def _permission_denied(w: Walk, path: str, name: str) -> ToolCallError:
    return ToolCallError(
        f"cannot open {path!r}: permission denied at {_rel(w, name)!r}",
        code="permission_denied",
    )


def _refuse_hidden(hidden: Hidden, w: Walk, path: str, st: os.stat_result | None) -> None:
    found = hidden.match(w.path, st)
    if found is not None:
        raise hidden_error(path, found, w.root)


def _raced(races: int, path: str, pending: list[str], name: str) -> int:
    if races >= MAX_RACES:
        raise changing_error(path)
    pending.append(name)
    return races + 1


def _rel(w: Walk, name: str) -> str:
    return (w.path / name).relative_to(w.root).as_posix()


def open_regular(root: Path, path: str, *, hidden: Hidden, action: str) -> tuple[int, Walk]:
    """Open the regular file ``path`` leads to for reading: (fd, its closed walk).

    Directories, FIFOs, sockets and devices are refused with a ``ToolCallError`` before
    anything could block on them; the type is checked again on the open fd.
    """
    for _ in range(MAX_RACES):
        w = walk(root, path, hidden=hidden, must_exist=True)
        with w:
            if w.is_dir:
                raise ToolCallError(
                    f"{w.rel!r} is a directory", hint="use list_files to see what it holds"
                )
            assert w.stat is not None
            if not stat.S_ISREG(w.stat.st_mode):
                raise not_regular(w.rel, w.stat.st_mode, action)
            try:
                fd = os.open(w.name, FILE_FLAGS, dir_fd=w.dir_fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOENT):
                    continue  # swapped or removed since the walk looked: walk again
                if exc.errno == errno.ENXIO:  # a socket, or a FIFO put there meanwhile
                    raise not_regular(w.rel, stat.S_IFSOCK, action) from None
                if exc.errno == errno.EACCES:
                    raise ToolCallError(
                        f"cannot {action} {w.rel!r}: permission denied", code="permission_denied"
                    ) from None
                raise
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                raise not_regular(w.rel, st.st_mode, action)
            found = hidden.match(w.path, st)
            if found is not None:
                os.close(fd)
                raise hidden_error(path, found, w.root)
            return fd, w
    raise changing_error(path)

"""The workspace's ``.git`` inside a sandbox: read-only, so that no command can leave code
for the host's git to run (a hook, ``core.fsmonitor``, ``core.pager``, an alias...).
That covers the root's ``.git``, every submodule's (read from the gitlinks of the index,
nested ones too: the host's ``git status`` recurses into them), and, at a root without a
repository, ``HEAD``: the one name git needs beside ``objects/`` and ``refs/`` to read the
workspace itself as a bare repository.

What is protected and why is the policy's to say (``lodger.substrates.sandbox.policy``,
``git_writable``); this module finds what to bind read-only (``protected_git``) and holds
the placeholders that stand where no ``.git`` exists (``git_placeholder``). Both
backends use them the same way: hold the placeholder for the whole run, then bind every
path ``protected_git`` names read-only onto itself, after the workspace and before the
hidden paths' covers, and pin the directories between the workspace and a git directory
inside it (``bubblewrap.pinned_ancestors``) so none can be renamed away.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import os
import re
import stat
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from lodger.errors import ConfigError
from lodger.substrates.sandbox._process import made_in_thread

__all__ = [
    "GIT",
    "HEAD",
    "MAX_GITLINKS",
    "GitProtection",
    "git_placeholder",
    "placeholders",
    "protected_git",
]

GIT = ".git"
#: the name that makes a directory a (bare) repository to git, beside objects/ and refs/
HEAD = "HEAD"
#: gitlinks (submodules, nested ones included) protected at most; past it, refused
MAX_GITLINKS = 256
#: how deep nested submodules are followed
_MAX_DEPTH = 8
#: how many symlinks a path in a gitdir file may go through (the kernel's own limit)
_MAX_LINKS = 40
#: a gitdir file is one line; git itself refuses a large one
_MAX_GITFILE = 64 * 1024

_HINT = (
    "make the workspace's .git a directory, or a gitdir file (a worktree or submodule) "
    "naming its directory without a symlink in the workspace; or set "
    "[sandbox] git_writable = true to let commands write it"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class GitProtection:
    """What a sandbox binds read-only onto itself so that ``.git`` cannot be changed."""

    #: the root's ``.git`` (a directory, a gitdir file or the placeholder) and every git
    #: directory inside the workspace a gitdir file leads to
    read_only: tuple[str, ...] = ()
    #: the git directories inside the workspace (not ``.git`` itself): the directories
    #: between the workspace and each are pinned, so that none can be renamed away
    inner: tuple[Path, ...] = ()


def protected_git(workspace: Path) -> GitProtection:
    """What to bind read-only in ``workspace`` (a real path), and a ``ConfigError`` for a
    ``.git`` no mount can keep in place (a symlink, which a command could replace with a
    repository of its own; a socket...).

    - the root's ``.git``, and the git directories inside the workspace its gitdir file
      names;
    - with no repository at the root (no ``.git``, or the empty placeholder), ``HEAD``
      there: git reads a directory with a valid ``HEAD``, ``objects/`` and ``refs/`` as a
      bare repository, its ``config`` and all, so a command could make the workspace one;
      the placeholder (a directory) or the file of that name is held in place;
    - every submodule's ``.git`` (the gitlinks of the root's index, and of theirs): a
      command could replace it with a repository of its own, and the host's
      ``git status`` at the root recurses into it (``core.fsmonitor``). Where one is not
      checked out, the placeholder made where its path first goes missing.
    """
    root = workspace / GIT
    try:
        mode = root.lstat().st_mode
    except FileNotFoundError:
        return GitProtection(read_only=_bare_guard(workspace))
    if stat.S_ISDIR(mode):
        if not _is_repository(root):
            return GitProtection(read_only=(str(root), *_bare_guard(workspace)))
        found = _submodules(workspace, root, root)
        return GitProtection(
            read_only=tuple(dict.fromkeys([str(root), *found.read_only])),
            inner=tuple(dict.fromkeys(found.inner)),
        )
    if not stat.S_ISREG(mode):
        kind = "a symlink" if stat.S_ISLNK(mode) else "not a directory or a file"
        raise ConfigError(
            f"the workspace's .git ({root}) is {kind}, which a sandboxed command could "
            "replace with a repository of its own for the host's git to trust",
            hint=_HINT,
        )
    named = _named_directories(workspace, root)
    inner = [d for d in named if d.is_relative_to(workspace)]
    for directory in inner:
        if directory == workspace:
            raise ConfigError(
                f"the workspace's .git file names the workspace itself ({workspace}) as its "
                "git directory, which sandboxed commands must be able to write",
                hint=_HINT,
            )
        if not directory.is_dir():
            # A command could make it, and the host's git would then find a repository.
            raise ConfigError(
                f"the workspace's .git file names {directory}, inside the workspace, "
                "which is not a directory",
                hint=_HINT,
            )
    found = _submodules(workspace, named[0], None) if named else _Found()
    return GitProtection(
        read_only=tuple(dict.fromkeys([str(root), *map(str, inner), *found.read_only])),
        inner=tuple(dict.fromkeys([*inner, *found.inner])),
    )


def placeholders(workspace: Path) -> list[Path]:
    """Where a run that keeps ``.git`` read-only holds an empty directory for its length
    (``git_placeholder``): the root's ``.git`` and ``HEAD`` when the root has no
    repository, else where each submodule's path first goes missing."""
    root = workspace / GIT
    try:
        mode = root.lstat().st_mode
    except FileNotFoundError:
        return [root, workspace / HEAD]
    if stat.S_ISDIR(mode):
        if not _is_repository(root):
            return [root, workspace / HEAD]
        return _submodules(workspace, root, root).spots
    if stat.S_ISREG(mode):
        named = _named_directories(workspace, root)
        return _submodules(workspace, named[0], None).spots if named else []
    return []  # protected_git refuses it


def _is_repository(git: Path) -> bool:
    """Whether the directory ``git`` holds anything (the placeholder is empty)."""
    try:
        with os.scandir(git) as entries:
            return any(True for _ in entries)
    except OSError:
        return True


def _bare_guard(workspace: Path) -> tuple[str, ...]:
    """``HEAD`` at a root without a repository, held read-only where it exists."""
    head = workspace / HEAD
    try:
        mode = head.lstat().st_mode
    except FileNotFoundError:
        return ()
    if stat.S_ISLNK(mode):
        raise ConfigError(
            f"the workspace has no .git and its {HEAD} ({head}) is a symlink, which a "
            "sandboxed command could replace to make the workspace a bare repository "
            "for the host's git to read",
            hint=_HINT,
        )
    return (str(head),)


@dataclass(slots=True)
class _Found:
    read_only: list[str] = field(default_factory=list)
    inner: list[Path] = field(default_factory=list)
    #: where a placeholder must stand (a submodule's path, missing from here on)
    spots: list[Path] = field(default_factory=list)


def _submodules(workspace: Path, gitdir: Path, held: Path | None) -> _Found:
    """What keeps every submodule's ``.git`` in place: the gitlinks of ``gitdir``'s
    index, and of each submodule's in turn. ``held``: the root's ``.git`` directory,
    already read-only as a whole (the submodules' git directories lie in it)."""
    found = _Found()
    pending = [(workspace, gitdir, 0)]
    count = 0
    while pending:
        base, directory, depth = pending.pop()
        for name in _gitlinks(directory):
            count += 1
            if count > MAX_GITLINKS:
                raise ConfigError(
                    f"the workspace has more than {MAX_GITLINKS} submodules, more .git "
                    "than a sandbox keeps read-only",
                    hint=_HINT,
                )
            nested = _hold_submodule(workspace, base / name, held, found)
            if nested is not None and depth + 1 < _MAX_DEPTH:
                pending.append((base / name, nested, depth + 1))
    return found


def _hold_submodule(workspace: Path, path: Path, held: Path | None, found: _Found) -> Path | None:
    """Add what keeps ``path/.git`` in place to ``found``; its git directory, if any."""
    target = path / GIT
    current = workspace
    for part in target.relative_to(workspace).parts:
        step = current / part
        try:
            mode = step.lstat().st_mode
        except FileNotFoundError:
            # Not checked out: an empty read-only placeholder stands at ``step`` for the
            # run (``git_placeholder``); nothing then can be made beneath it.
            found.spots.append(step)
            if current != workspace:
                found.read_only.append(str(current))
                found.inner.append(current)
            return None
        if stat.S_ISLNK(mode):
            raise ConfigError(
                f"the path of the submodule {path.relative_to(workspace)} goes through "
                f"{step}, a symlink a sandboxed command could replace with a repository "
                "of its own for the host's git to enter",
                hint=_HINT,
            )
        if not stat.S_ISDIR(mode):
            found.read_only.append(str(step))  # a file where git looks: held in place
            found.inner.append(step)
            if step != target:
                return None
            named = _named_directories(workspace, step)
            inside = [
                d
                for d in named
                if d.is_relative_to(workspace) and not (held and d.is_relative_to(held))
            ]
            found.read_only += map(str, inside)
            found.inner += inside
            return named[0] if named else None
        current = step
    found.read_only.append(str(target))
    found.inner.append(target)
    return target


_OBJECT_FORMAT = re.compile(rb"^\s*objectformat\s*=\s*sha256\s*$", re.IGNORECASE | re.MULTILINE)
_GITLINK = 0o160000


def _gitlinks(gitdir: Path) -> list[str]:
    """The paths of the gitlinks (mode 160000) in ``gitdir``'s index, read here rather
    than by running git in a repository whose config a command may have shaped; index
    versions 2 to 4. Nothing for a missing or unreadable index."""
    try:
        data = (gitdir / "index").read_bytes()
    except OSError:
        return []
    if len(data) < 12 or data[:4] != b"DIRC":
        return []
    version, count = struct.unpack_from(">II", data, 4)
    if version not in (2, 3, 4):
        return []
    common = _pointer(gitdir / "commondir", prefix="")
    config = (gitdir / common if common else gitdir) / "config"
    try:
        size = 32 if _OBJECT_FORMAT.search(config.read_bytes()) else 20
    except OSError:
        size = 20
    try:
        names = _index_names(data, version, count, size)
    except (struct.error, ValueError, IndexError):
        return []  # damaged: git would refuse it too
    return list(dict.fromkeys(n for n, mode in names if mode & 0o170000 == _GITLINK and _safe(n)))


def _index_names(data: bytes, version: int, count: int, size: int) -> list[tuple[str, int]]:
    names: list[tuple[str, int]] = []
    position, previous = 12, b""
    for _ in range(count):
        start = position
        (mode,) = struct.unpack_from(">I", data, start + 24)
        (flags,) = struct.unpack_from(">H", data, start + 40 + size)
        position = start + 40 + size + 2 + (2 if version >= 3 and flags & 0x4000 else 0)
        if version == 4:
            strip, position = _varint(data, position)
            end = data.index(b"\0", position)
            name = previous[: len(previous) - strip] + data[position:end]
            position = end + 1
        else:
            end = data.index(b"\0", position)
            name = data[position:end]
            position = start + ((end - start + 8) & ~7)
        previous = name
        names.append((name.decode("utf-8", errors="surrogateescape"), mode))
    return names


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """git's offset varint (``decode_varint``) at ``position``; the value and what follows."""
    byte = data[position]
    position += 1
    value = byte & 0x7F
    while byte & 0x80:
        byte = data[position]
        position += 1
        value = ((value + 1) << 7) | (byte & 0x7F)
    return value, position


def _safe(name: str) -> bool:
    """A gitlink path git itself would accept: relative, no ``.``, ``..`` or ``.git``."""
    parts = name.split("/")
    return bool(name) and all(p not in ("", ".", "..") and p.lower() != GIT for p in parts)


def _named_directories(workspace: Path, gitfile: Path) -> list[Path]:
    """The git directory a gitdir file names (``gitdir: ../.git/modules/x``) and its
    common directory (a linked worktree's ``commondir``), as real paths."""
    gitdir = _pointer(gitfile, prefix="gitdir: ")
    if gitdir is None:
        return []  # not a gitdir file: git refuses it, and the command cannot change it
    real = _followed(workspace, gitfile.parent / gitdir)
    found = [real]
    common = _pointer(real / "commondir", prefix="")
    if common is not None:
        found.append(_followed(workspace, real / common))
    return found


def _pointer(path: Path, *, prefix: str) -> str | None:
    """The path a one-line pointer file holds, as git reads it; None when there is none."""
    try:
        with path.open("rb") as file:
            text = file.read(_MAX_GITFILE).decode("utf-8", errors="surrogateescape")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    text = text.rstrip()
    if not text.startswith(prefix) or len(text) == len(prefix):
        return None
    return text[len(prefix) :]


def _followed(workspace: Path, path: Path) -> Path:
    """The real path ``path`` (absolute) leads to, resolved one component at a time; a
    ``ConfigError`` when a symlink inside the workspace is on the way: a command could
    point it at a git directory of its own, and the host's git would follow it there."""
    pending = list(reversed(path.parts))
    current = Path("/")
    links = 0
    while pending:
        part = pending.pop()
        if part == "/":
            current = Path("/")
        elif part == "..":
            current = current.parent
        elif part not in ("", "."):
            step = current / part
            if not step.is_symlink():
                current = step
                continue
            if step.is_relative_to(workspace):
                raise ConfigError(
                    f"the workspace's .git file leads through {step}, a symlink inside the "
                    "workspace, which a sandboxed command could point elsewhere",
                    hint=_HINT,
                )
            links += 1
            if links > _MAX_LINKS:  # ELOOP
                raise ConfigError(f"the workspace's .git file leads into a symlink loop at {step}")
            pending.extend(reversed(Path(os.readlink(step)).parts))
    return current


@dataclass(frozen=True, slots=True)
class _Held:
    """The placeholder a run holds: a shared ``flock`` on its directory for as long as
    the run lasts, so that no other run removes it meanwhile."""

    path: Path
    fd: int


@contextlib.asynccontextmanager
async def git_placeholder(workspace: Path, *, writable: bool) -> AsyncIterator[None]:
    """An empty directory for the run at each of ``placeholders(workspace)`` (a real
    path): the root's ``.git`` and ``HEAD`` where it has no repository, a submodule's
    path where it is not checked out; ``protected_git`` then binds them read-only, and
    each is removed when the last run holding it ends. Nothing when ``writable``."""
    if writable:
        yield
        return
    held = await made_in_thread(functools.partial(_hold_all, workspace), undo=_released_all)
    try:
        yield
    finally:
        await asyncio.shield(_released_all(held))


def _hold_all(workspace: Path) -> list[_Held]:
    held: list[_Held] = []
    try:
        for spot in placeholders(workspace):
            one = _hold(spot)
            if one is not None:
                held.append(one)
    except BaseException:
        for one in reversed(held):
            _release(one)
        raise
    return held


async def _released_all(held: list[_Held]) -> None:
    for one in reversed(held):
        await _released(one)


def _hold(path: Path) -> _Held | None:
    """Make (or take) the empty placeholder and hold it; None where ``.git`` is something
    else (a repository, a gitdir file) or where nothing can be made (a read-only
    workspace: a command cannot make one either)."""
    for _ in range(100):
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass  # a repository, or the placeholder of a run still going (or one killed)
        except OSError as exc:
            # Nothing can be made: a read-only workspace (a command cannot either), or
            # the directory above it gone meanwhile (protected_git holds what is there).
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT):
                return None
            raise
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # removed by a run that just ended: make it again
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                return None  # a file or a symlink: protected_git decides
            raise
        try:
            if os.listdir(fd):
                os.close(fd)
                return None  # a repository: bound read-only as it is
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only for a run removing it right now
            if _same(path, fd):
                return _Held(path, fd)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed between the open and the lock: make it again
    raise OSError(errno.EAGAIN, f"could not hold a placeholder at {path}")


def _same(path: Path, fd: int) -> bool:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


async def _released(held: _Held | None) -> None:
    if held is not None:
        await asyncio.to_thread(_release, held)


def _release(held: _Held) -> None:
    """Remove the placeholder unless another run holds it too (then the last one does)."""
    try:
        fcntl.flock(held.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass
    else:
        try:
            if _same(held.path, held.fd):
                os.rmdir(held.path)
        except OSError as exc:
            # Someone on the host put something in it, or removed it: theirs now.
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
                raise
    finally:
        os.close(held.fd)

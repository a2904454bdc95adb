"""The workspace's ``.git`` inside a sandbox: read-only, so that no command can leave code
for the host's git to run (a hook, ``core.fsmonitor``, ``core.pager``, an alias...).

What is protected and why is the policy's to say (``lodger.substrates.sandbox.policy``,
``git_writable``); this module finds what to bind read-only (``protected_git``) and holds
the placeholder that stands where no ``.git`` exists (``git_placeholder``). Both
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
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from lodger.errors import ConfigError
from lodger.substrates.sandbox._process import made_in_thread

__all__ = ["GIT", "GitProtection", "git_placeholder", "protected_git"]

GIT = ".git"
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
    """What to bind read-only in ``workspace`` (a real path); nothing when it has no
    ``.git``, and a ``ConfigError`` for a ``.git`` no mount can keep in place (a symlink,
    which a command could replace with a repository of its own; a socket...)."""
    root = workspace / GIT
    try:
        mode = root.lstat().st_mode
    except FileNotFoundError:
        return GitProtection()
    if stat.S_ISDIR(mode):
        return GitProtection(read_only=(str(root),))
    if not stat.S_ISREG(mode):
        kind = "a symlink" if stat.S_ISLNK(mode) else "not a directory or a file"
        raise ConfigError(
            f"the workspace's .git ({root}) is {kind}, which a sandboxed command could "
            "replace with a repository of its own for the host's git to trust",
            hint=_HINT,
        )
    inner = [d for d in _named_directories(workspace, root) if d.is_relative_to(workspace)]
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
    return GitProtection(read_only=(str(root), *map(str, inner)), inner=tuple(inner))


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
    """Where ``workspace`` (a real path) has no ``.git``, an empty directory there for the
    run, which ``protected_git`` then binds read-only; removed when the last run holding
    it ends. Nothing when ``writable``, or when ``.git`` exists."""
    if writable:
        yield
        return
    held = await made_in_thread(functools.partial(_hold, workspace / GIT), undo=_released)
    try:
        yield
    finally:
        await asyncio.shield(_released(held))


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
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
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

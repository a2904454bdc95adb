"""The workspace: confining file tools to one directory, hashing files, naming the workspace.

Every path a model passes to a file tool is walked beneath the workspace root one
component at a time through directory fds (``lodger.tools._beneath``): relative paths are
taken from the root, absolute ones only when they point inside it, symlinks are followed
by the walk itself and only while they stay beneath the root, and lodger's state directory
(``ToolContext.hidden``) is refused wherever the walk meets it. Anything else is a
``ToolCallError`` the model can act on. Because the walk holds an fd for every directory
it went through, a directory swapped for a symlink between the check and the use changes
nothing: the file is opened (or written) relative to the fd the check saw.

>>> root = resolve_workspace_root(Path("."))
>>> resolve_in_workspace(root, "src/../README.md", must_exist=False) == root / "README.md"
True
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from lodger.errors import ToolCallError
from lodger.tools._beneath import Hidden, not_regular, open_regular, walk

__all__ = [
    "TRUSTED_BY_HOST",
    "open_in_workspace",
    "resolve_in_workspace",
    "resolve_workspace_root",
    "sha256_in_workspace",
    "sha256_of_file",
    "text_lines",
    "workspace_id",
    "workspace_relative",
]

#: files in the workspace root that lodger on the host reads as its own configuration (MCP
#: servers it starts, permissions it grants): read-only inside every sandbox, so that no
#: command can leave the next lodger started there instructions to run on the host, and
#: refused to the file tools. Only a regular file that exists can be protected in a
#: sandbox: a mount needs it (``lodger.substrates.sandbox.policy.protected_files``).
TRUSTED_BY_HOST = ("lodger.toml",)


def resolve_workspace_root(root: Path) -> Path:
    """The real (absolute, symlink-free) path of a workspace root, which must be a directory."""
    real = Path(os.path.realpath(root))
    if not real.is_dir():
        raise ToolCallError(
            f"the workspace root {str(root)!r} is not a directory",
            hint="the session's workspace is missing; ask the operator to restore it",
            code="workspace_missing",
        )
    return real


def resolve_in_workspace(
    root: Path, path: str, *, must_exist: bool, hidden: Sequence[Path] = ()
) -> Path:
    """The canonical path ``path`` leads to beneath ``root``: real root plus real names.

    Raises ``ToolCallError`` when the path is empty, contains a NUL byte, leads outside the
    workspace (absolute, ``..``, or through a symlink), lies in a ``hidden`` path, or when
    ``must_exist`` is set and nothing exists there. The result names the file for leases
    and messages; to open it, use ``open_in_workspace`` (a name can change after it is
    resolved, an fd cannot).
    """
    with walk(root, path, hidden=Hidden.of(hidden), must_exist=must_exist) as w:
        return w.path


@contextlib.contextmanager
def open_in_workspace(
    root: Path, path: str, *, hidden: Sequence[Path] = (), action: str = "read"
) -> Iterator[tuple[io.BufferedReader, str]]:
    """Open the regular file ``path`` leads to for reading: ``(binary file, relative name)``.

    Directories, FIFOs, sockets and devices are refused (``ToolCallError``) without
    blocking on them. ``action`` words the refusal: "cannot read 'x': it is a FIFO...".
    """
    fd, w = open_regular(root, path, hidden=Hidden.of(hidden), action=action)
    with os.fdopen(fd, "rb") as f:
        yield f, w.rel


@contextlib.contextmanager
def text_lines(raw: io.BufferedReader, *, errors: str = "strict") -> Iterator[io.TextIOWrapper]:
    """UTF-8 text over ``raw`` from its start, lines split as ``open(newline="")`` does.

    The wrapper is detached afterwards, so ``raw`` stays the one owner of the fd.
    """
    raw.seek(0)
    wrapper = io.TextIOWrapper(raw, encoding="utf-8", errors=errors, newline="")
    try:
        yield wrapper
    finally:
        wrapper.detach()


def sha256_in_workspace(root: Path, path: str, *, hidden: Sequence[Path] = ()) -> str | None:
    """The hex SHA-256 of the file ``path`` leads to, or None when nothing exists there."""
    try:
        with open_in_workspace(root, path, hidden=hidden, action="hash") as (f, _):
            return hashlib.file_digest(f, "sha256").hexdigest()
    except ToolCallError as exc:
        if exc.code == "path_not_found":
            return None
        raise


def workspace_relative(root: Path, resolved: Path) -> str:
    """The canonical, workspace-relative POSIX form of a path from ``resolve_in_workspace``.

    ``'.'`` is the root itself. Aliases (symlinks inside the workspace, ``a/../b``) map to
    one string, so it is usable as a resource key.
    """
    real_root = Path(os.path.realpath(root))
    return resolved.relative_to(real_root).as_posix()


def sha256_of_file(path: Path) -> str | None:
    """The hex SHA-256 of a regular file's bytes, or None when nothing exists at ``path``.

    For a path the operator gave; a model's path goes through ``sha256_in_workspace``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_regular(str(path), mode, "hash")
        return hashlib.file_digest(f, "sha256").hexdigest()


def workspace_id(root: Path) -> str:
    """A stable identity for a workspace: its real path plus the root's device and inode.

    Resume compares it with the id recorded when the session started: a directory that was
    deleted and recreated under the same name, or a different mount, gives another id.
    """
    real = os.path.realpath(root)
    st = os.stat(real)
    digest = hashlib.sha256()
    digest.update(b"lodger/workspace/v1\n")
    digest.update(os.fsencode(real))
    digest.update(f"\n{st.st_dev}\n{st.st_ino}".encode())
    return digest.hexdigest()

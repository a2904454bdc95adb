"""The workspace: confining file tools to one directory, hashing files, naming the workspace.

Every path a model passes to a file tool goes through ``resolve_in_workspace``. Relative
paths are taken from the workspace root; absolute paths are accepted only when they point
inside it. The path is resolved the way the kernel would follow it (symlinks, including
dangling ones and intermediate directories, and ``..``), and the result must lie under the
real path of the root. Anything else is a ``ToolCallError`` the model can act on.

>>> root = resolve_workspace_root(Path("."))
>>> resolve_in_workspace(root, "src/../README.md", must_exist=False) == root / "README.md"
True

Resolution and use are two steps, so a process that swaps a directory for a symlink in
between can still win the race; the sandbox (DESIGN section 8) is the boundary that holds
against a hostile process, this module keeps an honest model inside the workspace.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePath

from lodger.errors import ToolCallError

__all__ = [
    "resolve_in_workspace",
    "resolve_workspace_root",
    "sha256_of_file",
    "workspace_id",
    "workspace_relative",
]

_OUTSIDE_HINT = "use a path relative to the workspace root"


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


def _is_within(path: PurePath, root: PurePath) -> bool:
    return path == root or path.is_relative_to(root)


def resolve_in_workspace(root: Path, path: str, *, must_exist: bool) -> Path:
    """Resolve ``path`` (relative to ``root``, or absolute inside it) to a real path inside root.

    Raises ``ToolCallError`` when the path is empty, contains a NUL byte, leads outside the
    workspace (absolute, ``..``, or through a symlink), or when ``must_exist`` is set and
    nothing exists there.
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
    given_root = Path(os.path.abspath(root))
    # The lexical form only decides which message to give: '..' and foreign absolute paths
    # are "outside", an inside-looking path that resolves elsewhere went through a symlink.
    lexical = Path(os.path.normpath(os.path.join(real_root, path)))
    lexically_inside = _is_within(lexical, real_root) or _is_within(lexical, given_root)
    # realpath (non-strict) follows every symlink that exists, dangling ones included, and
    # keeps the not-yet-existing tail as written: the nearest existing ancestor decides.
    resolved = Path(os.path.realpath(os.path.join(real_root, path)))
    if not lexically_inside:
        raise ToolCallError(
            f"path {path!r} is outside the workspace", hint=_OUTSIDE_HINT, code="path_outside"
        )
    if not _is_within(resolved, real_root):
        raise ToolCallError(
            f"path {path!r} leads outside the workspace through a symlink",
            hint="use a path whose target is inside the workspace root",
            code="path_outside",
        )
    if must_exist and not os.path.lexists(resolved):
        raise ToolCallError(
            f"path {path!r} does not exist",
            hint="check the name with list_files",
            code="path_not_found",
        )
    return resolved


def workspace_relative(root: Path, resolved: Path) -> str:
    """The canonical, workspace-relative POSIX form of a path from ``resolve_in_workspace``.

    ``'.'`` is the root itself. Aliases (symlinks inside the workspace, ``a/../b``) map to
    one string, so it is usable as a resource key.
    """
    real_root = Path(os.path.realpath(root))
    return resolved.relative_to(real_root).as_posix()


def sha256_of_file(path: Path) -> str | None:
    """The hex SHA-256 of a file's bytes, or None when nothing exists at ``path``."""
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return None


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

"""What ``.gitignore`` hides from listing and grepping, read through directory fds.

Rules come in layers, as in git: ``.git/info/exclude`` and the root's ``.gitignore``, then
each directory's own ``.gitignore`` for the paths below it; within and across layers the
last pattern that matches decides, and ``!pattern`` re-includes. ``.git`` itself is always
ignored. A directory that is ignored is not descended into, so (as in git) nothing below it
can be re-included. Like git (since 2.32), a ``.gitignore`` that is a symlink is not read.
Global excludes (``core.excludesFile``) and ``.gitignore`` files above the workspace are
not consulted: the tools never read outside the workspace.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lodger.tools._beneath import DIR_FLAGS, FILE_FLAGS

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

__all__ = ["IgnoreRules"]

# A .gitignore larger than this is not read (a generated file, not a list of patterns).
_MAX_IGNORE_BYTES = 1024 * 1024


def _compile(lines: list[str]) -> GitIgnoreSpec | None:
    if not any(line.strip() for line in lines):
        return None
    # imported on first use: a command that never lists or greps skips 9 ms of imports
    from pathspec import GitIgnoreSpec

    with contextlib.suppress(ValueError):
        return GitIgnoreSpec.from_lines(lines)
    kept: list[str] = []
    for line in lines:
        try:
            GitIgnoreSpec.from_lines([line])
        except ValueError:
            continue  # git skips a pattern it cannot use; so do we
        kept.append(line)
    return GitIgnoreSpec.from_lines(kept) if any(k.strip() for k in kept) else None


def _read_patterns(dir_fd: int, name: str) -> GitIgnoreSpec | None:
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.EACCES, errno.ENXIO, errno.ENOTDIR):
            return None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = f.read(_MAX_IGNORE_BYTES + 1)
    if len(data) > _MAX_IGNORE_BYTES:
        return None
    return _compile(data.decode("utf-8", errors="replace").splitlines())


def _read_info_exclude(root_fd: int) -> GitIgnoreSpec | None:
    fds: list[int] = []
    try:
        parent = root_fd
        for name in (".git", "info"):
            try:
                parent = os.open(name, DIR_FLAGS, dir_fd=parent)
            except OSError:
                return None  # no repository here, or .git is a file (a worktree)
            fds.append(parent)
        return _read_patterns(parent, "exclude")
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True)
class IgnoreRules:
    """The ignore patterns in force in one directory, as (directory prefix, spec) layers."""

    layers: tuple[tuple[str, GitIgnoreSpec], ...] = ()

    @classmethod
    def at_root(cls, root_fd: int) -> IgnoreRules:
        """The rules for the workspace root: ``.git/info/exclude``, then ``.gitignore``."""
        rules = cls()
        exclude = _read_info_exclude(root_fd)
        if exclude is not None:
            rules = IgnoreRules((("", exclude),))
        return rules.below(root_fd, "")

    def below(self, dir_fd: int, prefix: str) -> IgnoreRules:
        """These rules plus the ``.gitignore`` of the directory ``dir_fd`` (at ``prefix``)."""
        spec = _read_patterns(dir_fd, ".gitignore")
        if spec is None:
            return self
        return IgnoreRules((*self.layers, (prefix, spec)))

    def ignored(self, rel: str, *, is_dir: bool) -> bool:
        """Whether the workspace-relative ``rel`` is ignored (its parents are not)."""
        if rel.rsplit("/", 1)[-1] == ".git":
            return True
        verdict: bool | None = None
        subject = rel + "/" if is_dir else rel
        for prefix, spec in self.layers:
            if not subject.startswith(prefix):
                continue
            result = spec.check_file(subject[len(prefix) :])
            if result.include is not None:
                verdict = result.include
        return bool(verdict)

"""The file tools: read, write and edit, confined to the workspace.

Every path is walked beneath the workspace root through directory fds
(``lodger.tools._beneath``), and files are read and written relative to the fd of their
directory, so no path, ``..`` or symlink leads a file tool out of the workspace, not even
one swapped between check and use, and lodger's state directory is out of reach (DESIGN
section 8). Only regular files are read or replaced: a FIFO, a socket or a device is
refused before anything could block on it. Every mistake a model can fix (a bad path, no
match, a binary file) is a ``ToolCallError`` whose message says what to do instead.

The writing tools are ``queryable`` (DESIGN section 5): before dispatch their
``expectations`` hook records the file's hash before and the hash it will have after; after
a crash their probe re-hashes the file to tell whether the write happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from lodger._core.text import is_valid_utf8, visible_text
from lodger.authority.common import ClaimMode, ClaimScope, ResourceClaim
from lodger.errors import ToolCallError
from lodger.events import FileExpectation, ToolDispatched
from lodger.tools._beneath import Hidden, Walk, not_regular, walk
from lodger.tools.spec import ProbeResult, Tool, ToolContext, tool
from lodger.tools.workspace import (
    TRUSTED_BY_HOST,
    open_in_workspace,
    resolve_workspace_root,
    sha256_in_workspace,
    text_lines,
)

__all__ = ["edit_file", "read_file", "write_file", "writing_tools"]

READ_MAX_LINE_CHARS = 2000
READ_MAX_CHARS = 100_000

_SNIFF_BYTES = 8192
GIT = ".git"


# ---------------------------------------------------------------- shared helpers

# OS errors a model can fix by choosing another path; anything else is the world's failure
# and propagates as it is.
_MODEL_ERRNOS: dict[int, str] = {
    errno.ENOENT: "it does not exist",
    errno.EISDIR: "it is a directory",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EEXIST: "something else already exists there",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ELOOP: "too many levels of symbolic links",
    errno.ENAMETOOLONG: "the name is too long",
}


@contextlib.contextmanager
def _os_errors_for_model(action: str, rel: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        reason = _MODEL_ERRNOS.get(exc.errno or 0)
        if reason is None:
            raise
        raise ToolCallError(f"cannot {action} {rel!r}: {reason}") from exc


def _str_arg(arguments: dict[str, Any], key: str) -> str:
    value = arguments.get(key)
    if not isinstance(value, str):
        raise ToolCallError(f"argument {key!r} must be a string")
    return value


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _looks_binary(head: bytes) -> bool:
    return b"\x00" in head


def _read_text(root: Path, path: str, hidden: Sequence[Path]) -> tuple[str, str]:
    """The UTF-8 text of a file and its workspace-relative name; refuses anything else."""
    with (
        open_in_workspace(root, path, hidden=hidden, action="edit") as (f, rel),
        _os_errors_for_model("read", rel),
    ):
        data = f.read()
    if _looks_binary(data[:_SNIFF_BYTES]):
        raise ToolCallError(
            f"{rel!r} is a binary file ({len(data)} bytes) and cannot be edited as text",
            hint="use shell if you must change it",
        )
    try:
        return data.decode("utf-8"), rel
    except UnicodeDecodeError:
        raise ToolCallError(
            f"{rel!r} is not UTF-8 text", hint="use shell if you must change it"
        ) from None


def _write_atomically(
    root: Path, path: str, data: bytes, hidden: Sequence[Path], *, git_writable: bool
) -> bool:
    """Replace the file ``path`` leads to with ``data``; whether something was replaced.

    A temp file is created in the final directory's fd, synced, and renamed over the name
    within that same fd, so a reader (or a crash) sees the old content or the new, never a
    mix, and a directory swapped for a symlink meanwhile cannot redirect the write. An
    existing file keeps its permission bits; a new one gets the usual ``0o666 & ~umask``.
    """
    with walk(root, path, hidden=Hidden.of(hidden), must_exist=False) as w:
        _check_writable(w.is_dir, w.stat, w.rel)
        _check_not_configuration(w)
        if not git_writable:
            _check_not_git(w)
        with _os_errors_for_model("write", w.rel):
            changed = w.make_parents(path)
            directory, name = w.dir_fd, w.name
            try:
                current = os.stat(name, dir_fd=directory, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            mode = (
                stat.S_IMODE(current.st_mode)
                if current is not None and stat.S_ISREG(current.st_mode)
                else None
            )
            temp = f".lodger-{secrets.token_hex(8)}.tmp"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temp, flags, 0o666, dir_fd=directory)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    if mode is not None:
                        os.fchmod(f.fileno(), mode)
                    os.fsync(f.fileno())
                os.rename(temp, name, src_dir_fd=directory, dst_dir_fd=directory)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp, dir_fd=directory)
                raise
            # The rename and any new directories are durable once their directories are.
            os.fsync(directory)
            for parent in changed:
                os.fsync(parent)
    return current is not None


def _check_not_configuration(w: Walk) -> None:
    """A ``ToolCallError`` when ``w`` leads to lodger's own configuration in the workspace
    root (``TRUSTED_BY_HOST``: lodger.toml), or to the file a symlink of that name points
    at. The next lodger started there trusts it (the MCP servers it runs on the host, the
    permissions it grants), so a model must not be able to write it, here or in a sandbox
    (``lodger.substrates.sandbox.policy.protected_files``)."""
    for name in TRUSTED_BY_HOST:
        spelled = w.root / name
        targets = {spelled, Path(os.path.realpath(spelled))}
        if w.path in targets:
            raise ToolCallError(
                f"{w.rel!r} is lodger's own configuration, which tools may not change",
                hint=f"tell the user what to change in {name}; they edit it themselves",
            )


def _check_not_git(w: Walk) -> None:
    """A ``ToolCallError`` when ``w`` leads into a git directory: any ``.git`` on the way
    (the root's, a submodule's, one a write would make; in any letter case, as a
    case-insensitive file system reads it), the directory the root's ``.git`` file names
    (a linked worktree's), or ``HEAD`` at a root without ``.git``, which with ``objects``
    and ``refs`` makes the root a bare repository. The host's git runs what it finds
    there (a hook, ``core.fsmonitor``, ``core.pager``), so, as in the sandbox, only
    ``[sandbox] git_writable = true`` lets a tool write it."""
    names = [*w.names, *w.tail]
    inside = any(name.lower() == GIT for name in names)
    if not inside and len(names) == 1 and names[0].upper() == "HEAD":
        inside = not _has_repository(w.root)
    if not inside:
        inside = any(w.path.is_relative_to(d) for d in _named_git_directories(w.root))
    if inside:
        raise ToolCallError(
            f"{w.rel!r} is in a git repository's own directory, which tools may not change: "
            "the host's git runs what is there (hooks, core.fsmonitor, core.pager)",
            hint="change the working files and tell the user what to commit; to let tools "
            "and commands write .git, the user sets [sandbox] git_writable = true",
        )


def _has_repository(root: Path) -> bool:
    """Whether ``root`` has a ``.git`` of its own (not an empty directory: the sandbox's
    placeholder is one), which git finds before it would read the root as bare."""
    git = root / GIT
    try:
        if not stat.S_ISDIR(git.lstat().st_mode):
            return True  # a gitdir file (or what git refuses): not read as bare either way
        return any(git.iterdir())
    except FileNotFoundError:
        return False
    except OSError:
        return True


def _named_git_directories(root: Path) -> list[Path]:
    """The git directory the root's ``.git`` file names (``gitdir: ...``), where it lies
    inside the root under another name than ``.git``, and its common directory."""
    found: list[Path] = []
    pointer, prefix = root / GIT, "gitdir: "
    for _ in range(2):
        try:
            with pointer.open("rb") as file:
                text = file.read(64 * 1024).decode("utf-8", errors="surrogateescape").strip()
        except OSError:  # none, a directory, unreadable: nothing named
            break
        if not text.startswith(prefix) or len(text) == len(prefix):
            break
        named = Path(os.path.realpath(pointer.parent / text[len(prefix) :]))
        if not named.is_relative_to(root) or named == root:
            break
        found.append(named)
        pointer, prefix = named / "commondir", ""
    return found


def _check_writable(is_dir: bool, st: os.stat_result | None, rel: str) -> None:
    if is_dir:
        raise ToolCallError(f"{rel!r} is a directory", hint="choose a file path inside it")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise not_regular(rel, st.st_mode, "write")


# ---------------------------------------------------------------- write planning


@dataclass(frozen=True, kw_only=True)
class _PlannedWrite:
    path: str  # as the model gave it
    rel: str
    after: bytes


def _plan_write(root: Path, path: str, content: str, hidden: Sequence[Path]) -> _PlannedWrite:
    with walk(root, path, hidden=Hidden.of(hidden), must_exist=False) as w:
        _check_writable(w.is_dir, w.stat, w.rel)
        return _PlannedWrite(path=path, rel=w.rel, after=content.encode("utf-8"))


def _count_occurrences(text: str, needle: str) -> int:
    # Overlapping matches count too: "aa" in "aaa" is ambiguous, so it must be refused.
    count, start = 0, text.find(needle)
    while start != -1:
        count += 1
        start = text.find(needle, start + 1)
    return count


def _plan_edit(
    root: Path, path: str, old_string: str, new_string: str, hidden: Sequence[Path]
) -> _PlannedWrite:
    if old_string == "":
        raise ToolCallError(
            "old_string is empty", hint="to create a file or replace all of it use write_file"
        )
    if old_string == new_string:
        raise ToolCallError("old_string and new_string are identical; there is nothing to change")
    text, rel = _read_text(root, path, hidden)
    count = _count_occurrences(text, old_string)
    if count == 0:
        raise ToolCallError(
            f"old_string was not found in {rel!r}",
            hint="read the file first and copy the exact text, whitespace and indentation included",
        )
    if count > 1:
        raise ToolCallError(
            f"old_string matches {count} times in {rel!r} but must match exactly once",
            hint="include more surrounding lines in old_string to make it unique",
        )
    return _PlannedWrite(
        path=path, rel=rel, after=text.replace(old_string, new_string, 1).encode("utf-8")
    )


def _expect(root: Path, plan: _PlannedWrite, hidden: Sequence[Path]) -> list[FileExpectation]:
    if not is_valid_utf8(plan.rel):
        # T1 records the path so a probe can find the file after a crash; the log holds
        # UTF-8 only, and an escaped name would lead the probe to another file.
        raise ToolCallError(
            f"cannot write {visible_text(plan.rel)!r}: its path is not valid UTF-8, so "
            "lodger cannot record the write for crash recovery",
            hint="write to a path whose names are UTF-8, or rename it with shell first",
        )
    return [
        FileExpectation(
            path=plan.rel,
            before_sha256=sha256_in_workspace(root, plan.path, hidden=hidden),
            after_sha256=_sha256(plan.after),
        )
    ]


async def _write_expectations(
    arguments: dict[str, Any], ctx: ToolContext
) -> Sequence[FileExpectation]:
    root = ctx.require_workspace()
    path, content = _str_arg(arguments, "path"), _str_arg(arguments, "content")
    hidden = ctx.hidden
    return await asyncio.to_thread(
        lambda: _expect(root, _plan_write(root, path, content, hidden), hidden)
    )


async def _edit_expectations(
    arguments: dict[str, Any], ctx: ToolContext
) -> Sequence[FileExpectation]:
    root = ctx.require_workspace()
    path = _str_arg(arguments, "path")
    old, new = _str_arg(arguments, "old_string"), _str_arg(arguments, "new_string")
    hidden = ctx.hidden
    return await asyncio.to_thread(
        lambda: _expect(root, _plan_edit(root, path, old, new, hidden), hidden)
    )


def _observe(root: Path, dispatched: ToolDispatched, hidden: Sequence[Path]) -> ProbeResult:
    if not dispatched.expectations:
        return ProbeResult(applied=None, observation="no file expectation was recorded at dispatch")
    verdicts: list[bool | None] = []
    notes: list[str] = []
    for expected in dispatched.expectations:
        try:
            current = sha256_in_workspace(root, expected.path, hidden=hidden)
        except (ToolCallError, OSError) as exc:
            verdicts.append(None)
            notes.append(f"{expected.path!r} cannot be hashed ({exc})")
            continue
        if current == expected.after_sha256:
            verdicts.append(True)
            notes.append(f"{expected.path!r} has the content expected after the write")
        elif current == expected.before_sha256:
            verdicts.append(False)
            state = "is still absent" if current is None else "still has its content from before"
            notes.append(f"{expected.path!r} {state}")
        else:
            verdicts.append(None)
            now = "is absent" if current is None else f"has other content (sha256 {current})"
            notes.append(f"{expected.path!r} {now}: neither before nor after the write")
    applied: bool | None = None
    if all(v is True for v in verdicts):
        applied = True
    elif all(v is False for v in verdicts):
        applied = False
    paths = ", ".join(repr(e.path) for e in dispatched.expectations)
    content = (
        f"{dispatched.tool} on {paths} took effect (its content hash was checked after a crash)"
        if applied
        else ""
    )
    return ProbeResult(applied=applied, observation="; ".join(notes), content=content)


async def _probe_file_expectations(dispatched: ToolDispatched, ctx: ToolContext) -> ProbeResult:
    """Re-hash the files a write expected to change: after -> applied, before -> not applied."""
    root = ctx.require_workspace()
    return await asyncio.to_thread(_observe, root, dispatched, ctx.hidden)


# ---------------------------------------------------------------- claims


def _path_claims(
    arguments: dict[str, Any], ctx: ToolContext, mode: ClaimMode, *, git_writable: bool = False
) -> list[ResourceClaim]:
    """A lease on the path's real identity: the file itself, or a directory's whole subtree."""
    root = ctx.require_workspace()
    path = arguments.get("path", ".")
    if not isinstance(path, str):
        raise ToolCallError("argument 'path' must be a string")
    with walk(root, path, hidden=Hidden.of(ctx.hidden), must_exist=False) as w:
        if mode == "write":  # refused before anything is committed or asked
            _check_not_configuration(w)
            if not git_writable:
                _check_not_git(w)
        scope: ClaimScope = "subtree" if w.is_dir else "exact"
        return [ResourceClaim.file(w.path, mode=mode, scope=scope, root=root)]


def _read_claims(arguments: dict[str, Any], ctx: ToolContext) -> Sequence[ResourceClaim]:
    return _path_claims(arguments, ctx, "read")


def _write_claims(arguments: dict[str, Any], ctx: ToolContext) -> Sequence[ResourceClaim]:
    return _path_claims(arguments, ctx, "write")


def _write_claims_with_git(arguments: dict[str, Any], ctx: ToolContext) -> Sequence[ResourceClaim]:
    return _path_claims(arguments, ctx, "write", git_writable=True)


def _workspace_claims(arguments: dict[str, Any], ctx: ToolContext) -> Sequence[ResourceClaim]:
    """A command may touch anything in the workspace: a write lease on the whole subtree."""
    root = resolve_workspace_root(ctx.require_workspace())
    return [ResourceClaim.file(root, mode="write", scope="subtree", root=root)]


# ---------------------------------------------------------------- read, write, edit

_PathArg = Annotated[str, Field(description="file path relative to the workspace root")]


@tool(group="files", recovery="idempotent", nestable=True, claims=_read_claims)
def read_file(
    ctx: ToolContext,
    path: _PathArg,
    offset: Annotated[int, Field(ge=1, description="first line to show (1-based)")] = 1,
    limit: Annotated[int, Field(ge=1, description="how many lines to show at most")] = 2000,
) -> str:
    """Read a text file from the workspace, with line numbers (like `cat -n`).

    Shows `limit` lines from line `offset`; a note at the end says when there is more and
    which offset to continue from. Very long lines are cut. Binary files are refused.
    """
    # A code cell (a nested call) gets the lines themselves, no numbers and no note, so it
    # can parse what it read; what would be cut is an error instead (see _read_for_cell).
    nested = ctx.parent_call_id is not None
    root = ctx.require_workspace()
    shown: list[str] = []
    used = 0
    total = 0
    stopped_at: int | None = None  # first line not shown because of the size budget
    with (
        open_in_workspace(root, path, hidden=ctx.hidden) as (raw, rel),
        _os_errors_for_model("read", rel),
    ):
        head = raw.read(_SNIFF_BYTES)
        if _looks_binary(head):
            size = os.fstat(raw.fileno()).st_size
            raise ToolCallError(
                f"{rel!r} is a binary file ({size} bytes); read_file shows text",
                hint="use shell (for example `file` or `xxd | head`) to inspect it",
            )
        try:
            with text_lines(raw) as lines:
                for number, line in enumerate(lines, start=1):
                    total = number
                    if number < offset or stopped_at is not None or number >= offset + limit:
                        continue
                    text = line.rstrip("\r\n")
                    if len(text) > READ_MAX_LINE_CHARS:
                        cut = len(text) - READ_MAX_LINE_CHARS
                        if nested:
                            raise _too_large_for_cell(
                                rel, f"line {number} is {len(text)} characters"
                            )
                        text = f"{text[:READ_MAX_LINE_CHARS]} [line cut: {cut} more characters]"
                    rendered = text if nested else f"{number:6}\t{text}"
                    if shown and used + len(rendered) > READ_MAX_CHARS:
                        stopped_at = number
                        continue
                    shown.append(rendered)
                    used += len(rendered) + 1
        except UnicodeDecodeError:
            raise ToolCallError(
                f"{rel!r} is not UTF-8 text", hint="use shell (for example `iconv`) to read it"
            ) from None
    if total == 0:
        return "" if nested else f"[{rel!r} is empty]"
    if offset > total:
        raise ToolCallError(
            f"offset {offset} is past the end of {rel!r}, which has {total} lines",
            hint=f"use an offset between 1 and {total}",
        )
    last = offset + len(shown) - 1
    if nested:
        if stopped_at is not None:
            raise _too_large_for_cell(
                rel, f"lines {offset}-{stopped_at} pass {READ_MAX_CHARS} characters"
            )
        return "\n".join(shown)  # the window asked for (offset and limit), as it is
    if stopped_at is not None or last < total:
        why = " (output size limit reached)" if stopped_at is not None else ""
        shown.append(
            f"[showing lines {offset}-{last} of {total}{why}; continue with offset={last + 1}]"
        )
    return "\n".join(shown)


def _too_large_for_cell(rel: str, why: str) -> ToolCallError:
    """A code cell's read that would have to be cut: an error, never part of a file."""
    return ToolCallError(
        f"{rel!r} is too large for one read_file in a code cell ({why})",
        hint="read it in windows with offset and limit, or use shell",
    )


def writing_tools(*, git_writable: bool) -> tuple[Tool, Tool]:
    """``write_file`` and ``edit_file``; with ``git_writable`` they may write a git
    directory too (``[sandbox] git_writable = true``: the policy that lets commands)."""

    @tool(
        group="files",
        recovery="queryable",
        probe=_probe_file_expectations,
        expectations=_write_expectations,
        claims=_write_claims_with_git if git_writable else _write_claims,
    )
    def write_file(
        ctx: ToolContext,
        path: _PathArg,
        content: Annotated[str, Field(description="the complete new content of the file")],
    ) -> str:
        """Create a file or replace its whole content; missing parent directories are created.

        The write is atomic: the file has either its old content or the new one, never a mix.
        To change part of an existing file, use edit_file.
        """
        root = ctx.require_workspace()
        plan = _plan_write(root, path, content, ctx.hidden)
        existed = _write_atomically(root, path, plan.after, ctx.hidden, git_writable=git_writable)
        verb = "replaced" if existed else "created"
        return f"{verb} {plan.rel!r} ({len(plan.after)} bytes)"

    @tool(
        group="files",
        recovery="queryable",
        probe=_probe_file_expectations,
        expectations=_edit_expectations,
        claims=_write_claims_with_git if git_writable else _write_claims,
    )
    def edit_file(
        ctx: ToolContext,
        path: _PathArg,
        old_string: Annotated[
            str, Field(description="exact text to replace; must occur exactly once in the file")
        ],
        new_string: Annotated[str, Field(description="the text to put in its place")],
    ) -> str:
        """Replace one exact occurrence of `old_string` in a file with `new_string`.

        `old_string` must match the file exactly (whitespace and indentation included) and
        occur exactly once; add surrounding lines to make it unique. Read the file first.
        """
        root = ctx.require_workspace()
        plan = _plan_edit(root, path, old_string, new_string, ctx.hidden)
        _write_atomically(root, path, plan.after, ctx.hidden, git_writable=git_writable)
        return f"edited {plan.rel!r}: replaced 1 occurrence"

    return write_file, edit_file


write_file, edit_file = writing_tools(git_writable=False)

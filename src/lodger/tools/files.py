"""The file tools: read, write and edit, confined to the workspace.

Every path goes through ``lodger.tools.workspace.resolve_in_workspace``, so no path, ``..``
or symlink leads a file tool out of the workspace (DESIGN section 8). Every mistake a model
can fix (a bad path, no match, a binary file) is a ``ToolCallError`` whose message says
what to do instead.

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

from lodger._text import is_valid_utf8, visible_text
from lodger.authority.common import ClaimMode, ClaimScope, ResourceClaim
from lodger.errors import ToolCallError
from lodger.events import FileExpectation, ToolDispatched
from lodger.tools.spec import ProbeResult, ToolContext, tool
from lodger.tools.workspace import (
    resolve_in_workspace,
    resolve_workspace_root,
    sha256_of_file,
    workspace_relative,
)

__all__ = ["edit_file", "read_file", "write_file"]

READ_MAX_LINE_CHARS = 2000
READ_MAX_CHARS = 100_000

_SNIFF_BYTES = 8192


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


def _read_text(target: Path, rel: str) -> str:
    """The UTF-8 text of a file, refusing directories, binary files and other encodings."""
    if target.is_dir():
        raise ToolCallError(f"{rel!r} is a directory", hint="use list_files to see what it holds")
    with _os_errors_for_model("read", rel):
        data = target.read_bytes()
    if _looks_binary(data[:_SNIFF_BYTES]):
        raise ToolCallError(
            f"{rel!r} is a binary file ({len(data)} bytes) and cannot be edited as text",
            hint="use shell if you must change it",
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolCallError(
            f"{rel!r} is not UTF-8 text", hint="use shell if you must change it"
        ) from None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(target: Path, data: bytes) -> None:
    """Replace ``target`` with ``data``: a temp file in the same directory, fsync, rename.

    A reader (or a crash) sees the old content or the new, never a mix. An existing file
    keeps its permission bits; a new one gets the usual ``0o666 & ~umask``.
    """
    parent = target.parent
    created: list[Path] = []
    ancestor = parent
    while not ancestor.exists():
        created.append(ancestor)
        ancestor = ancestor.parent
    parent.mkdir(parents=True, exist_ok=True)
    try:
        mode: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = None
    temp = parent / f".lodger-{secrets.token_hex(8)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    # The rename and any new directories are durable only once their directories are synced.
    _fsync_dir(parent)
    for directory in created:
        _fsync_dir(directory.parent)


# ---------------------------------------------------------------- write planning


@dataclass(frozen=True, kw_only=True)
class _PlannedWrite:
    target: Path
    rel: str
    after: bytes


def _plan_write(root: Path, path: str, content: str) -> _PlannedWrite:
    target = resolve_in_workspace(root, path, must_exist=False)
    rel = workspace_relative(root, target)
    if target.is_dir():
        raise ToolCallError(f"{rel!r} is a directory", hint="choose a file path inside it")
    ancestor = target.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ToolCallError(
            f"cannot create {rel!r}: {workspace_relative(root, ancestor)!r} is a file, "
            "not a directory",
            hint="choose another path",
        )
    return _PlannedWrite(target=target, rel=rel, after=content.encode("utf-8"))


def _count_occurrences(text: str, needle: str) -> int:
    # Overlapping matches count too: "aa" in "aaa" is ambiguous, so it must be refused.
    count, start = 0, text.find(needle)
    while start != -1:
        count += 1
        start = text.find(needle, start + 1)
    return count


def _plan_edit(root: Path, path: str, old_string: str, new_string: str) -> _PlannedWrite:
    target = resolve_in_workspace(root, path, must_exist=True)
    rel = workspace_relative(root, target)
    if old_string == "":
        raise ToolCallError(
            "old_string is empty", hint="to create a file or replace all of it use write_file"
        )
    if old_string == new_string:
        raise ToolCallError("old_string and new_string are identical; there is nothing to change")
    text = _read_text(target, rel)
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
        target=target, rel=rel, after=text.replace(old_string, new_string, 1).encode("utf-8")
    )


def _expect(plan: _PlannedWrite) -> list[FileExpectation]:
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
            before_sha256=sha256_of_file(plan.target),
            after_sha256=_sha256(plan.after),
        )
    ]


async def _write_expectations(
    arguments: dict[str, Any], ctx: ToolContext
) -> Sequence[FileExpectation]:
    root = ctx.require_workspace()
    path, content = _str_arg(arguments, "path"), _str_arg(arguments, "content")
    return await asyncio.to_thread(lambda: _expect(_plan_write(root, path, content)))


async def _edit_expectations(
    arguments: dict[str, Any], ctx: ToolContext
) -> Sequence[FileExpectation]:
    root = ctx.require_workspace()
    path = _str_arg(arguments, "path")
    old, new = _str_arg(arguments, "old_string"), _str_arg(arguments, "new_string")
    return await asyncio.to_thread(lambda: _expect(_plan_edit(root, path, old, new)))


def _observe(root: Path, dispatched: ToolDispatched) -> ProbeResult:
    if not dispatched.expectations:
        return ProbeResult(applied=None, observation="no file expectation was recorded at dispatch")
    verdicts: list[bool | None] = []
    notes: list[str] = []
    for expected in dispatched.expectations:
        try:
            current = sha256_of_file(resolve_in_workspace(root, expected.path, must_exist=False))
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
    return await asyncio.to_thread(_observe, root, dispatched)


# ---------------------------------------------------------------- claims


def _path_claims(
    arguments: dict[str, Any], ctx: ToolContext, mode: ClaimMode
) -> list[ResourceClaim]:
    """A lease on the path's real identity: the file itself, or a directory's whole subtree."""
    root = ctx.require_workspace()
    path = arguments.get("path", ".")
    if not isinstance(path, str):
        raise ToolCallError("argument 'path' must be a string")
    target = resolve_in_workspace(root, path, must_exist=False)
    scope: ClaimScope = "subtree" if target.is_dir() else "exact"
    return [ResourceClaim.file(target, mode=mode, scope=scope, root=root)]


def _read_claims(arguments: dict[str, Any], ctx: ToolContext) -> Sequence[ResourceClaim]:
    return _path_claims(arguments, ctx, "read")


def _write_claims(arguments: dict[str, Any], ctx: ToolContext) -> Sequence[ResourceClaim]:
    return _path_claims(arguments, ctx, "write")


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
    root = ctx.require_workspace()
    target = resolve_in_workspace(root, path, must_exist=True)
    rel = workspace_relative(root, target)
    if target.is_dir():
        raise ToolCallError(f"{rel!r} is a directory", hint="use list_files to see what it holds")
    shown: list[str] = []
    used = 0
    total = 0
    stopped_at: int | None = None  # first line not shown because of the size budget
    with _os_errors_for_model("read", rel):
        with open(target, "rb") as raw:
            head = raw.read(_SNIFF_BYTES)
        if _looks_binary(head):
            raise ToolCallError(
                f"{rel!r} is a binary file ({target.stat().st_size} bytes); read_file shows text",
                hint="use shell (for example `file` or `xxd | head`) to inspect it",
            )
        try:
            with open(target, encoding="utf-8", newline="") as f:
                for number, line in enumerate(f, start=1):
                    total = number
                    if number < offset or stopped_at is not None or number >= offset + limit:
                        continue
                    text = line.rstrip("\r\n")
                    if len(text) > READ_MAX_LINE_CHARS:
                        cut = len(text) - READ_MAX_LINE_CHARS
                        text = f"{text[:READ_MAX_LINE_CHARS]} [line cut: {cut} more characters]"
                    rendered = f"{number:6}\t{text}"
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
        return f"[{rel!r} is empty]"
    if offset > total:
        raise ToolCallError(
            f"offset {offset} is past the end of {rel!r}, which has {total} lines",
            hint=f"use an offset between 1 and {total}",
        )
    last = offset + len(shown) - 1
    if stopped_at is not None or last < total:
        why = " (output size limit reached)" if stopped_at is not None else ""
        shown.append(
            f"[showing lines {offset}-{last} of {total}{why}; continue with offset={last + 1}]"
        )
    return "\n".join(shown)


@tool(
    group="files",
    recovery="queryable",
    probe=_probe_file_expectations,
    expectations=_write_expectations,
    claims=_write_claims,
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
    plan = _plan_write(ctx.require_workspace(), path, content)
    existed = plan.target.exists()
    with _os_errors_for_model("write", plan.rel):
        _write_atomically(plan.target, plan.after)
    verb = "replaced" if existed else "created"
    return f"{verb} {plan.rel!r} ({len(plan.after)} bytes)"


@tool(
    group="files",
    recovery="queryable",
    probe=_probe_file_expectations,
    expectations=_edit_expectations,
    claims=_write_claims,
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
    plan = _plan_edit(ctx.require_workspace(), path, old_string, new_string)
    with _os_errors_for_model("write", plan.rel):
        _write_atomically(plan.target, plan.after)
    return f"edited {plan.rel!r}: replaced 1 occurrence"

"""The built-in workspace tools: read, write, edit, list, grep and shell.

Every path goes through ``lodger.tools.workspace.resolve_in_workspace``, so no path, ``..``
or symlink leads a file tool out of the workspace (DESIGN section 8). Every mistake a model
can fix (a bad path, no match, a binary file) is a ``ToolCallError`` whose message says
what to do instead.

The writing tools are ``queryable`` (DESIGN section 5): before dispatch their
``expectations`` hook records the file's hash before and the hash it will have after; after
a crash their probe re-hashes the file to tell whether the write happened.

>>> [t.name for t in workspace_tools()]
['read_file', 'write_file', 'edit_file', 'list_files', 'grep', 'shell']
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import re
import secrets
import signal
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from lodger.authority.common import ClaimMode, ClaimScope, ResourceClaim
from lodger.errors import ToolCallError
from lodger.events import FileExpectation, ToolDispatched
from lodger.tools.spec import ProbeResult, Tool, ToolContext, ToolOutput, tool
from lodger.tools.workspace import (
    resolve_in_workspace,
    resolve_workspace_root,
    sha256_of_file,
    workspace_relative,
)

__all__ = [
    "edit_file",
    "grep",
    "list_files",
    "read_file",
    "shell",
    "workspace_tools",
    "write_file",
]

READ_MAX_LINE_CHARS = 2000
READ_MAX_CHARS = 100_000
LIST_MAX_ENTRIES = 500
GREP_MAX_MATCHES = 200
GREP_MAX_LINE_CHARS = 300
GREP_MAX_FILE_BYTES = 10 * 1024 * 1024
SHELL_MAX_OUTPUT_CHARS = 30_000

_SNIFF_BYTES = 8192
# Once a shell command is killed, how long to wait for the rest of its output.
_SHELL_DRAIN_GRACE_S = 1.0
# Directories that glob and grep never descend into: version-control internals only add noise.
_SKIPPED_DIRS = frozenset({".git"})


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


# ---------------------------------------------------------------- list and grep


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Translate a glob to a regex over '/'-separated relative paths.

    ``*`` and ``?`` stay within one path segment, ``**/`` spans any number of directories,
    ``[...]`` is a character class and ``{a,b}`` an alternation.
    """
    out: list[str] = []
    i, n, depth = 0, len(pattern), 0
    while i < n:
        c = pattern[i]
        at_segment_start = i == 0 or pattern[i - 1] == "/"
        if at_segment_start and pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif at_segment_start and pattern.startswith("**", i) and i + 2 == n:
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            # Escape what re would read as syntax (or warn about as a future set operation).
            escaped = "".join("\\" + ch if ch in "\\[]^&~|" else ch for ch in body)
            out.append("[" + ("^" if negate else "") + escaped + "]")
            i = end + 1
        elif c == "{":
            out.append("(?:")
            depth += 1
            i += 1
        elif c == "}" and depth:
            out.append(")")
            depth -= 1
            i += 1
        elif c == "," and depth:
            out.append("|")
            i += 1
        else:
            out.append(re.escape(c))
            i += 1
    try:
        return re.compile("".join(out) + ")" * depth + r"\Z", re.DOTALL)
    except re.error as exc:
        raise ToolCallError(f"invalid glob pattern {pattern!r}: {exc}") from None


def _check_glob(pattern: str, what: str) -> None:
    if pattern.startswith("/") or ".." in pattern.split("/"):
        raise ToolCallError(
            f"{what} {pattern!r} must be relative and stay inside the search path",
            hint="use a pattern like '**/*.py' and set `path` to choose the directory",
        )


def _walk(base: Path) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Every entry under ``base`` as (path relative to base, entry); symlinks are not followed."""
    stack: list[tuple[Path, str]] = [(base, "")]
    while stack:
        directory, prefix = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except (PermissionError, FileNotFoundError, NotADirectoryError):
            continue  # unreadable or vanished while walking: nothing to list there
        for entry in entries:
            rel = prefix + entry.name
            yield rel, entry
            if entry.is_dir(follow_symlinks=False) and entry.name not in _SKIPPED_DIRS:
                stack.append((Path(entry.path), rel + "/"))


def _join(base_rel: str, rel: str) -> str:
    return rel if base_rel == "." else f"{base_rel}/{rel}"


@tool(group="files", recovery="idempotent", nestable=True, claims=_read_claims)
def list_files(
    ctx: ToolContext,
    pattern: Annotated[
        str, Field(description="glob relative to `path`, e.g. '**/*.py' or 'src/*'")
    ] = "**/*",
    path: Annotated[str, Field(description="directory to search, relative to the root")] = ".",
) -> str:
    """List files and directories under `path` whose relative path matches a glob `pattern`.

    `*` and `?` match within one path segment, `**/` any number of directories, `[abc]` a
    character, `{a,b}` alternatives. Results are workspace-relative, sorted, directories end
    with '/'. Symlinks are listed but not followed, and `.git` is not searched. At most 500
    entries are shown.
    """
    root = ctx.require_workspace()
    _check_glob(pattern, "pattern")
    base = resolve_in_workspace(root, path, must_exist=True)
    base_rel = workspace_relative(root, base)
    if not base.is_dir():
        raise ToolCallError(f"{base_rel!r} is a file, not a directory", hint="use read_file")
    matcher = _glob_regex(pattern)
    found = sorted(
        _join(base_rel, rel) + ("/" if entry.is_dir(follow_symlinks=False) else "")
        for rel, entry in _walk(base)
        if matcher.match(rel)
    )
    if not found:
        return f"no entries match {pattern!r} under {base_rel!r}"
    if len(found) > LIST_MAX_ENTRIES:
        note = (
            f"[showing the first {LIST_MAX_ENTRIES} of {len(found)} entries; "
            "narrow the pattern or the path]"
        )
        return "\n".join([*found[:LIST_MAX_ENTRIES], note])
    return "\n".join(found)


def _grep_candidates(base: Path, glob: str | None) -> Iterator[tuple[str, Path]]:
    if base.is_file():
        yield "", base
        return
    matcher = _glob_regex(glob) if glob is not None else None
    for rel, entry in sorted(_walk(base), key=lambda item: item[0]):
        if not entry.is_file(follow_symlinks=False):
            continue
        # Like ripgrep: a glob without '/' matches the file name anywhere below `path`.
        subject = rel if glob is None or "/" in glob else entry.name
        if matcher is None or matcher.match(subject):
            yield rel, Path(entry.path)


@tool(group="files", recovery="idempotent", nestable=True, claims=_read_claims)
def grep(
    ctx: ToolContext,
    pattern: Annotated[str, Field(description="Python regular expression to search for")],
    path: Annotated[str, Field(description="file or directory to search")] = ".",
    glob: Annotated[
        str | None, Field(description="only files matching this glob, e.g. '*.py'")
    ] = None,
    ignore_case: bool = False,
) -> str:
    """Search text files for lines matching a Python regular expression.

    Prints `file:line: text` for each matching line, workspace-relative and sorted by file.
    Binary files, files over 10 MiB, symlinks and `.git` are skipped. At most 200 matches.
    """
    root = ctx.require_workspace()
    try:
        regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise ToolCallError(
            f"invalid regular expression {pattern!r}: {exc}",
            hint="escape special characters such as ( [ . * with a backslash",
        ) from None
    if glob is not None:
        _check_glob(glob, "glob")
    base = resolve_in_workspace(root, path, must_exist=True)
    base_rel = workspace_relative(root, base)
    matches: list[str] = []
    too_large = 0
    capped = False
    for rel, file in _grep_candidates(base, glob):
        shown = base_rel if rel == "" else _join(base_rel, rel)
        try:
            if file.stat().st_size > GREP_MAX_FILE_BYTES:
                too_large += 1
                continue
            with open(file, "rb") as raw:
                if _looks_binary(raw.read(_SNIFF_BYTES)):
                    continue
            with open(file, encoding="utf-8", errors="replace", newline="") as f:
                for number, line in enumerate(f, start=1):
                    text = line.rstrip("\r\n")
                    if not regex.search(text):
                        continue
                    if len(text) > GREP_MAX_LINE_CHARS:
                        text = text[:GREP_MAX_LINE_CHARS] + " [...]"
                    matches.append(f"{shown}:{number}: {text}")
                    if len(matches) >= GREP_MAX_MATCHES:
                        capped = True
                        break
        except (PermissionError, FileNotFoundError):
            continue  # unreadable or deleted while searching: nothing to report from it
        if capped:
            break
    notes: list[str] = []
    if capped:
        notes.append(
            f"[stopped after {GREP_MAX_MATCHES} matches; narrow the pattern, path or glob]"
        )
    if too_large:
        notes.append(f"[skipped {too_large} files larger than {GREP_MAX_FILE_BYTES} bytes]")
    if not matches:
        return "\n".join([f"no matches for {pattern!r} under {base_rel!r}", *notes])
    return "\n".join([*matches, *notes])


# ---------------------------------------------------------------- shell


def _scrubbed_env(root: Path) -> dict[str, str]:
    """An allow-list environment: no credentials (``*_KEY``, ``*_TOKEN``...) can leak in."""
    return {
        "PATH": os.environ.get("PATH") or os.defpath,
        "HOME": str(root),
        "LANG": os.environ.get("LANG") or "C.UTF-8",
    }


class _CappedOutput:
    """Keeps the first and the last bytes of a stream and counts what it dropped."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        # Bytes, not characters, arrive: keep enough for max_chars of multi-byte UTF-8.
        self._keep = 2 * max_chars
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._keep - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            if len(self._tail) > self._keep:
                del self._tail[: len(self._tail) - self._keep]

    @property
    def retained(self) -> int:
        """Bytes held in memory: bounded however much the command prints."""
        return len(self._head) + len(self._tail)

    def text(self) -> str:
        dropped = self.total - len(self._head) - len(self._tail)
        half = self.max_chars // 2
        if dropped == 0:
            whole = (self._head + self._tail).decode("utf-8", errors="replace")
            if len(whole) <= self.max_chars:
                return whole
            first, last = whole[:half], whole[-half:]
        else:
            first = self._head.decode("utf-8", errors="replace")[:half]
            last = self._tail.decode("utf-8", errors="replace")[-half:]
        return (
            f"{first}\n[... output cut: {self.total} bytes in total, only the first and last "
            f"{half} characters are shown ...]\n{last}"
        )


async def _drain(stream: asyncio.StreamReader, sink: _CappedOutput) -> None:
    while chunk := await stream.read(65536):
        sink.feed(chunk)


def _kill_group(process: asyncio.subprocess.Process) -> None:
    # The command runs in its own session, so its process group is everything it started
    # (unless something called setsid itself, which only a sandbox can contain).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


@tool(group="shell", recovery="never_retry", approval=True, claims=_workspace_claims)
async def shell(
    ctx: ToolContext,
    command: Annotated[str, Field(description="a bash command line")],
    timeout_s: Annotated[
        float, Field(gt=0, le=3600, description="seconds before the command is killed")
    ] = 60,
) -> str | ToolOutput:
    """Run a bash command in the workspace root and return its output and exit code.

    stdout and stderr are combined; long output keeps its beginning and end. The command
    gets a minimal environment (PATH, HOME set to the workspace, LANG) and no stdin. On
    timeout the command and everything it started are killed.
    """
    root = resolve_workspace_root(ctx.require_workspace())
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        command,
        cwd=root,
        env=_scrubbed_env(root),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    stdout = process.stdout
    assert stdout is not None  # stdout=PIPE
    output = _CappedOutput(SHELL_MAX_OUTPUT_CHARS)
    timed_out = False
    try:
        # Waiting for EOF as well as the exit: a background job holding the pipe is still
        # part of the command, and the timeout covers it too.
        async with asyncio.timeout(timeout_s):
            await _drain(stdout, output)
            await process.wait()
    except TimeoutError:
        timed_out = True
        _kill_group(process)
        await process.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_SHELL_DRAIN_GRACE_S):
                await _drain(stdout, output)
    except asyncio.CancelledError:
        _kill_group(process)
        await process.wait()
        raise
    text = output.text().rstrip("\n") or "(no output)"
    if timed_out:
        note = f"[timed out after {timeout_s:g} s; the command and its children were killed]"
        return ToolOutput(content=f"{text}\n{note}", is_error=True)
    code = process.returncode
    assert code is not None  # wait() returned
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"number {-code}"
        return f"{text}\n[exit code {code}: killed by signal {name}]"
    return f"{text}\n[exit code {code}]"


# ---------------------------------------------------------------- the set


def workspace_tools() -> list[Tool]:
    """The built-in tools for a session with a workspace, in a stable order."""
    return [read_file, write_file, edit_file, list_files, grep, shell]

"""The finding tools: list files by glob and grep their text, inside the workspace.

Both walk the tree themselves (never following symlinks, skipping ``.git``) so that a
link cannot lead a listing out of the workspace.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from pydantic import Field

from lodger.errors import ToolCallError
from lodger.tools.files import _SNIFF_BYTES, _looks_binary, _read_claims
from lodger.tools.spec import ToolContext, tool
from lodger.tools.workspace import (
    resolve_in_workspace,
    workspace_relative,
)

__all__ = ["grep", "list_files"]

LIST_MAX_ENTRIES = 500
GREP_MAX_MATCHES = 200
GREP_MAX_LINE_CHARS = 300
GREP_MAX_FILE_BYTES = 10 * 1024 * 1024
# Directories that glob and grep never descend into: version-control internals only add noise.
_SKIPPED_DIRS = frozenset({".git"})


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

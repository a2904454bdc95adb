"""The finding tools: list files by glob and grep their text, inside the workspace.

Both walk the tree themselves (never following symlinks, skipping ``.git``) so that a
link cannot lead a listing out of the workspace.

Patterns and globs are matched with RE2, whose time is linear in the text: a pattern
like ``^(a+)+$`` that makes a backtracking engine (Python's ``re``) run for ever on a long
line cannot hang a search. RE2 has no backreferences or lookaround; a pattern using them
is a ``ToolCallError`` that says so. Names that are not valid UTF-8 are shown with each
undecodable byte written as ``\\xNN`` (see ``lodger._text``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Protocol

import re2
from pydantic import Field

from lodger._text import visible_text
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


class _Matcher(Protocol):
    """The part of a compiled RE2 pattern the finding tools use."""

    def search(self, text: str) -> object | None: ...

    def match(self, text: str) -> object | None: ...


def _re2(pattern: str, *, ignore_case: bool = False) -> _Matcher:
    """Compile with RE2; raises ``re2.error`` (or ``UnicodeEncodeError`` for a lone surrogate)."""
    options = re2.Options()
    options.log_errors = False  # the error becomes a result; RE2 would also print it to stderr
    options.case_sensitive = not ignore_case
    compiled: _Matcher = re2.compile(pattern, options)
    return compiled


def _re2_reason(exc: Exception) -> str:
    if isinstance(exc, UnicodeEncodeError):
        return "it contains a lone surrogate, which is not text"
    reason = exc.args[0] if exc.args else exc
    return reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)


# What RE2 says about Python regex syntax it does not have, and how to do without it.
_UNSUPPORTED: tuple[tuple[str, str, str], ...] = (
    ("invalid perl operator: (?=", "a lookahead (?=...)", "match the following text as well"),
    ("invalid perl operator: (?!", "a negative lookahead (?!...)", "search more broadly"),
    ("invalid perl operator: (?<=", "a lookbehind (?<=...)", "match the preceding text as well"),
    ("invalid perl operator: (?<!", "a negative lookbehind (?<!...)", "search more broadly"),
    ("invalid perl operator: (?P", "a named backreference (?P=name)", "repeat the text itself"),
    ("invalid perl operator: (?>", "an atomic group (?>...)", "use a plain group (?:...)"),
    ("invalid perl operator: (?(", "a conditional (?(...)...)", "search for each case apart"),
    ("invalid perl operator: (?#", "a comment (?#...)", "remove the comment"),
    ("invalid escape sequence: \\Z", "\\Z", "use \\z or $ for the end of the line"),
    ("invalid escape sequence: \\g", "a backreference \\g<...>", "repeat the text itself"),
    ("invalid escape sequence: \\k", "a backreference \\k<...>", "repeat the text itself"),
    ("bad repetition operator: ++", "a possessive quantifier (++)", "drop the last +"),
    ("bad repetition operator: *+", "a possessive quantifier (*+)", "drop the last +"),
    ("bad repetition operator: ?+", "a possessive quantifier (?+)", "drop the last +"),
    ("invalid repetition size", "a repetition count above 1000", "use a smaller count or +"),
)


def _grep_pattern_error(pattern: str, exc: Exception) -> ToolCallError:
    reason = _re2_reason(exc)
    feature: tuple[str, str] | None = None
    if reason.startswith("invalid escape sequence: \\") and reason[-1:].isdigit():
        feature = (f"a backreference ({reason.rsplit(' ', 1)[-1]})", "repeat the text itself")
    else:
        for prefix, what, instead in _UNSUPPORTED:
            if reason.startswith(prefix):
                feature = (what, instead)
                break
    if feature is not None:
        what, instead = feature
        return ToolCallError(
            f"the pattern {pattern!r} uses {what}, which grep does not support (grep uses "
            "RE2 syntax, which runs in linear time and has no backreferences or lookaround)",
            hint=f"{instead}, or grep for a simpler pattern and read the matching files",
            code="unsupported_pattern",
        )
    if reason.startswith("pattern too large"):
        return ToolCallError(
            f"the pattern ({len(pattern)} characters) is too large to compile",
            hint="search for a shorter pattern, or several shorter ones in turn",
            code="unsupported_pattern",
        )
    return ToolCallError(
        f"invalid regular expression {pattern!r}: {reason}",
        hint="escape special characters such as ( [ . * with a backslash",
    )


def _literal(c: str) -> str:
    """One glob character as an RE2 literal (non-ASCII letters stand for themselves)."""
    return c if c.isalnum() or c == "_" else f"\\x{{{ord(c):x}}}"


def _glob_regex(pattern: str) -> _Matcher:
    """Translate a glob to an RE2 regex over '/'-separated relative paths.

    ``*`` and ``?`` stay within one path segment, ``**/`` spans any number of directories,
    ``[...]`` is a character class and ``{a,b}`` an alternation. RE2 matches in time
    linear in the path, so a glob like ``*a*a*a*a*b`` or ``{*,*}{*,*}...`` cannot blow up.
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
            # Escape what RE2 would read as class syntax; ranges (a-z) stay ranges.
            escaped = "".join("\\" + ch if ch in "\\[]^&~|:" else ch for ch in body)
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
            out.append(_literal(c))
            i += 1
    try:
        return _re2("(?s)" + "".join(out) + ")" * depth + r"\z")
    except (re2.error, UnicodeEncodeError) as exc:
        raise ToolCallError(
            f"invalid glob pattern {pattern!r}: {_re2_reason(exc)}",
            hint="use *, ?, **/, [abc] and {a,b}; write a literal [ as [[]",
        ) from None


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
    base_rel = visible_text(workspace_relative(root, base))
    if not base.is_dir():
        raise ToolCallError(f"{base_rel!r} is a file, not a directory", hint="use read_file")
    matcher = _glob_regex(pattern)
    found: list[str] = []
    undecodable: list[str] = []
    for rel, entry in _walk(base):
        shown = visible_text(rel)  # a name that is not UTF-8 is matched and shown escaped
        if matcher.match(shown):
            found.append(
                _join(base_rel, shown) + ("/" if entry.is_dir(follow_symlinks=False) else "")
            )
            if shown != rel:
                undecodable.append(_join(base_rel, shown))
    found.sort()
    if not found:
        return f"no entries match {pattern!r} under {base_rel!r}"
    notes = [_undecodable_note(min(undecodable))] if undecodable else []
    if len(found) > LIST_MAX_ENTRIES:
        note = (
            f"[showing the first {LIST_MAX_ENTRIES} of {len(found)} entries; "
            "narrow the pattern or the path]"
        )
        return "\n".join([*found[:LIST_MAX_ENTRIES], note, *notes])
    return "\n".join([*found, *notes])


def _undecodable_note(example: str) -> str:
    return (
        "[names shown with \\xNN hold bytes that are not UTF-8, so the file tools cannot "
        f"open them by name; rename one with shell, e.g. mv $'{example}' <new name>]"
    )


def _grep_candidates(base: Path, glob: str | None) -> Iterator[tuple[str, Path]]:
    if base.is_file():
        yield "", base
        return
    matcher = _glob_regex(glob) if glob is not None else None
    for rel, entry in sorted(_walk(base), key=lambda item: item[0]):
        if not entry.is_file(follow_symlinks=False):
            continue
        # Like ripgrep: a glob without '/' matches the file name anywhere below `path`.
        subject = visible_text(rel if glob is None or "/" in glob else entry.name)
        if matcher is None or matcher.match(subject):
            yield rel, Path(entry.path)


@tool(group="files", recovery="idempotent", nestable=True, claims=_read_claims)
def grep(
    ctx: ToolContext,
    pattern: Annotated[
        str,
        Field(description="regular expression (RE2 syntax: no backreferences or lookaround)"),
    ],
    path: Annotated[str, Field(description="file or directory to search")] = ".",
    glob: Annotated[
        str | None, Field(description="only files matching this glob, e.g. '*.py'")
    ] = None,
    ignore_case: bool = False,
) -> str:
    """Search text files for lines matching a regular expression (RE2 syntax, like Python's
    but without backreferences or lookaround; it runs in linear time).

    Prints `file:line: text` for each matching line, workspace-relative and sorted by file.
    Binary files, files over 10 MiB, symlinks and `.git` are skipped. At most 200 matches.
    """
    root = ctx.require_workspace()
    try:
        regex = _re2(pattern, ignore_case=ignore_case)
    except (re2.error, UnicodeEncodeError) as exc:
        raise _grep_pattern_error(pattern, exc) from None
    if glob is not None:
        _check_glob(glob, "glob")
    base = resolve_in_workspace(root, path, must_exist=True)
    base_rel = visible_text(workspace_relative(root, base))
    matches: list[str] = []
    too_large = 0
    capped = False
    undecodable: list[str] = []
    for rel, file in _grep_candidates(base, glob):
        shown = base_rel if rel == "" else _join(base_rel, visible_text(rel))
        before = len(matches)
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
        if len(matches) > before and visible_text(rel) != rel:
            undecodable.append(shown)
        if capped:
            break
    notes: list[str] = []
    if capped:
        notes.append(
            f"[stopped after {GREP_MAX_MATCHES} matches; narrow the pattern, path or glob]"
        )
    if too_large:
        notes.append(f"[skipped {too_large} files larger than {GREP_MAX_FILE_BYTES} bytes]")
    if undecodable:
        notes.append(_undecodable_note(undecodable[0]))
    if not matches:
        return "\n".join([f"no matches for {pattern!r} under {base_rel!r}", *notes])
    return "\n".join([*matches, *notes])

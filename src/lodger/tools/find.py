"""The finding tools: list files by glob and grep their text, inside the workspace.

Both walk the tree themselves through directory fds (``O_NOFOLLOW``, never following a
symlink), so a link cannot lead a listing out of the workspace, and they skip lodger's
state directory silently. They also skip what ``.gitignore`` ignores (``.git`` included),
unless the model names a path inside an ignored directory: then that subtree is shown.

Patterns and globs are matched with RE2, whose time is linear in the text: a pattern
like ``^(a+)+$`` that makes a backtracking engine (Python's ``re``) run for ever on a long
line cannot hang a search. RE2 has no backreferences or lookaround; a pattern using them
is a ``ToolCallError`` that says so. Names that are not valid UTF-8 are shown with each
undecodable byte written as ``\\xNN`` (see ``lodger._core.text``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Protocol

import re2
from pydantic import Field

from lodger._core.text import visible_text
from lodger.errors import ToolCallError
from lodger.tools._beneath import DIR_FLAGS, Hidden, Walk, walk
from lodger.tools._ignore import IgnoreRules
from lodger.tools.files import _SNIFF_BYTES, _looks_binary, _read_claims
from lodger.tools.spec import ToolContext, tool
from lodger.tools.workspace import open_in_workspace, text_lines

__all__ = ["grep", "list_files"]

LIST_MAX_ENTRIES = 500
GREP_MAX_MATCHES = 200
GREP_MAX_LINE_CHARS = 300
GREP_MAX_FILE_BYTES = 10 * 1024 * 1024
# How many ignored names list_files mentions in its note.
_IGNORED_SHOWN = 10


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


@dataclass(frozen=True, kw_only=True)
class _Found:
    rel: str  # relative to the directory walked
    name: str
    is_dir: bool
    is_file: bool  # a regular file (symlinks are neither)


@dataclass(kw_only=True)
class _Frame:
    fd: int
    dev: int
    shown: str  # workspace-relative prefix: '' or 'a/b/'
    rel: str  # prefix relative to the directory walked
    rules: IgnoreRules | None
    subdirs: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class _Skipped:
    """Entries .gitignore kept out of a walk: how many, and the first few names."""

    count: int = 0
    names: list[str] = field(default_factory=list)


def _rules_for(w: Walk) -> IgnoreRules | None:
    """The ignore rules in force in the directory walked to, or None when the model named a
    directory that is itself ignored (or lies in one): then nothing below it is skipped."""
    rules = IgnoreRules.at_root(w.root_fd)
    prefix = ""
    for fd, name in zip(w.fds, w.names, strict=True):
        rel = prefix + name
        if rules.ignored(rel, is_dir=True):
            return None
        prefix = rel + "/"
        rules = rules.below(fd, prefix)
    return rules


def _walk(w: Walk, hidden: Hidden, skipped: _Skipped) -> Iterator[_Found]:
    """Every entry below the directory ``w`` leads to; symlinks are listed, never followed.

    Directories are opened one at a time relative to their parent's fd with O_NOFOLLOW, so
    at most one fd per level is open. Hidden paths and ignored entries are left out.
    """
    start = os.dup(w.dir_fd)
    shown = "" if not w.names else "/".join(w.names) + "/"
    stack = [_Frame(fd=start, dev=os.fstat(start).st_dev, shown=shown, rel="", rules=_rules_for(w))]
    try:
        yield from _scan(stack[0], w.root, hidden, skipped)
        while stack:
            frame = stack[-1]
            if not frame.subdirs:
                os.close(stack.pop().fd)
                continue
            name = frame.subdirs.pop()
            try:
                fd = os.open(name, DIR_FLAGS, dir_fd=frame.fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT, errno.EACCES):
                    continue  # swapped, removed or unreadable meanwhile: nothing to list there
                raise
            st = os.fstat(fd)
            if hidden.match(w.root / (frame.shown + name), st) is not None:
                os.close(fd)
                continue
            rules = frame.rules
            if rules is not None:
                rules = rules.below(fd, frame.shown + name + "/")
            child = _Frame(
                fd=fd,
                dev=st.st_dev,
                shown=frame.shown + name + "/",
                rel=frame.rel + name + "/",
                rules=rules,
            )
            stack.append(child)
            yield from _scan(child, w.root, hidden, skipped)
    finally:
        for frame in stack:
            os.close(frame.fd)


def _scan(frame: _Frame, root: Path, hidden: Hidden, skipped: _Skipped) -> Iterator[_Found]:
    try:
        with os.scandir(frame.fd) as it:
            entries = sorted(it, key=lambda e: e.name)
    except (PermissionError, FileNotFoundError, NotADirectoryError):
        return  # unreadable or vanished while walking: nothing to list there
    for entry in entries:
        is_dir = entry.is_dir(follow_symlinks=False)
        ident = (frame.dev, entry.inode())  # from the directory entry: no syscall per file
        if hidden.match(root / (frame.shown + entry.name), ident) is not None:
            continue
        if frame.rules is not None and frame.rules.ignored(frame.shown + entry.name, is_dir=is_dir):
            if entry.name != ".git":
                skipped.count += 1
                if len(skipped.names) < _IGNORED_SHOWN:
                    skipped.names.append(frame.shown + entry.name + ("/" if is_dir else ""))
            continue
        yield _Found(
            rel=frame.rel + entry.name,
            name=entry.name,
            is_dir=is_dir,
            is_file=entry.is_file(follow_symlinks=False),
        )
        if is_dir:
            frame.subdirs.append(entry.name)
    frame.subdirs.reverse()  # popped from the end: visit in name order


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
    with '/'. Symlinks are listed but not followed. What `.gitignore` ignores (and `.git`)
    is left out unless `path` names it. At most 500 entries are shown.
    """
    root = ctx.require_workspace()
    _check_glob(pattern, "pattern")
    matcher = _glob_regex(pattern)
    hidden = Hidden.of(ctx.hidden)
    skipped = _Skipped()
    undecodable: list[str] = []
    with walk(root, path, hidden=hidden, must_exist=True) as w:
        base_rel = visible_text(w.rel)
        if not w.is_dir:
            raise ToolCallError(f"{base_rel!r} is a file, not a directory", hint="use read_file")
        found: list[str] = []
        for entry in _walk(w, hidden, skipped):
            shown = visible_text(entry.rel)  # a name that is not UTF-8 is shown escaped
            if not matcher.match(shown):
                continue
            found.append(_join(base_rel, shown) + ("/" if entry.is_dir else ""))
            if shown != entry.rel:
                undecodable.append(_join(base_rel, shown))
    found.sort()
    notes = []
    if skipped.count:
        more = ", ..." if skipped.count > len(skipped.names) else ""
        notes.append(
            f"[{skipped.count} entries ignored by .gitignore are not listed: "
            f"{', '.join(visible_text(n) for n in skipped.names)}{more}; "
            "pass one as `path` to list it]"
        )
    if undecodable:
        notes.append(_undecodable_note(min(undecodable)))
    if not found:
        return "\n".join([f"no entries match {pattern!r} under {base_rel!r}", *notes])
    if len(found) > LIST_MAX_ENTRIES:
        notes.insert(
            0,
            f"[showing the first {LIST_MAX_ENTRIES} of {len(found)} entries; "
            "narrow the pattern or the path]",
        )
        return "\n".join([*found[:LIST_MAX_ENTRIES], *notes])
    return "\n".join([*found, *notes])


def _undecodable_note(example: str) -> str:
    return (
        "[names shown with \\xNN hold bytes that are not UTF-8, so the file tools cannot "
        f"open them by name; rename one with shell, e.g. mv $'{example}' <new name>]"
    )


def _grep_candidates(
    w: Walk, glob: str | None, hidden: Hidden, skipped: _Skipped
) -> list[tuple[str, str]]:
    """(shown name, workspace-relative path) of each regular file to search, sorted."""
    if not w.is_dir:
        return [(visible_text(w.rel), w.rel)]
    matcher = _glob_regex(glob) if glob is not None else None
    found: list[tuple[str, str]] = []
    for entry in _walk(w, hidden, skipped):
        if not entry.is_file:
            continue
        # Like ripgrep: a glob without '/' matches the file name anywhere below `path`.
        subject = visible_text(entry.rel if glob is None or "/" in glob else entry.name)
        if matcher is None or matcher.match(subject):
            rel = _join(w.rel, entry.rel)
            found.append((visible_text(rel), rel))
    return sorted(found)


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
    Binary files, files over 10 MiB, symlinks, and what `.gitignore` ignores (and `.git`)
    are skipped unless `path` names them. At most 200 matches.
    """
    root = ctx.require_workspace()
    try:
        regex = _re2(pattern, ignore_case=ignore_case)
    except (re2.error, UnicodeEncodeError) as exc:
        raise _grep_pattern_error(pattern, exc) from None
    if glob is not None:
        _check_glob(glob, "glob")
    hidden = Hidden.of(ctx.hidden)
    skipped = _Skipped()
    with walk(root, path, hidden=hidden, must_exist=True) as w:
        base_rel = visible_text(w.rel)
        candidates = _grep_candidates(w, glob, hidden, skipped)
    matches: list[str] = []
    too_large = 0
    capped = False
    undecodable: list[str] = []
    for shown, rel in candidates:
        before = len(matches)
        try:
            # Each file is opened by walking beneath the root again: a name seen in the
            # listing may have been swapped since, the walk holds wherever it leads.
            with open_in_workspace(root, rel, hidden=ctx.hidden) as (raw, _):
                if os.fstat(raw.fileno()).st_size > GREP_MAX_FILE_BYTES:
                    too_large += 1
                    continue
                if _looks_binary(raw.read(_SNIFF_BYTES)):
                    continue
                with text_lines(raw, errors="replace") as lines:
                    for number, line in enumerate(lines, start=1):
                        text = line.rstrip("\r\n")
                        if not regex.search(text):
                            continue
                        if len(text) > GREP_MAX_LINE_CHARS:
                            text = text[:GREP_MAX_LINE_CHARS] + " [...]"
                        matches.append(f"{shown}:{number}: {text}")
                        if len(matches) >= GREP_MAX_MATCHES:
                            capped = True
                            break
        except ToolCallError:
            continue  # no longer a readable regular file inside: nothing to report from it
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

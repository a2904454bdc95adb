"""The built-in workspace tools, called through their handlers on real files and processes."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from lodger.authority import ResourceClaim
from lodger.errors import ToolCallError
from lodger.events import FileExpectation, ToolDispatched
from lodger.runtime.builtin import (
    edit_file,
    grep,
    list_files,
    read_file,
    shell,
    workspace_tools,
    write_file,
)
from lodger.substrates.sandbox import SandboxPolicy
from lodger.substrates.shell import SHELL_MAX_OUTPUT_CHARS, _CappedOutput, shell_tool
from lodger.tools.files import READ_MAX_CHARS
from lodger.tools.find import GREP_MAX_MATCHES, LIST_MAX_ENTRIES
from lodger.tools.spec import Tool, ToolContext, ToolOutput


async def call(t: Tool, ctx: ToolContext, **arguments: Any) -> str:
    result = await t.handler(arguments, ctx)
    if isinstance(result, ToolOutput):
        assert not result.is_error, result.content
        return result.content
    assert isinstance(result, str)
    return result


def names_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def expectations(t: Tool, ctx: ToolContext, **arguments: Any) -> list[FileExpectation]:
    assert t.expectations is not None
    return list(await t.expectations(arguments, ctx))


def dispatched(t: Tool, arguments: dict[str, Any], exps: list[FileExpectation]) -> ToolDispatched:
    return ToolDispatched(
        operation_id="o-1",
        tool=t.name,
        arguments=arguments,
        recovery=t.recovery,
        expectations=tuple(exps),
    )


# ---------------------------------------------------------------- declarations


def test_workspace_tools_and_their_declarations() -> None:
    tools = {t.name: t for t in workspace_tools()}
    assert list(tools) == [
        "read_file", "write_file", "edit_file", "list_files", "grep", "shell", "run_python",
    ]  # fmt: skip
    declared = {
        name: (t.group, t.recovery, t.nestable, t.approval, t.probe is not None)
        for name, t in tools.items()
    }
    assert declared == {
        "read_file": ("files", "idempotent", True, False, False),
        "write_file": ("files", "queryable", False, False, True),
        "edit_file": ("files", "queryable", False, False, True),
        "list_files": ("files", "idempotent", True, False, False),
        "grep": ("files", "idempotent", True, False, False),
        # Sandboxed by default: confinement, not a person, makes a command safe to run.
        "shell": ("shell", "never_retry", False, False, False),
        "run_python": ("shell", "never_retry", False, False, False),
    }
    assert write_file.expectations is not None
    assert edit_file.expectations is not None
    assert all(t.claims is not None for t in tools.values())
    # The context parameter never leaks into the model-facing schema.
    assert all("ctx" not in t.parameters["properties"] for t in tools.values())
    assert read_file.parameters["required"] == ["path"]
    assert read_file.parameters["properties"]["offset"]["minimum"] == 1


async def test_tools_need_a_workspace() -> None:
    bare = ToolContext(session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o")
    with pytest.raises(ToolCallError, match="needs a workspace"):
        await read_file.handler({"path": "a.txt"}, bare)


# ---------------------------------------------------------------- read_file


async def test_read_file_numbers_lines_like_cat_n(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.txt").write_text("alpha\nbeta\r\ngamma")
    assert await call(read_file, ctx, path="a.txt") == "     1\talpha\n     2\tbeta\n     3\tgamma"


async def test_read_file_range_notes_where_to_continue(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    out = await call(read_file, ctx, path="a.txt", offset=3, limit=2)
    assert out.splitlines() == [
        "     3\tline 3",
        "     4\tline 4",
        "[showing lines 3-4 of 10; continue with offset=5]",
    ]
    tail = await call(read_file, ctx, path="a.txt", offset=9, limit=5)
    assert tail.splitlines() == ["     9\tline 9", "    10\tline 10"]


async def test_read_file_default_limit_truncates_with_a_note(ws: Path, ctx: ToolContext) -> None:
    (ws / "big.txt").write_text("x\n" * 2500)
    lines = (await call(read_file, ctx, path="big.txt")).splitlines()
    assert len(lines) == 2001
    assert lines[-2] == "  2000\tx"
    assert lines[-1] == "[showing lines 1-2000 of 2500; continue with offset=2001]"


async def test_read_file_cuts_long_lines_and_caps_total_size(ws: Path, ctx: ToolContext) -> None:
    (ws / "wide.txt").write_text(("y" * 5000 + "\n") * 200)
    out = await call(read_file, ctx, path="wide.txt")
    assert len(out) <= READ_MAX_CHARS + 200
    first = out.splitlines()[0]
    assert first.endswith("[line cut: 3000 more characters]")
    assert "(output size limit reached); continue with offset=" in out.splitlines()[-1]


async def test_read_file_past_the_end_is_a_model_error(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.txt").write_text("one\ntwo\n")
    with pytest.raises(
        ToolCallError, match=re.escape("offset 5 is past the end of 'a.txt', which has 2")
    ):
        await call(read_file, ctx, path="a.txt", offset=5)


async def test_read_file_rejects_offset_zero_by_schema(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.txt").write_text("one\n")
    with pytest.raises(ToolCallError, match="offset"):
        await call(read_file, ctx, path="a.txt", offset=0)


async def test_read_file_empty_file(ws: Path, ctx: ToolContext) -> None:
    (ws / "empty.txt").write_text("")
    assert await call(read_file, ctx, path="empty.txt") == "['empty.txt' is empty]"


async def test_read_file_refuses_binary_non_utf8_missing_and_dirs(
    ws: Path, ctx: ToolContext
) -> None:
    (ws / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    (ws / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    (ws / "dir").mkdir()
    with pytest.raises(ToolCallError, match=re.escape("'img.png' is a binary file")):
        await call(read_file, ctx, path="img.png")
    with pytest.raises(ToolCallError, match="not UTF-8 text"):
        await call(read_file, ctx, path="latin1.txt")
    with pytest.raises(ToolCallError, match="does not exist"):
        await call(read_file, ctx, path="missing.txt")
    with pytest.raises(ToolCallError, match="is a directory; use list_files"):
        await call(read_file, ctx, path="dir")


async def test_read_file_refuses_escapes(ws: Path, outside: Path, ctx: ToolContext) -> None:
    (ws / "leak.txt").symlink_to(outside / "secret.txt")
    (ws / "out").symlink_to(outside)
    for path in (
        "../outside/secret.txt",
        str(outside / "secret.txt"),
        "leak.txt",
        "out/secret.txt",
    ):
        with pytest.raises(ToolCallError, match="outside the workspace"):
            await call(read_file, ctx, path=path)


async def test_read_file_follows_symlinks_inside(ws: Path, ctx: ToolContext) -> None:
    (ws / "real.txt").write_text("inside\n")
    (ws / "alias.txt").symlink_to("real.txt")
    assert await call(read_file, ctx, path="alias.txt") == "     1\tinside"


# ---------------------------------------------------------------- write_file


async def test_write_file_creates_parents_and_writes_exact_bytes(
    ws: Path, ctx: ToolContext
) -> None:
    out = await call(write_file, ctx, path="a/b/c.txt", content="héllo\n")
    assert out == "created 'a/b/c.txt' (7 bytes)"
    assert (ws / "a/b/c.txt").read_bytes() == "héllo\n".encode()
    out = await call(write_file, ctx, path="a/b/c.txt", content="bye")
    assert out == "replaced 'a/b/c.txt' (3 bytes)"
    assert (ws / "a/b/c.txt").read_text() == "bye"


async def test_write_file_replaces_by_rename_and_leaves_no_temp_files(
    ws: Path, ctx: ToolContext
) -> None:
    target = ws / "a.txt"
    target.write_text("old content")
    before = await asyncio.to_thread(target.open)
    with before:
        await call(write_file, ctx, path="a.txt", content="new content")
        # An in-place rewrite would show through this handle; a rename leaves it on the old file.
        assert before.read() == "old content"
    assert target.read_text() == "new content"
    assert names_in(ws) == ["a.txt"]


async def test_write_file_keeps_the_mode_of_an_existing_file(ws: Path, ctx: ToolContext) -> None:
    target = ws / "run.sh"
    target.write_text("#!/bin/sh\n")
    target.chmod(0o750)
    await call(write_file, ctx, path="run.sh", content="#!/bin/sh\necho hi\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o750


async def test_write_file_through_an_inside_symlink_updates_the_target(
    ws: Path, ctx: ToolContext
) -> None:
    (ws / "real.txt").write_text("old")
    (ws / "alias.txt").symlink_to("real.txt")
    await call(write_file, ctx, path="alias.txt", content="new")
    assert (ws / "alias.txt").is_symlink()
    assert (ws / "real.txt").read_text() == "new"


async def test_write_file_refuses_escapes_and_creates_nothing_outside(
    ws: Path, outside: Path, ctx: ToolContext
) -> None:
    (ws / "out").symlink_to(outside)
    (ws / "dangling").symlink_to(outside / "planted.txt")
    for path in ("../outside/planted.txt", "out/planted.txt", "out/deep/planted.txt", "dangling"):
        with pytest.raises(ToolCallError, match="outside the workspace"):
            await call(write_file, ctx, path=path, content="x")
    assert names_in(outside) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"


async def test_write_file_onto_a_directory_or_through_a_file_is_a_model_error(
    ws: Path, ctx: ToolContext
) -> None:
    (ws / "dir").mkdir()
    (ws / "file.txt").write_text("x")
    with pytest.raises(ToolCallError, match="'dir' is a directory"):
        await call(write_file, ctx, path="dir", content="x")
    with pytest.raises(ToolCallError, match=re.escape("'file.txt' is a file, not a directory")):
        await call(write_file, ctx, path="file.txt/child.txt", content="x")
    with pytest.raises(ToolCallError, match=re.escape("'file.txt' is a file, not a directory")):
        await call(write_file, ctx, path="file.txt/deeper/child.txt", content="x")


async def test_write_expectations_for_a_new_and_an_existing_file(
    ws: Path, ctx: ToolContext
) -> None:
    (ws / "sub").mkdir()
    new = await expectations(write_file, ctx, path="sub/../new.txt", content="hello")
    assert new == [FileExpectation(path="new.txt", before_sha256=None, after_sha256=sha(b"hello"))]
    (ws / "old.txt").write_text("before")
    old = await expectations(write_file, ctx, path="old.txt", content="after")
    assert old == [
        FileExpectation(path="old.txt", before_sha256=sha(b"before"), after_sha256=sha(b"after"))
    ]
    # Computing expectations has no side effect.
    assert not (ws / "new.txt").exists()
    assert (ws / "old.txt").read_text() == "before"


async def test_write_expectations_refuse_escapes(ws: Path, ctx: ToolContext) -> None:
    with pytest.raises(ToolCallError, match="outside the workspace"):
        await expectations(write_file, ctx, path="../x.txt", content="x")


async def test_write_probe_before_after_and_unrelated_change(ws: Path, ctx: ToolContext) -> None:
    assert write_file.probe is not None
    (ws / "a.txt").write_text("before")
    arguments = {"path": "a.txt", "content": "after"}
    record = dispatched(write_file, arguments, await expectations(write_file, ctx, **arguments))

    not_yet = await write_file.probe(record, ctx)
    assert not_yet.applied is False
    assert "still has its content from before" in not_yet.observation

    await call(write_file, ctx, **arguments)
    done = await write_file.probe(record, ctx)
    assert done.applied is True
    assert "'a.txt' has the content expected after the write" in done.observation
    assert "write_file on 'a.txt' took effect" in done.content

    (ws / "a.txt").write_text("someone else")
    unknown = await write_file.probe(record, ctx)
    assert unknown.applied is None
    assert "neither before nor after" in unknown.observation


async def test_write_probe_for_a_new_file(ws: Path, ctx: ToolContext) -> None:
    assert write_file.probe is not None
    arguments = {"path": "fresh.txt", "content": "x"}
    record = dispatched(write_file, arguments, await expectations(write_file, ctx, **arguments))
    absent = await write_file.probe(record, ctx)
    assert absent.applied is False
    assert "is still absent" in absent.observation
    await call(write_file, ctx, **arguments)
    assert (await write_file.probe(record, ctx)).applied is True


async def test_probe_without_expectations_cannot_tell(ctx: ToolContext) -> None:
    assert write_file.probe is not None
    result = await write_file.probe(dispatched(write_file, {"path": "a"}, []), ctx)
    assert result.applied is None


# ---------------------------------------------------------------- edit_file


async def test_edit_file_replaces_exactly_one_occurrence(ws: Path, ctx: ToolContext) -> None:
    (ws / "m.py").write_text("def f():\n    return 1\n\ndef g():\n    return 2\n")
    out = await call(edit_file, ctx, path="m.py", old_string="return 2", new_string="return 3")
    assert out == "edited 'm.py': replaced 1 occurrence"
    assert (ws / "m.py").read_text() == "def f():\n    return 1\n\ndef g():\n    return 3\n"


async def test_edit_file_keeps_crlf_line_endings(ws: Path, ctx: ToolContext) -> None:
    (ws / "w.txt").write_bytes(b"one\r\ntwo\r\n")
    await call(edit_file, ctx, path="w.txt", old_string="two", new_string="2")
    assert (ws / "w.txt").read_bytes() == b"one\r\n2\r\n"


async def test_edit_file_not_found_says_to_read_first(ws: Path, ctx: ToolContext) -> None:
    (ws / "m.py").write_text("x = 1\n")
    with pytest.raises(ToolCallError) as info:
        await call(edit_file, ctx, path="m.py", old_string="x = 2", new_string="x = 3")
    assert "old_string was not found in 'm.py'" in str(info.value)
    assert "read the file first" in str(info.value)
    assert (ws / "m.py").read_text() == "x = 1\n"


async def test_edit_file_ambiguous_match_says_how_many(ws: Path, ctx: ToolContext) -> None:
    (ws / "m.py").write_text("a = 1\nb = 1\nc = 1\n")
    with pytest.raises(ToolCallError) as info:
        await call(edit_file, ctx, path="m.py", old_string=" = 1", new_string=" = 2")
    assert "matches 3 times in 'm.py' but must match exactly once" in str(info.value)
    assert "more surrounding lines" in str(info.value)
    assert (ws / "m.py").read_text() == "a = 1\nb = 1\nc = 1\n"


async def test_edit_file_counts_overlapping_matches(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.txt").write_text("aaa")
    with pytest.raises(ToolCallError, match="matches 2 times"):
        await call(edit_file, ctx, path="a.txt", old_string="aa", new_string="b")


async def test_edit_file_refuses_useless_and_impossible_edits(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.txt").write_text("x")
    (ws / "b.bin").write_bytes(b"x\x00y")
    with pytest.raises(ToolCallError, match="old_string is empty"):
        await call(edit_file, ctx, path="a.txt", old_string="", new_string="y")
    with pytest.raises(ToolCallError, match="identical"):
        await call(edit_file, ctx, path="a.txt", old_string="x", new_string="x")
    with pytest.raises(ToolCallError, match="binary file"):
        await call(edit_file, ctx, path="b.bin", old_string="x", new_string="z")
    with pytest.raises(ToolCallError, match="does not exist"):
        await call(edit_file, ctx, path="nope.txt", old_string="x", new_string="z")


async def test_edit_expectations_and_probe(ws: Path, ctx: ToolContext) -> None:
    assert edit_file.probe is not None
    (ws / "c.txt").write_text("one two three")
    arguments = {"path": "c.txt", "old_string": "two", "new_string": "2"}
    exps = await expectations(edit_file, ctx, **arguments)
    assert exps == [
        FileExpectation(
            path="c.txt", before_sha256=sha(b"one two three"), after_sha256=sha(b"one 2 three")
        )
    ]
    record = dispatched(edit_file, arguments, exps)
    assert (await edit_file.probe(record, ctx)).applied is False
    await call(edit_file, ctx, **arguments)
    assert (ws / "c.txt").read_bytes() == b"one 2 three"
    assert (await edit_file.probe(record, ctx)).applied is True
    (ws / "c.txt").write_text("rewritten")
    assert (await edit_file.probe(record, ctx)).applied is None


async def test_edit_expectations_refuse_a_missing_match(ws: Path, ctx: ToolContext) -> None:
    (ws / "c.txt").write_text("abc")
    with pytest.raises(ToolCallError, match="not found"):
        await expectations(edit_file, ctx, path="c.txt", old_string="zzz", new_string="y")


# ---------------------------------------------------------------- list_files


@pytest.fixture
def tree(ws: Path) -> Path:
    for rel in ("README.md", "setup.py", "src/pkg/__init__.py", "src/pkg/mod.py", "docs/a.rst"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(f"content of {rel}\n")
    (ws / ".git" / "objects").mkdir(parents=True)
    (ws / ".git" / "objects" / "ab").write_text("blob")
    return ws


async def test_list_files_defaults_to_everything_sorted(tree: Path, ctx: ToolContext) -> None:
    out = await call(list_files, ctx)
    # .git is left out like everything .gitignore ignores (issue 10, item 3).
    assert out.splitlines() == [
        "README.md",
        "docs/",
        "docs/a.rst",
        "setup.py",
        "src/",
        "src/pkg/",
        "src/pkg/__init__.py",
        "src/pkg/mod.py",
    ]


async def test_list_files_glob_semantics(tree: Path, ctx: ToolContext) -> None:
    assert (await call(list_files, ctx, pattern="*.py")).splitlines() == ["setup.py"]
    assert (await call(list_files, ctx, pattern="**/*.py")).splitlines() == [
        "setup.py",
        "src/pkg/__init__.py",
        "src/pkg/mod.py",
    ]
    assert (await call(list_files, ctx, pattern="**/*.{md,rst}")).splitlines() == [
        "README.md",
        "docs/a.rst",
    ]
    assert (await call(list_files, ctx, pattern="src/*/m?d.py")).splitlines() == ["src/pkg/mod.py"]
    assert (await call(list_files, ctx, pattern="[!s]*")).splitlines() == [
        "README.md",
        "docs/",
    ]
    assert (await call(list_files, ctx, pattern="[a-r]*")).splitlines() == ["docs/"]


async def test_list_files_under_a_path_gives_workspace_relative_names(
    tree: Path, ctx: ToolContext
) -> None:
    assert (await call(list_files, ctx, path="src", pattern="*/*.py")).splitlines() == [
        "src/pkg/__init__.py",
        "src/pkg/mod.py",
    ]


async def test_list_files_does_not_follow_symlinks_out(
    ws: Path, outside: Path, ctx: ToolContext
) -> None:
    (ws / "out").symlink_to(outside)
    (ws / "keep.txt").write_text("x")
    out = await call(list_files, ctx)
    assert out.splitlines() == ["keep.txt", "out"]
    assert "secret" not in out
    with pytest.raises(ToolCallError, match="outside the workspace"):
        await call(list_files, ctx, path="out")
    with pytest.raises(ToolCallError, match="outside the workspace"):
        await call(list_files, ctx, path="..")


async def test_list_files_caps_entries_with_a_note(ws: Path, ctx: ToolContext) -> None:
    for i in range(LIST_MAX_ENTRIES + 20):
        (ws / f"f{i:04}.txt").write_text("")
    lines = (await call(list_files, ctx)).splitlines()
    assert len(lines) == LIST_MAX_ENTRIES + 1
    assert lines[0] == "f0000.txt"
    assert lines[-1] == (
        f"[showing the first {LIST_MAX_ENTRIES} of {LIST_MAX_ENTRIES + 20} entries; "
        "narrow the pattern or the path]"
    )


async def test_list_files_model_errors(tree: Path, ctx: ToolContext) -> None:
    assert await call(list_files, ctx, pattern="*.java") == "no entries match '*.java' under '.'"
    with pytest.raises(ToolCallError, match="is a file, not a directory"):
        await call(list_files, ctx, path="README.md")
    with pytest.raises(ToolCallError, match="must be relative"):
        await call(list_files, ctx, pattern="../*")
    with pytest.raises(ToolCallError, match="must be relative"):
        await call(list_files, ctx, pattern="/etc/*")


# ---------------------------------------------------------------- grep


async def test_grep_prints_file_line_text(tree: Path, ctx: ToolContext) -> None:
    (tree / "src/pkg/mod.py").write_text("import os\n\ndef main():\n    return os.getcwd()\n")
    out = await call(grep, ctx, pattern=r"\bos\b")
    assert out.splitlines() == [
        "src/pkg/mod.py:1: import os",
        "src/pkg/mod.py:4:     return os.getcwd()",
    ]


async def test_grep_options(tree: Path, ctx: ToolContext) -> None:
    assert (
        await call(grep, ctx, pattern="CONTENT OF", ignore_case=True, glob="*.py")
    ).splitlines() == [
        "setup.py:1: content of setup.py",
        "src/pkg/__init__.py:1: content of src/pkg/__init__.py",
        "src/pkg/mod.py:1: content of src/pkg/mod.py",
    ]
    assert await call(grep, ctx, pattern="CONTENT OF") == "no matches for 'CONTENT OF' under '.'"
    assert (await call(grep, ctx, pattern="content", path="docs")).splitlines() == [
        "docs/a.rst:1: content of docs/a.rst"
    ]
    assert (await call(grep, ctx, pattern="content", path="README.md")).splitlines() == [
        "README.md:1: content of README.md"
    ]
    assert (await call(grep, ctx, pattern="content", glob="src/**/m*.py")).splitlines() == [
        "src/pkg/mod.py:1: content of src/pkg/mod.py"
    ]


async def test_grep_skips_binary_git_and_outside_symlinks(
    ws: Path, outside: Path, ctx: ToolContext
) -> None:
    (ws / "blob.bin").write_bytes(b"SECRET\x00SECRET")
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("SECRET\n")
    (ws / "leak.txt").symlink_to(outside / "secret.txt")
    (ws / "out").symlink_to(outside)
    (ws / "plain.txt").write_text("SECRET here\n")
    assert await call(grep, ctx, pattern="SECRET") == "plain.txt:1: SECRET here"
    with pytest.raises(ToolCallError, match="outside the workspace"):
        await call(grep, ctx, pattern="SECRET", path="leak.txt")


async def test_grep_invalid_regex_is_a_model_error(ws: Path, ctx: ToolContext) -> None:
    with pytest.raises(ToolCallError, match="invalid regular expression '\\(unclosed'"):
        await call(grep, ctx, pattern="(unclosed")


async def test_grep_caps_matches_and_long_lines(ws: Path, ctx: ToolContext) -> None:
    (ws / "many.txt").write_text("hit\n" * (GREP_MAX_MATCHES + 50))
    (ws / "wide.txt").write_text("hit" + "z" * 1000 + "\n")
    lines = (await call(grep, ctx, pattern="hit", path="many.txt")).splitlines()
    assert len(lines) == GREP_MAX_MATCHES + 1
    assert lines[-1].startswith(f"[stopped after {GREP_MAX_MATCHES} matches")
    wide = await call(grep, ctx, pattern="hit", path="wide.txt")
    assert wide.endswith(" [...]")
    assert len(wide) < 400


# ---------------------------------------------------------------- claims


def test_claims_use_canonical_keys_and_workspace_relative_labels(
    tree: Path, ctx: ToolContext
) -> None:
    (tree / "alias").symlink_to("src")
    assert read_file.claims is not None
    assert write_file.claims is not None
    assert edit_file.claims is not None
    assert grep.claims is not None
    assert list_files.claims is not None
    assert shell.claims is not None

    def rendered(claims: Sequence[ResourceClaim]) -> list[str]:
        return [c.render() for c in claims]

    mod = read_file.claims({"path": "alias/pkg/../pkg/mod.py"}, ctx)
    assert rendered(mod) == ["read file:src/pkg/mod.py"]
    assert mod[0].key == str(tree / "src" / "pkg" / "mod.py")  # the real path is the key
    assert mod == read_file.claims({"path": str(tree / "src/pkg/mod.py")}, ctx)
    new = write_file.claims({"path": "new.txt", "content": ""}, ctx)
    assert rendered(new) == ["write file:new.txt"]
    edit = {"path": "README.md", "old_string": "a", "new_string": "b"}
    assert rendered(edit_file.claims(edit, ctx)) == ["write file:README.md"]
    assert rendered(grep.claims({"pattern": "x", "path": "alias"}, ctx)) == ["read file:src/**"]
    assert rendered(list_files.claims({}, ctx)) == ["read file:./**"]
    assert rendered(shell.claims({"command": "ls"}, ctx)) == [
        "write file:./**",
        "actor:sandbox:bubblewrap",
    ]
    with pytest.raises(ToolCallError, match="outside the workspace"):
        read_file.claims({"path": "../x"}, ctx)


# ---------------------------------------------------------------- shell


async def test_shell_returns_combined_output_and_exit_code(ws: Path, ctx: ToolContext) -> None:
    out = await call(shell, ctx, command="echo out; echo err >&2; pwd")
    assert out == f"out\nerr\n{ws}\n[exit code 0]"


async def test_shell_nonzero_exit_is_a_normal_result(ctx: ToolContext) -> None:
    result = await shell.handler({"command": "echo failing; exit 3"}, ctx)
    assert result == "failing\n[exit code 3]"
    assert await call(shell, ctx, command="true") == "(no output)\n[exit code 0]"
    assert await call(shell, ctx, command="kill -KILL $$") == (
        "(no output)\n[exit code -9: killed by signal SIGKILL]"
    )


async def test_shell_environment_is_scrubbed(
    ws: Path, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-should-not-leak")
    out = await call(shell, ctx, command='echo "key=${FAKE_API_KEY:-unset} home=$HOME"; env')
    assert out.splitlines()[0] == f"key=unset home={ws}"
    assert "should-not-leak" not in out
    names = {line.split("=", 1)[0] for line in out.splitlines()[1:-1]}
    # bash adds PWD, SHLVL and _ itself; nothing else comes from our environment.
    assert names <= {"PATH", "HOME", "LANG", "PWD", "SHLVL", "_"}


# On the host (backend "none") a killed command's process group must die too; the
# sandboxed default is covered by tests/sandbox.
host_shell = shell_tool(SandboxPolicy(backend="none"))


async def test_shell_timeout_kills_the_process_group(ws: Path, ctx: ToolContext) -> None:
    started = time.monotonic()
    result = await host_shell.handler(
        {"command": "echo started; sleep 30 & echo $! > bg.pid; sleep 30", "timeout_s": 0.5},
        ctx,
    )
    elapsed = time.monotonic() - started
    assert elapsed < 5
    assert isinstance(result, ToolOutput)
    assert result.is_error
    assert result.content.startswith("started\n")
    assert "[timed out after 0.5 s; the command and its children were killed]" in result.content
    await _assert_process_ends(int((ws / "bg.pid").read_text()))


async def test_shell_cancellation_kills_the_process_group(ws: Path, ctx: ToolContext) -> None:
    async def run() -> object:
        return await host_shell.handler({"command": "sleep 30 & echo $! > bg.pid; wait"}, ctx)

    task = asyncio.create_task(run())
    pid_file = ws / "bg.pid"
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.01)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 5  # killed, not waited for
    await _assert_process_ends(int(pid_file.read_text()))


def _has_ended(pid: int) -> bool:
    # A killed child may linger as a zombie until init reaps it; that counts as ended.
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


async def _assert_process_ends(pid: int) -> None:
    for _ in range(200):
        if _has_ended(pid):
            return
        await asyncio.sleep(0.01)
    os.kill(pid, 9)
    pytest.fail(f"process {pid} survived its shell command")


async def test_shell_caps_output_keeping_head_and_tail(ctx: ToolContext) -> None:
    out = await call(
        shell, ctx, command="echo BEGIN; head -c 200000 /dev/zero | tr '\\0' x; echo; echo END"
    )
    assert len(out) < SHELL_MAX_OUTPUT_CHARS + 300
    assert out.startswith("BEGIN\n")
    assert out.endswith("END\n[exit code 0]")
    assert "[... output cut: 200011 bytes in total" in out


def test_capped_output_keeps_bounded_memory() -> None:
    sink = _CappedOutput(100)
    sink.feed(b"H" * 150)
    for _ in range(1000):
        sink.feed(b"m" * 1000)
    sink.feed(b"T" * 150)
    assert sink.total == 1_000_300
    assert sink.retained <= 400
    text = sink.text()
    assert text.startswith("H" * 50 + "\n[... output cut: 1000300 bytes in total")
    assert text.endswith("\n" + "T" * 50)


async def test_shell_does_not_block_the_event_loop(ctx: ToolContext) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.02)

    tick_task = asyncio.create_task(ticker())
    try:
        await call(shell, ctx, command="sleep 0.5")
    finally:
        tick_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await tick_task
    assert ticks >= 10


async def test_shell_rejects_a_non_positive_timeout(ctx: ToolContext) -> None:
    with pytest.raises(ToolCallError, match="timeout_s"):
        await shell.handler({"command": "true", "timeout_s": 0}, ctx)

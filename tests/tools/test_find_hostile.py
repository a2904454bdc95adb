"""Hostile patterns and globs for grep and list_files: they finish, or fail with a message
the model can act on.

A backtracking engine (Python's ``re``) takes exponential time on ``^(a+)+$`` against a
long run of ``a`` that ends in ``b``, and polynomial time of high degree on a glob such as
``*a*a*a*a*a*a*b``; the finding tools use RE2, which is linear. The hang tests run the
tool in a real child process: a backtracking search cannot be interrupted from inside the
process that runs it (it holds the GIL), so the child is killed (SIGKILL) if it has not
answered by the deadline, which is minutes beyond what the search needs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lodger.errors import ToolCallError
from lodger.tools.find import grep, list_files
from lodger.tools.spec import Tool, ToolContext

_CHILD = """
import asyncio, json, sys
from pathlib import Path
from lodger.tools.find import grep, list_files
from lodger.tools.spec import ToolContext

tool = {"grep": grep, "list_files": list_files}[sys.argv[1]]
ctx = ToolContext(
    session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o",
    workspace=Path(sys.argv[2]),
)
print(asyncio.run(tool.handler(json.loads(sys.argv[3]), ctx)))
"""
# Generous: RE2 answers these in milliseconds; Python's re would need longer than the
# age of the universe, so only a hang can reach it.
_DEADLINE_S = 60


def in_child(tool: str, ws: Path, **arguments: object) -> str:
    """Run a finding tool in a real child process; fail if it is still running at the deadline."""
    command = [sys.executable, "-c", _CHILD, tool, str(ws), json.dumps(arguments)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_DEADLINE_S)
    except subprocess.TimeoutExpired:  # subprocess.run has killed the child (SIGKILL)
        pytest.fail(f"{tool}({arguments}) did not finish within {_DEADLINE_S} s")
    assert done.returncode == 0, done.stderr
    return done.stdout.rstrip("\n")


async def call(t: Tool, ctx: ToolContext, **arguments: object) -> str:
    result = await t.handler(dict(arguments), ctx)
    assert isinstance(result, str)
    return result


def test_grep_catastrophic_pattern_finishes(ws: Path) -> None:
    (ws / "evil.txt").write_text("a" * 100_000 + "b\n" + "aaaa\n")
    out = in_child("grep", ws, pattern="^(a+)+$")
    assert out == "evil.txt:2: aaaa"


@pytest.mark.slow
def test_list_files_hostile_glob_finishes(ws: Path) -> None:
    # One name segment of 200 'a's (no 'b'), and a path 40 directories deep.
    (ws / ("a" * 200)).write_text("")
    deep = ws.joinpath(*(["d"] * 40))
    deep.mkdir(parents=True)
    (deep / "leaf.txt").write_text("")
    stars = "*a" * 14 + "*b"  # [^/]*a[^/]*a...: O(n^15) steps to fail in a backtracker
    assert in_child("list_files", ws, pattern=stars) == f"no entries match {stars!r} under '.'"
    alternatives = "{*,*}" * 30 + "b"  # 2^30 ways to split a name between the alternatives
    out = in_child("list_files", ws, pattern=alternatives)
    assert out == f"no entries match {alternatives!r} under '.'"
    globstars = "**/" * 12 + "x"  # nested (?:[^/]*/)* over 40 directories
    assert in_child("list_files", ws, pattern=globstars).startswith("no entries match")


def test_grep_hostile_glob_finishes(ws: Path) -> None:
    (ws / ("a" * 200)).write_text("needle\n")
    (ws / ("a" * 14 + "b")).write_text("needle\n")
    out = in_child("grep", ws, pattern="needle", glob="*a" * 14 + "*b")
    assert out == "aaaaaaaaaaaaaab:1: needle"


async def test_grep_names_unsupported_syntax_and_how_to_do_without(
    ws: Path, ctx: ToolContext
) -> None:
    (ws / "a.txt").write_text("abab\n")
    cases = {
        r"(ab)\1": "a backreference (\\1)",
        r"foo(?=bar)": "a lookahead (?=...)",
        r"foo(?!bar)": "a negative lookahead (?!...)",
        r"(?<=x)y": "a lookbehind (?<=...)",
        r"(?<!x)y": "a negative lookbehind (?<!...)",
        r"(?P<w>a)(?P=w)": "a named backreference (?P=name)",
        r"a++": "a possessive quantifier (++)",
        r"end\Z": "\\Z",
    }
    for pattern, feature in cases.items():
        with pytest.raises(ToolCallError) as caught:
            await call(grep, ctx, pattern=pattern)
        message = str(caught.value)
        assert f"uses {feature}, which grep does not support" in message, message
        assert caught.value.code == "unsupported_pattern"
        assert caught.value.hint  # what to do instead
    with pytest.raises(ToolCallError, match=r"use \\z or \$"):
        await call(grep, ctx, pattern=r"end\Z")


async def test_grep_keeps_common_python_syntax(ws: Path, ctx: ToolContext) -> None:
    (ws / "m.py").write_text("def main():\n    x = 42\n    return café(x)\n")
    assert await call(grep, ctx, pattern=r"(?P<name>\w+)\(\)") == "m.py:1: def main():"
    assert await call(grep, ctx, pattern=r"\d{2}$") == "m.py:2:     x = 42"
    assert await call(grep, ctx, pattern=r"CAFÉ\(", ignore_case=True) == (
        "m.py:3:     return café(x)"
    )
    assert await call(grep, ctx, pattern=r"(?i)RETURN\s+\w+") == "m.py:3:     return café(x)"
    with pytest.raises(ToolCallError, match="invalid regular expression '\\[z-a\\]'"):
        await call(grep, ctx, pattern="[z-a]")
    with pytest.raises(ToolCallError, match="too large to compile"):
        await call(grep, ctx, pattern="x" * 5_000_000)


async def test_glob_literals_and_bad_classes(ws: Path, ctx: ToolContext) -> None:
    for name in ("a+b.txt", "a(b).txt", "c[1].txt", "x$^|.txt", "back\\slash"):
        (ws / name).write_text("")
    assert await call(list_files, ctx, pattern="a+b.*") == "a+b.txt"
    assert await call(list_files, ctx, pattern="a(b).txt") == "a(b).txt"
    assert await call(list_files, ctx, pattern="c[[]1].txt") == "c[1].txt"
    assert await call(list_files, ctx, pattern="x$^|.txt") == "x$^|.txt"
    assert await call(list_files, ctx, pattern="back\\*") == "back\\slash"
    with pytest.raises(ToolCallError, match="invalid glob pattern"):
        await call(list_files, ctx, pattern="[z-a]*")

"""Every code example in README.md and docs/ runs.

A ```python block runs as a real process in a fresh directory, with only ``src/`` on the
path, and must exit 0; a ```console block runs its ``$ `` lines in order as one shell
script (``lodger`` is this checkout's CLI), each of which must succeed. A block that is
not meant to run says so on the line before it with ``<!-- no-run -->``; keep those rare.
A line ``--8<-- "path"`` (pymdownx.snippets) is replaced by that file of the repository,
as the site shows it; such a block runs in the full suite only (marked slow), as
``tests/test_examples.py`` runs the ``examples/`` files it includes.
Other fences (```sh, ```toml, ```json, ```text ...) are shown, not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
NO_RUN = "<!-- no-run -->"
SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$', re.M)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str
    included: bool = False

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        language = match.group(1)
        if language not in ("python", "console"):
            continue
        before = text[: match.start()].rstrip().rsplit("\n", 1)[-1]
        if before.strip() == NO_RUN:
            continue
        line = text.count("\n", 0, match.start()) + 1
        code = match.group(2)
        expanded = SNIPPET.sub(lambda m: (ROOT / m.group(1)).read_text(encoding="utf-8"), code)
        found.append(Block(page, line, language, expanded, included=expanded != code))
    return found


ALL = [block for page in PAGES for block in blocks(page)]


def environment(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    shim = bin_dir / "lodger"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m lodger "$@"\n')
    shim.chmod(0o755)
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "TMPDIR": str(tmp_path),
        "LODGER_STATE": str(tmp_path / "work" / ".lodger"),
    }


def test_the_pages_have_examples_of_both_kinds() -> None:
    kinds = {(block.page.name, block.language) for block in ALL}
    assert ("README.md", "python") in kinds
    assert ("README.md", "console") in kinds
    assert ("quickstart.md", "python") in kinds
    assert ("quickstart.md", "console") in kinds


def test_a_no_run_marker_skips_only_its_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nprint(1)\n```\n\n<!-- no-run -->\n```python\nraise SystemExit(1)\n```\n"
        "\n```sh\nfalse\n```\n\n```console\n$ lodger --help\n```\n"
    )
    found = blocks(page)
    assert [(b.language, b.code) for b in found] == [
        ("python", "print(1)\n"),
        ("console", "$ lodger --help\n"),
    ]


def test_a_snippet_line_is_the_file_it_names(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text('```python\n--8<-- "examples/deps.py"\n```\n\n```python\nprint(2)\n```\n')
    included, plain = blocks(page)
    assert included.code == (ROOT / "examples" / "deps.py").read_text(encoding="utf-8")
    assert included.included and not plain.included


HEREDOC = re.compile(r"<<-?'?(\w+)'?\s*$")


def console_script(code: str) -> str:
    """The block's ``$ `` lines; one that opens a here-document (``cat > f <<'EOF'``)
    takes the lines after it up to its delimiter, as a shell would."""
    commands: list[str] = []
    delimiter: str | None = None
    for line in code.splitlines():
        if delimiter is not None:
            commands.append(line)
            if line == delimiter:
                delimiter = None
        elif line.startswith("$ "):
            commands.append(line[2:])
            heredoc = HEREDOC.search(line)
            delimiter = heredoc.group(1) if heredoc else None
    assert commands, "a console block without a `$ ` line"
    assert delimiter is None, f"a here-document without its closing {delimiter}"
    return "set -eu\n" + "\n".join(commands) + "\n"


def test_a_console_here_document_keeps_its_lines() -> None:
    code = "$ cat > a.txt <<'EOF'\none\n  two\nEOF\n$ cat a.txt\none\n  two\n"
    assert console_script(code) == "set -eu\ncat > a.txt <<'EOF'\none\n  two\nEOF\ncat a.txt\n"


# A console block starts several CLI processes (5-6 s): the full run takes those.
@pytest.mark.parametrize(
    "block",
    [
        pytest.param(
            b,
            id=b.id,
            marks=pytest.mark.slow if b.language == "console" or b.included else (),
        )
        for b in ALL
    ],
)
def test_example_runs(block: Block, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = environment(tmp_path)
    if block.language == "python":
        command = [sys.executable, "-c", block.code]
    else:
        command = ["bash", "-c", console_script(block.code)]
    done = subprocess.run(
        command, cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"{block.id} exited {done.returncode}:\n{done.stderr[-4000:]}"

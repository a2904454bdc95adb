"""``lodger rewind`` as a user runs it: real processes, a real SQLite log, a real
workspace. A rewind restores files, refuses over the user's edit (naming it, exit 3),
goes through with --force, and is undone; ``log show`` shows the new branch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def lodger(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "NO_COLOR": "1"}
    env.pop("LODGER_STATE", None)
    return subprocess.run(
        [sys.executable, "-m", "lodger", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
        env=env,
    )


def script(path: Path, *calls: dict[str, object]) -> str:
    path.write_text(json.dumps([{"calls": list(calls)}, {"text": "done"}]))
    return f"script:{path}"


def test_rewind_refuse_force_and_undo_through_the_cli(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (ws / "a.txt").write_text("one\n")
    first = script(
        scripts / "1.json", {"name": "write_file", "args": {"path": "a.txt", "content": "two\n"}}
    )
    second = script(
        scripts / "2.json",
        {"name": "edit_file", "args": {"path": "a.txt", "old_string": "two", "new_string": "3"}},
        {"name": "write_file", "args": {"path": "b.txt", "content": "bee\n"}},
    )
    for model in (first, second):
        ran = lodger("run", "go", "--model", model, "--yes", "--session", "s", cwd=ws)
        assert ran.returncode == 0, ran.stderr
    assert (ws / "a.txt").read_text() == "3\n"

    done = lodger("rewind", "s", "--turn", "2", cwd=ws)
    assert done.returncode == 0, done.stderr
    assert "now on branch s..r1; 1 file(s) restored, 1 removed" in done.stdout
    assert "undo: lodger rewind s --undo" in done.stdout
    assert (ws / "a.txt").read_text() == "two\n" and not (ws / "b.txt").exists()
    shown = lodger("log", "show", "s", cwd=ws)
    assert shown.returncode == 0, shown.stderr
    assert "session s..r1" in shown.stdout
    assert "rewound  to offset" in shown.stdout and "left s at offset" in shown.stdout
    first_log = lodger("log", "show", "s..r0", "--all", cwd=ws)
    assert "file checkpoint  a.txt" in first_log.stdout

    (ws / "a.txt").write_text("mine\n")
    refused = lodger("rewind", "s", "--undo", cwd=ws)
    assert refused.returncode == 3
    assert "refused:" in refused.stderr and "'a.txt'" in refused.stderr
    assert "--force" in refused.stderr
    assert (ws / "a.txt").read_text() == "mine\n"

    forced = lodger("rewind", "s", "--undo", "--force", "--json", cwd=ws)
    assert forced.returncode == 0, forced.stderr
    answer = json.loads(forced.stdout)
    assert (answer["branch"], answer["forced"], answer["source"]) == ("s..r2", ["a.txt"], "s")
    assert (ws / "a.txt").read_text() == "3\n" and (ws / "b.txt").read_text() == "bee\n"
    # the user's edit was kept by the branch left behind: rewinding to it brings it back
    back = lodger("rewind", "s", "--branch", "s..r1", cwd=ws)
    assert back.returncode == 0, back.stderr
    assert (ws / "a.txt").read_text() == "mine\n"
    assert lodger("log", "verify", "s..r0", cwd=ws).returncode == 0


def test_rewind_usage_errors_are_one_line_each(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    model = script(
        tmp_path / "s.json", {"name": "write_file", "args": {"path": "a", "content": "x"}}
    )
    assert lodger("run", "go", "--model", model, "--yes", "--session", "s", cwd=ws).returncode == 0
    nothing = lodger("rewind", "s", cwd=ws)
    assert nothing.returncode == 2 and "give --to OFFSET" in nothing.stderr
    beyond = lodger("rewind", "s", "--turn", "4", cwd=ws)
    assert beyond.returncode == 2
    assert "error: 's' has no turn 4: it holds turns 1 to 1" in beyond.stderr
    unknown = lodger("rewind", "nope", "--turn", "1", cwd=ws)
    assert unknown.returncode == 4, unknown.stderr
    assert "Traceback" not in beyond.stderr + unknown.stderr

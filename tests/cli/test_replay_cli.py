"""``lodger replay`` as a user runs it: real processes, a real SQLite log (and a file://
object store), a real workspace. The replay prints a table naming the divergence, writes
the JSON report, leaves the workspace as it was, and refuses a point inside a turn."""

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
    env.pop("LODGER_STORE", None)
    return subprocess.run(
        [sys.executable, "-m", "lodger", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
        env=env,
    )


def script(path: Path, steps: list[dict[str, object]]) -> str:
    path.write_text(json.dumps(steps))
    return f"script:{path}"


def read(path: str) -> dict[str, object]:
    return {"calls": [{"name": "read_file", "args": {"path": path}}]}


def write(path: str, content: str) -> dict[str, object]:
    return {"calls": [{"name": "write_file", "args": {"path": path, "content": content}}]}


@pytest.mark.parametrize("where", ["state", "store"])
def test_replay_prints_the_divergence_and_writes_json(tmp_path: Path, where: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    flags = ["--store", f"file://{tmp_path / 'objects'}"] if where == "store" else []
    source = script(
        tmp_path / "source.json", [read("a.txt"), write("b.txt", "one\n"), {"text": "done"}]
    )
    other = script(
        tmp_path / "other.json",
        [read("a.txt"), write("b.txt", "one\n"), write("c.txt", "two\n"), {"text": "other"}],
    )
    ran = lodger("run", "go", "--model", source, "--yes", "--session", "s", *flags, cwd=ws)
    assert ran.returncode == 0, ran.stderr
    before = sorted(p.name for p in ws.iterdir())

    out = tmp_path / "report.json"
    done = lodger("replay", "s", "--model", other, "--json", str(out), *flags, cwd=ws)
    assert done.returncode == 0, done.stderr
    assert "the trajectories diverge at step 3" in done.stdout
    assert "write_file" in done.stdout and "other" in done.stdout
    report = json.loads(out.read_text())
    assert report["diverged_at"]["step"] == 3
    assert report["answered"] == {"recorded": 2, "live": 0, "sandbox": 1, "parked": 0}
    assert report["answers"] == [{"turn": 1, "source": "done", "replay": "other"}]
    assert sorted(p.name for p in ws.iterdir()) == before  # no c.txt: it went to the sandbox
    assert (ws / "b.txt").read_text() == "one\n"

    # the replay is a session of its own: its log names what it replays
    shown = lodger("log", "show", report["replay_session"], *flags, cwd=ws)
    assert shown.returncode == 0, shown.stderr
    assert "replay" in shown.stdout

    stdout = lodger("replay", "s", "--model", source, "--json", "-", *flags, cwd=ws)
    assert stdout.returncode == 0, stdout.stderr
    assert json.loads(stdout.stdout)["diverged_at"] is None


def test_replay_refuses_a_point_inside_a_turn(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    model = script(tmp_path / "s.json", [read("x.txt"), {"text": "done"}])
    assert lodger("run", "go", "--model", model, "--yes", "--session", "s", cwd=ws).returncode == 0
    done = lodger("replay", "s", "--model", model, "--at", "3", cwd=ws)
    assert done.returncode == 2, done.stdout
    assert "inside a turn" in done.stderr and "hint:" in done.stderr
    missing = lodger("replay", "nope", "--model", model, cwd=ws)
    assert missing.returncode == 4, missing.stderr


def test_replay_with_a_function_model_a_tools_file_registers(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    model = script(tmp_path / "s.json", [read("a.txt"), {"text": "done"}])
    assert lodger("run", "go", "--model", model, "--yes", "--session", "s", cwd=ws).returncode == 0
    candidate = tmp_path / "candidate.py"
    candidate.write_text(
        "from lodger import tool\n"
        "from lodger.providers import register_function\n"
        "@tool\n"
        "def ping() -> str:\n"
        "    'Answer pong.'\n"
        "    return 'pong'\n"
        "register_function('candidate', lambda request: 'straight to the answer')\n"
    )
    done = lodger(
        "replay",
        "s",
        "--model",
        "function:candidate",
        "--tools",
        str(candidate),
        "--json",
        "-",
        cwd=ws,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["models"]["replay"] == "function:candidate"
    assert report["diverged_at"]["step"] == 1
    assert report["calls"]["removed"] == [{"tool": "read_file", "arguments": {"path": "a.txt"}}]
    unknown = lodger("replay", "s", "--model", "function:nobody", cwd=ws)
    assert unknown.returncode == 2 and "no model function is registered" in unknown.stderr

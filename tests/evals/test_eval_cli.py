"""``lodger eval`` and the pytest plugin as a user runs them: real processes on a sample eval
file (20 cases, two function models), a real SQLite log or a file:// object store."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SAMPLE = Path(__file__).parent / "samples" / "arithmetic.py"
SHORTCUT = sum(1 for i in range(20) if i + (i * 3) % 7 >= 10)  # the cases v2 gets wrong


def run(
    *argv: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "NO_COLOR": "1"}
    for name in ("LODGER_STATE", "LODGER_STORE"):
        base.pop(name, None)
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        check=False,
        env={**base, **(env or {})},
    )


@pytest.mark.parametrize("where", ["state", "store"])
def test_lodger_eval_prints_writes_json_and_compares_with_a_baseline(
    tmp_path: Path, where: str
) -> None:
    file = tmp_path / "eval_arithmetic.py"
    shutil.copy(SAMPLE, file)
    flags = ["--store", f"file://{tmp_path / 'objects'}"] if where == "store" else []
    first = tmp_path / "v1.json"
    done = run(
        "-m",
        "lodger",
        "eval",
        str(file),
        "--suite",
        "arith-v1",
        "--json",
        str(first),
        *flags,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "arith-v1 (function:arith-v1): 20 of 20 passed" in done.stdout
    report = json.loads(first.read_text())["runs"][0]
    assert report["summary"]["passed"] == 20

    # the same suite with the other model, against v1's report: side by side
    second = run(
        *("-m", "lodger", "eval", str(file), "--suite", "arith-v1", "--baseline", str(first)),
        *("--model", "function:arith-v2", "--json", str(tmp_path / "v2.json")),
        *("--concurrency", "5", *flags),
        cwd=tmp_path,
    )
    assert second.returncode == 1, second.stderr  # some cases fail
    assert f"arith-v1 (function:arith-v2): {20 - SHORTCUT} of 20 passed" in second.stdout
    assert f"20 -> {20 - SHORTCUT} passed, 0 fixed, {SHORTCUT} broke" in second.stdout
    v2 = json.loads((tmp_path / "v2.json").read_text())["runs"][0]
    failed = [c for c in v2["cases"] if not c["passed"]]
    assert len(failed) == SHORTCUT

    # the verdicts are facts on the case's session
    shown = run("-m", "lodger", "log", "show", failed[0]["session_id"], *flags, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "called:add" in shown.stdout and v2["eval_run"] in shown.stdout


def test_an_eval_file_runs_under_pytest_one_test_per_case(tmp_path: Path) -> None:
    file = tmp_path / "eval_arithmetic.py"
    shutil.copy(SAMPLE, file)
    done = run(
        "-m",
        "pytest",
        "-p",
        "lodger.evals.pytest_plugin",
        str(file),
        "-q",
        "-p",
        "no:cacheprovider",
        "--lodger-state",
        str(tmp_path / "state"),
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{SHORTCUT} failed, {40 - SHORTCUT} passed" in done.stdout
    assert "eval case 'add-" in done.stdout and "called:add: failed" in done.stdout
    # one suite's cases, chosen by name: all pass
    ok = run(
        "-m",
        "pytest",
        "-p",
        "lodger.evals.pytest_plugin",
        str(file),
        "-q",
        "-p",
        "no:cacheprovider",
        "--lodger-state",
        str(tmp_path / "state"),
        "-k",
        "arith-v1",
        cwd=tmp_path,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "20 passed, 20 deselected" in ok.stdout

"""Every example in ``examples/`` runs as a real process and checks what it shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_there_are_examples_for_each_library_feature() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {
        "quickstart_sync",
        "structured_output",
        "deps",
        "streaming",
        "hooks",
        "testmodel",
        "function_model",
        "fallback",
        "budgets",
        "images",
        "settings_and_results",
    } <= names


# The fast lane runs the quickstart; every other example runs in the full suite.
@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, id=p.stem, marks=() if p.stem == "quickstart_sync" else pytest.mark.slow)
        for p in EXAMPLES
    ],
)
def test_example_runs(path: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()  # each example prints what it demonstrates
    assert not list(tmp_path.glob(".lodger*"))  # state went to its own temp directory

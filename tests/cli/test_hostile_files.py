"""Hostile files handed to ``lodger run``: a tools file, a script and a ``lodger.toml`` that
are not UTF-8 or are nested 100,000 levels deep. Each ends the command with one error line
and a hint, exit status 2, and no traceback (run as a real process, as a user runs it).

Which error CPython's compiler raises for a deeply nested tools file depends on the
version and the construct (SyntaxError, RecursionError, or a MemoryError without a
message), so those cases check only that the line names the file and says something."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DEPTH = 100_000
OK_SCRIPT = json.dumps([{"text": "hello"}])


def lodger_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "lodger", "run", "hi", "--state", str(tmp_path / "state")]
    return subprocess.run(
        [*command, "--workspace", str(workspace), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_one_clear_error(proc: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("error: ") and lines[1].startswith("hint: ")
    assert not lines[0].endswith(":"), "the error line must say what is wrong"
    for text in expected:
        assert text in lines[0], lines[0]


@pytest.fixture
def ok_script(tmp_path: Path) -> str:
    (tmp_path / "ok.json").write_text(OK_SCRIPT)
    return f"script:{tmp_path / 'ok.json'}"


@pytest.mark.slow
def test_a_script_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "steps.json").write_bytes('[{"text": "café"}]'.encode("latin-1"))
    proc = lodger_run(tmp_path, "--model", f"script:{tmp_path / 'steps.json'}")
    assert_one_clear_error(proc, "steps.json is not UTF-8 text (byte 0xe9 at offset 14)")


@pytest.mark.slow
def test_a_script_nested_100k_deep(tmp_path: Path) -> None:
    (tmp_path / "steps.json").write_text("[" * DEPTH + "]" * DEPTH)
    proc = lodger_run(tmp_path, "--model", f"script:{tmp_path / 'steps.json'}")
    assert_one_clear_error(proc, "steps.json is nested too deeply to read")


@pytest.mark.slow
def test_a_lodger_toml_that_is_not_utf8(tmp_path: Path, ok_script: str) -> None:
    (tmp_path / "ws").mkdir()
    text = '[mcp.servers.x]\ncommand = "café"\n'
    (tmp_path / "ws" / "lodger.toml").write_bytes(text.encode("latin-1"))
    proc = lodger_run(tmp_path, "--model", ok_script)
    assert_one_clear_error(proc, "lodger.toml is not UTF-8 text (byte 0xe9 at offset 30)")


@pytest.mark.slow
@pytest.mark.parametrize(
    "content",
    ["a = " + "[" * DEPTH + "]" * DEPTH, "a = " + "{b = " * DEPTH + "1" + "}" * DEPTH],
    ids=["arrays", "inline-tables"],
)
def test_a_lodger_toml_nested_100k_deep(tmp_path: Path, ok_script: str, content: str) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "lodger.toml").write_text(content + "\n")
    proc = lodger_run(tmp_path, "--model", ok_script)
    assert_one_clear_error(proc, "lodger.toml is nested too deeply to read")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (b'import lodger\nX = "caf\xe9"\n', "SyntaxError: (unicode error) 'utf-8' codec"),
        (b"X = " + b"not " * DEPTH + b"1\n", "failed: MemoryError"),
        (b"X = " + b"1+" * DEPTH + b"1\n", "failed: RecursionError"),
        (b"X = " + b"[" * DEPTH + b"]" * DEPTH + b"\n", "failed: SyntaxError"),
    ],
    ids=["not-utf8", "deep-not", "deep-sum", "deep-list"],
)
def test_a_hostile_tools_file(tmp_path: Path, ok_script: str, source: bytes, expected: str) -> None:
    (tmp_path / "tools.py").write_bytes(source)
    proc = lodger_run(tmp_path, "--model", ok_script, "--tools", str(tmp_path / "tools.py"))
    assert_one_clear_error(proc, "importing tools file", expected)

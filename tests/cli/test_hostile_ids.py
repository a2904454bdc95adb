"""Adversarial audit of the ids the command line takes: an empty (or blank) id is a usage
error naming what was empty, never read as "not given". ``lodger fork S --as ""`` made a
fresh id; ``SESSION ""`` beside ``--last`` (and ``run --session "" --last``) took the
latest session; both wrote a session nobody asked for."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from lodger.cli import main

DEMO = "s-demo"  # 20 events, completed (tests/cli/conftest.py)
CRASHED = "s-crash"  # 6 events, interrupted after T1 of c1

REFUSED = [
    pytest.param(("fork", DEMO, "--as", ""), "empty --as ''", id="fork-as-empty"),
    pytest.param(("fork", DEMO, "--as", " "), "empty --as ' '", id="fork-as-blank"),
    pytest.param(("fork", "--last", "--as", ""), "empty --as ''", id="fork-last-as-empty"),
    pytest.param(("fork", ""), "empty SESSION ''", id="fork-session-empty"),
    pytest.param(("fork", "", "--last"), "empty SESSION ''", id="fork-session-empty-last"),
    pytest.param(("log", "show", "", "--last"), "empty SESSION ''", id="show-empty-last"),
    pytest.param(("log", "verify", " "), "empty SESSION ' '", id="verify-blank"),
    pytest.param(("recover", ""), "empty SESSION ''", id="recover-empty"),
    pytest.param(("abandon", "", "--last"), "empty SESSION ''", id="abandon-empty-last"),
    pytest.param(("resume", "", "--last"), "empty SESSION ''", id="resume-empty-last"),
    pytest.param(("decide", CRASHED, "", "--abandon"), "empty CALL_ID ''", id="decide-call-empty"),
    pytest.param(
        ("decide", "--last", "", "--abandon"), "empty CALL_ID ''", id="decide-last-call-empty"
    ),
    pytest.param(
        ("run", "hi", "--session", "", "--model", "test"),
        "empty --session ''",
        id="run-session-empty",
    ),
    pytest.param(
        ("run", "hi", "--session", "", "--last", "--model", "test"),
        "empty --session ''",
        id="run-session-empty-last",
    ),
    pytest.param(("send", "", "hi"), "invalid session id ''", id="send-empty"),
    pytest.param(
        ("schedule", "", "hi", "--cron", "* * * * *"),
        "invalid session id ''",
        id="schedule-empty",
    ),
]


def _digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` but lock files and SQLite's WAL side files: what a
    refused command must leave as it was."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
        and "locks" not in path.parts
        and "-wal" not in path.name
        and "-shm" not in path.name
    }


@pytest.mark.parametrize(("args", "message"), REFUSED)
def test_an_empty_id_is_a_usage_error_and_writes_nothing(
    state_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    message: str,
) -> None:
    runner = CliRunner(env={"LODGER_STATE": None, "LODGER_STORE": None, "LODGER_DEBUG": None})
    before = _digest(state_dir)
    monkeypatch.chdir(tmp_path)  # a regression's turn would run here, not in the checkout
    result = runner.invoke(main, [*args, "--state", str(state_dir)], catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert lines and lines[0] == f"error: {message}", result.stderr
    assert all(line.startswith(("error: ", "hint: ")) for line in lines), result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""
    assert _digest(state_dir) == before  # no session made, no fact recorded


def test_a_fork_without_as_still_gets_a_fresh_id(state_dir: Path) -> None:
    runner = CliRunner(env={"LODGER_STATE": None, "LODGER_STORE": None, "LODGER_DEBUG": None})
    result = runner.invoke(main, ["fork", DEMO, "--state", str(state_dir), "--json"])
    assert result.exit_code == 0, result.output
    assert '"session_id"' in result.stdout and DEMO not in result.stdout.split('"parent"')[0]

"""``lodger sessions``, ``lodger log show`` and ``lodger log verify`` over real SQLite logs."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from lodger.cli import main
from lodger.cli._common import make_console
from lodger.errors import LodgerError, SessionLockedError, UsageError

DEMO = "s-demo"  # 20 events, completed (see conftest.demo_drafts for the offsets)
CRASHED = "s-crash"  # 6 events, interrupted after T1

# A timeline line: offset, local time, then two spaces per level of depth.
_LINE = re.compile(r"^\s*(?P<offset>\d*)\s+(?:\d\d:\d\d:\d\d\.\d{3})?(?P<indent> +)(?P<text>.*)$")


@pytest.fixture
def runner() -> CliRunner:
    # Wide enough for the sessions table; no state or debug leaking in from the shell.
    env = {"COLUMNS": "200", "NO_COLOR": "1", "LODGER_STATE": None, "LODGER_DEBUG": None}
    return CliRunner(env=env)


def invoke(runner: CliRunner, *args: str | Path) -> Result:
    return runner.invoke(main, [str(arg) for arg in args], catch_exceptions=False)


def tamper(state: Path, session_id: str, offset: int, old: bytes, new: bytes) -> None:
    """Change stored bytes behind lodger's back, as a stray editor or bad disk would."""
    with contextlib.closing(sqlite3.connect(state / "log.sqlite3")) as conn, conn:
        where = 'WHERE session_id = ? AND "offset" = ?'
        (data,) = conn.execute(f"SELECT data FROM events {where}", (session_id, offset)).fetchone()
        assert old in data
        changed = bytes(data).replace(old, new, 1)
        conn.execute(f"UPDATE events SET data = ? {where}", (changed, session_id, offset))


def timeline(output: str) -> list[tuple[int | None, int, str]]:
    """``(offset, indent, text)`` per timeline line, header excluded."""
    rows = []
    for line in output.splitlines()[1:]:
        match = _LINE.match(line)
        assert match is not None, line
        offset = int(match["offset"]) if match["offset"] else None
        rows.append((offset, len(match["indent"]), match["text"]))
    return rows


def find(rows: list[tuple[int | None, int, str]], needle: str) -> int:
    return next(i for i, (_, _, text) in enumerate(rows) if needle in text)


# ---------------------------------------------------------------- sessions


def test_sessions_lists_counts_and_status(runner: CliRunner, state_dir: Path) -> None:
    result = invoke(runner, "sessions", "--state", state_dir)
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}
    assert lines[DEMO][1:4] == ["20", "1", "completed"]
    assert lines[CRASHED][1:4] == ["6", "1", "interrupted"]
    assert lines[DEMO][-1] == "/projects/demo"


def test_sessions_json(runner: CliRunner, state_dir: Path) -> None:
    result = invoke(runner, "sessions", "--state", state_dir, "--json")
    assert result.exit_code == 0
    rows = {row["session_id"]: row for row in json.loads(result.stdout)["sessions"]}
    assert set(rows) == {DEMO, CRASHED}
    demo = rows[DEMO]
    assert (demo["events"], demo["turns"], demo["last_status"]) == (20, 1, "completed")
    assert demo["workspace"] == "/projects/demo"
    assert demo["last_ts"] == 1_700_000_000_730_000
    assert demo["last_activity"].startswith("2023-11-1")  # local ISO date
    assert rows[CRASHED]["last_status"] == "interrupted"


def test_sessions_env_state(runner: CliRunner, state_dir: Path) -> None:
    result = runner.invoke(main, ["sessions", "--json"], env={"LODGER_STATE": str(state_dir)})
    assert {row["session_id"] for row in json.loads(result.stdout)["sessions"]} == {DEMO, CRASHED}


def test_sessions_in_missing_dir_is_empty_and_creates_nothing(
    runner: CliRunner, tmp_path: Path
) -> None:
    missing = tmp_path / "nothing-here"
    result = invoke(runner, "sessions", "--state", missing)
    assert (result.exit_code, result.stdout) == (0, f"no sessions in {missing}\n")
    as_json = invoke(runner, "sessions", "--state", missing, "--json")
    assert (as_json.exit_code, json.loads(as_json.stdout)) == (
        0,
        {"v": 1, "state": str(missing), "sessions": []},
    )
    assert not missing.exists()


def test_sessions_marks_a_corrupt_session(runner: CliRunner, state_dir: Path) -> None:
    tamper(state_dir, DEMO, 8, b"alpha", b"alphA")
    result = invoke(runner, "sessions", "--state", state_dir, "--json")
    assert result.exit_code == 0
    demo = next(row for row in json.loads(result.stdout)["sessions"] if row["session_id"] == DEMO)
    assert (demo["last_status"], demo["events"]) == ("corrupt", 20)
    assert demo["error"]["offset"] == 8
    text = invoke(runner, "sessions", "--state", state_dir)
    assert "corrupt" in text.stdout
    assert "offset 8" in text.stderr


# ---------------------------------------------------------------- log show


def test_show_prints_every_offset(runner: CliRunner, state_dir: Path) -> None:
    result = invoke(runner, "log", "show", DEMO, "--state", state_dir)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"session {DEMO}  20 events")
    rows = timeline(result.stdout)
    assert {offset for offset, _, _ in rows if offset is not None} == set(range(20))
    assert "[tests]" in result.stdout  # event text is never read as rich markup


def test_show_pairs_responses_under_their_calls(runner: CliRunner, state_dir: Path) -> None:
    rows = timeline(invoke(runner, "log", "show", DEMO, "--state", state_dir).stdout)
    c1, c2 = find(rows, "id=c1"), find(rows, "id=c2")
    # Log order is T1 c1 (5), T1 c2 (6), T2 c2 (7), T2 c1 (8); the view groups by call.
    assert [offset for offset, _, _ in rows[c1 : c2 + 3]] == [4, 5, 8, 4, 6, 7]
    assert "alpha contents" in rows[c1 + 2][2]
    assert "bravo contents" in rows[c2 + 2][2]
    assert rows[c1 + 1][1] > rows[c1][1]  # facts are indented under the call
    # Both calls show their T1 -> T2 times, so the overlap is visible.
    assert re.search(r"\.100 -> \S+\.400 \(300 ms\)", rows[c1][2])
    assert re.search(r"\.110 -> \S+\.150 \(40 ms\)", rows[c2][2])
    c3 = find(rows, "id=c3")
    assert "rejected" in rows[c3][2]
    assert rows[c3 + 1][0] == 11
    assert "invisible" in rows[c3 + 1][2]


def test_show_indents_nested_code_mode_call(runner: CliRunner, state_dir: Path) -> None:
    rows = timeline(invoke(runner, "log", "show", DEMO, "--state", state_dir).stdout)
    cell, nested = find(rows, "id=c4"), find(rows, "id=n1")
    assert cell < nested
    assert rows[nested][1] > rows[cell][1]
    assert "[code_mode, hidden]" in rows[nested][2]
    # The cell's own T2 (15) follows the nested call's facts (13, 14), one level up.
    assert [offset for offset, _, _ in rows[cell : cell + 6]] == [10, 12, 13, 13, 14, 15]
    assert rows[cell + 5][1] == rows[cell + 1][1]


def test_show_interrupted_call_has_no_response(runner: CliRunner, state_dir: Path) -> None:
    result = invoke(runner, "log", "show", CRASHED, "--state", state_dir)
    assert result.exit_code == 0
    call = next(line for line in result.stdout.splitlines() if "id=c1" in line)
    assert "dispatched" in call
    assert "-> no response" in call
    texts = [text for _, _, text in timeline(result.stdout)]
    assert any(text.startswith("T1 dispatched") for text in texts)
    assert not any(text.startswith("T2") for text in texts)


def test_show_json_is_the_events(runner: CliRunner, state_dir: Path) -> None:
    result = invoke(runner, "log", "show", DEMO, "--state", state_dir, "--json")
    events = json.loads(result.stdout)["events"]
    assert [event["offset"] for event in events] == list(range(20))
    nested = events[13]
    assert (nested["call_id"], nested["parent_call_id"]) == ("n1", "c4")
    assert (nested["origin"], nested["visibility"]) == ("code_mode", "hidden")
    assert all(len(event["digest"]) == 64 for event in events)


def test_show_corrupt_log_prints_no_timeline(runner: CliRunner, state_dir: Path) -> None:
    tamper(state_dir, DEMO, 8, b"alpha", b"alphA")
    result = invoke(runner, "log", "show", DEMO, "--state", state_dir)
    assert result.exit_code == 1
    assert result.stdout == ""
    error, hint = result.stderr.splitlines()
    assert error.startswith("error: log for session 's-demo' is invalid at offset 8")
    assert hint.startswith("hint: ")
    assert "Traceback" not in result.stderr


def test_unknown_session_exits_4_with_hint(runner: CliRunner, state_dir: Path) -> None:
    result = invoke(runner, "log", "show", "nope", "--state", state_dir)
    assert result.exit_code == 4  # not found
    assert result.stderr.splitlines() == [
        "error: no log for session 'nope'",
        "hint: list the sessions of this state directory to find the id",
        f"next: lodger sessions --state {state_dir}",
    ]


def test_show_in_missing_state_dir_creates_nothing(runner: CliRunner, tmp_path: Path) -> None:
    result = invoke(runner, "log", "show", DEMO, "--state", tmp_path / "typo")
    assert result.exit_code == 4  # not found
    assert "lodger sessions" in result.stderr
    assert not (tmp_path / "typo").exists()


def test_invalid_session_id_is_a_usage_error(runner: CliRunner, state_dir: Path) -> None:
    result = invoke(runner, "log", "verify", "../etc", "--state", state_dir)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: invalid session id '../etc'\nhint: ")


# ---------------------------------------------------------------- log verify


def test_verify_good_log(runner: CliRunner, state_dir: Path) -> None:
    result = invoke(runner, "log", "verify", DEMO, "--state", state_dir)
    assert result.exit_code == 0
    assert re.fullmatch(
        r"ok: session s-demo verified, 20 events, head digest [0-9a-f]{64}\n"
        r"chain: sha256 \(unkeyed\): detects accidental damage, not a rewrite by someone who "
        r"can write the state directory\n",
        result.stdout,
    )
    verified = invoke(runner, "log", "verify", DEMO, "--state", state_dir, "--json")
    shown = json.loads(invoke(runner, "log", "show", DEMO, "--state", state_dir, "--json").stdout)
    assert json.loads(verified.stdout) == {
        "v": 1,
        "ok": True,
        "session_id": DEMO,
        "high_water": 20,
        "digest": shown["events"][-1]["digest"],
        "chain": "sha256",
        "key_id": None,
        "configured_key_id": None,
    }


def test_verify_names_the_tampered_offset(runner: CliRunner, state_dir: Path) -> None:
    tamper(state_dir, DEMO, 7, b"bravo", b"bravO")
    result = invoke(runner, "log", "verify", DEMO, "--state", state_dir)
    assert result.exit_code == 1
    assert result.stdout == ""
    line, hint = result.stderr.splitlines()
    assert line.startswith("error: log for session 's-demo' is invalid at offset 7:")
    assert "digest" in line
    assert hint.startswith("hint: ") and "offset 7" in hint
    as_json = invoke(runner, "log", "verify", DEMO, "--state", state_dir, "--json")
    assert as_json.exit_code == 1
    report = json.loads(as_json.stdout)
    assert report["ok"] is False
    assert (report["error"]["code"], report["error"]["offset"]) == ("digest_mismatch", 7)
    # The other session is untouched.
    assert invoke(runner, "log", "verify", CRASHED, "--state", state_dir).exit_code == 0


def test_verify_with_debug_shows_the_traceback(runner: CliRunner, state_dir: Path) -> None:
    tamper(state_dir, DEMO, 0, b"/projects/demo", b"/projects/demO")
    result = invoke(runner, "--debug", "log", "verify", DEMO, "--state", state_dir)
    assert result.exit_code == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.splitlines()[-2].startswith(
        "error: log for session 's-demo' is invalid at offset 0:"
    )


# ---------------------------------------------------------------- the real console script


def _lodger(*args: str | Path, debug: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LODGER_")}
    env["NO_COLOR"] = "1"
    command = [sys.executable, "-c", "from lodger.cli import main; main()"]
    command += ["--debug"] if debug else []
    return subprocess.run(
        command + [str(arg) for arg in args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_subprocess_verify_good_then_tampered(state_dir: Path) -> None:
    good = _lodger("log", "verify", DEMO, "--state", state_dir)
    assert (good.returncode, good.stderr) == (0, "")
    assert good.stdout.startswith("ok: session s-demo verified, 20 events")
    tamper(state_dir, DEMO, 14, b"no such file", b"no such filE")
    bad = _lodger("log", "verify", DEMO, "--state", state_dir)
    assert bad.returncode == 1
    line, hint = bad.stderr.splitlines()
    assert "offset 14" in line
    assert hint.startswith("hint: ")
    assert "Traceback" not in bad.stderr


@pytest.mark.slow
def test_subprocess_unknown_session_and_debug(state_dir: Path) -> None:
    plain = _lodger("log", "show", "nope", "--state", state_dir)
    assert plain.returncode == 4  # not found
    assert plain.stderr.splitlines()[-2].startswith("hint: list the sessions")
    assert plain.stderr.splitlines()[-1].startswith("next: lodger sessions")
    assert "Traceback" not in plain.stderr
    debug = _lodger("log", "show", "nope", "--state", state_dir, debug=True)
    assert debug.returncode == 4
    assert "Traceback (most recent call last)" in debug.stderr
    assert "SessionNotFoundError" in debug.stderr


@pytest.mark.slow
def test_subprocess_sessions(state_dir: Path) -> None:
    result = _lodger("sessions", "--state", state_dir, "--json")
    assert result.returncode == 0
    assert {row["session_id"] for row in json.loads(result.stdout)["sessions"]} == {DEMO, CRASHED}


# ---------------------------------------------------------------- the error boundary


@pytest.fixture
def failing_command() -> Iterator[Callable[[BaseException], None]]:
    """Register a throwaway ``lodger boom`` that raises the given exception."""

    def register(exc: BaseException) -> None:
        @click.command("boom")
        def boom() -> None:
            raise exc

        main.add_command(boom)

    yield register
    main.commands.pop("boom", None)


@pytest.mark.parametrize(
    ("exc", "code", "stderr"),
    [
        (
            SessionLockedError("session 's' is being written by pid 7", hint="wait for it"),
            1,
            "error: session 's' is being written by pid 7\nhint: wait for it\n",
        ),
        (LodgerError("two\nlines"), 1, "error: two lines\n"),
        (UsageError("bad option", hint="see --help"), 2, "error: bad option\nhint: see --help\n"),
        (KeyboardInterrupt(), 130, "interrupted\n"),
    ],
)
def test_errors_print_one_line_and_exit_code(
    runner: CliRunner,
    failing_command: Callable[[BaseException], None],
    exc: BaseException,
    code: int,
    stderr: str,
) -> None:
    failing_command(exc)
    result = invoke(runner, "boom")
    assert (result.exit_code, result.stderr, result.stdout) == (code, stderr, "")


def test_debug_shows_the_traceback(
    runner: CliRunner, failing_command: Callable[[BaseException], None]
) -> None:
    failing_command(LodgerError("went wrong"))
    result = invoke(runner, "--debug", "boom")
    assert result.exit_code == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.endswith("error: went wrong\n")


# ---------------------------------------------------------------- help and options


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the root group loads its commands on demand
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        yield (*path, name)


def test_every_command_has_help_with_example_and_state(runner: CliRunner) -> None:
    paths = list(_commands(main))
    assert {("sessions",), ("log",), ("log", "show"), ("log", "verify")} <= set(paths)
    assert "Example:" in invoke(runner, "--help").stdout
    for path in paths:
        result = invoke(runner, *path, "--help")
        assert result.exit_code == 0, path
        assert "Example:" in result.stdout, path
        command = main
        for name in path:
            assert isinstance(command, click.Group)
            command = command.get_command(click.Context(command), name)  # type: ignore[assignment]
        # `lodger trust` keeps its records in the user's config directory, no state, and
        # `lodger mcp` its logins there (or in a control plane: --control)
        if not isinstance(command, click.Group) and path != ("trust",) and path[0] != "mcp":
            assert "--state DIR" in result.stdout, path


def test_version(runner: CliRunner) -> None:
    result = invoke(runner, "--version")
    assert (result.exit_code, result.stdout) == (0, "lodger, version 0.1.0\n")


def test_console_honors_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    assert make_console().no_color
    monkeypatch.delenv("NO_COLOR")
    assert not make_console().no_color

"""A state directory on a read-only or full disk, for real: a read-only bind mount and a
tiny tmpfs (as root), or permission bits (as any other user).

Inspection (``sessions``, ``log show``, ``log verify``, ``recover``) works on a read-only
directory, including the WAL a killed writer left behind; commands that write (``run``,
``decide``) and every command on a full disk end with one line naming the path, never a
traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from lodger.cli import main

DEMO = "s-demo"
CRASHED = "s-crash"
KILLED = "s-killed"

# Appends one batch to session s-killed through the real SQLite store, then SIGKILLs
# itself (FaultyLogStore.crash_after): its events stay in the WAL, beside a -shm file.
KILLED_WRITER = """
import asyncio, sys
from lodger.events import EventDraft, SessionStarted, TurnStarted
from lodger.storage import EventLog, SqliteLogStore
from lodger.testing import FaultyLogStore

async def main():
    log = EventLog(FaultyLogStore(SqliteLogStore(sys.argv[1]), crash_after=1))
    writer = await log.open_writer("s-killed")
    drafts = [
        EventDraft(id="k0", ts=1_700_000_000_000_000, body=SessionStarted(workspace="/w")),
        EventDraft(id="k1", ts=1_700_000_000_000_001, body=TurnStarted(input="go"), turn_id="t1"),
    ]
    await writer.append(drafts, expected_offset=0)

asyncio.run(main())
"""

SCRIPT = [{"text": "hello"}]


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """``path`` made read-only for real: a read-only bind mount of it as root (root
    ignores permission bits), its permission bits otherwise."""
    if os.geteuid() == 0:
        target = path.with_name(path.name + "-ro")
        target.mkdir()
        try:
            _run("mount", "--bind", str(path), str(target))
        except (OSError, subprocess.CalledProcessError):
            pytest.skip("cannot bind-mount here (root without CAP_SYS_ADMIN)")
        try:
            _run("mount", "-o", "remount,bind,ro", str(target))
            yield target
        finally:
            _run("umount", "-l", str(target))
        return
    modes = {p: p.stat().st_mode for p in [path, *path.rglob("*")]}
    for p, mode in modes.items():
        p.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        yield path
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


@contextlib.contextmanager
def full_disk(path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs at ``path`` for the duration."""
    path.mkdir()
    try:
        _run("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path))
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield path
    finally:
        _run("umount", "-l", str(path))


def fill(disk: Path) -> None:
    """Write until the disk has no byte left."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0


@pytest.fixture
def runner() -> CliRunner:
    env = {"COLUMNS": "200", "NO_COLOR": "1", "LODGER_STATE": None, "LODGER_DEBUG": None}
    return CliRunner(env=env)


def invoke(runner: CliRunner, *args: str | Path) -> Result:
    return runner.invoke(main, [str(arg) for arg in args])


def assert_one_line_error(result: Result, path: Path) -> None:
    """Exit 1, ``error:`` naming a path under ``path`` plus a hint, and no traceback."""
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["error", "hint"], result.stderr
    assert str(path) in lines[0], lines[0]
    assert "Traceback" not in result.output


def kill_a_writer(state: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(state)], capture_output=True, check=False
    )
    assert proc.returncode == -9, proc.stderr.decode()
    assert (state / "log.sqlite3-wal").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("shm", ["kept", "deleted"])
def test_read_only_state_directory_can_be_inspected(
    runner: CliRunner, state_dir: Path, tmp_path: Path, shm: str
) -> None:
    kill_a_writer(state_dir)
    if shm == "deleted":  # then SQLite cannot make one there: lodger reads a private copy
        (state_dir / "log.sqlite3-shm").unlink()
    before = sorted(p.name for p in state_dir.iterdir())
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    with read_only(state_dir) as ro:
        listed = invoke(runner, "sessions", "--state", ro, "--json")
        assert listed.exit_code == 0, listed.output
        rows = {row["session_id"]: row for row in json.loads(listed.stdout)["sessions"]}
        assert sorted(rows) == sorted([CRASHED, KILLED, DEMO])
        assert rows[KILLED]["events"] == 2  # read from the WAL the killed writer left
        for session, events in [(KILLED, 2), (DEMO, 20), (CRASHED, 6)]:
            verified = invoke(runner, "log", "verify", session, "--state", ro, "--json")
            assert verified.exit_code == 0, verified.output
            assert json.loads(verified.stdout)["high_water"] == events
        shown = invoke(runner, "log", "show", KILLED, "--state", ro)
        assert shown.exit_code == 0, shown.output
        assert "go" in shown.stdout
        plan = invoke(runner, "recover", CRASHED, "--state", ro, "--json")
        assert plan.exit_code == 0, plan.output
        assert json.loads(plan.stdout)["calls"][0]["status"] == "indeterminate"

        # writing needs a writable directory: one line naming the path
        decided = invoke(runner, "decide", CRASHED, "c1", "--abandon", "--state", ro)
        assert_one_line_error(decided, ro)
        ran = invoke(
            runner,
            "run",
            "hi",
            "--model",
            f"script:{tmp_path / 'script.json'}",
            "--workspace",
            tmp_path,
            "--state",
            ro,
        )
        assert_one_line_error(ran, ro)
    assert sorted(p.name for p in state_dir.iterdir()) == before  # nothing was created


def test_state_directory_on_a_full_disk(runner: CliRunner, state_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    model = f"script:{tmp_path / 'script.json'}"
    with full_disk(tmp_path / "disk") as disk:
        state = disk / "state"
        shutil.copytree(state_dir, state)  # holds s-crash, interrupted after T1 of c1
        first = invoke(
            runner, "run", "hi", "--model", model, "--workspace", tmp_path, "--state", state
        )
        assert first.exit_code == 0, first.output
        listed = invoke(runner, "sessions", "--state", state, "--json")
        sessions = sorted(row["session_id"] for row in json.loads(listed.stdout)["sessions"])
        (session,) = set(sessions) - {DEMO, CRASHED}
        fill(disk)

        # reading needs no space
        listed = invoke(runner, "sessions", "--state", state, "--json")
        assert listed.exit_code == 0, listed.output
        assert (
            sorted(row["session_id"] for row in json.loads(listed.stdout)["sessions"]) == sessions
        )
        for command in (["log", "verify"], ["log", "show"], ["recover"]):
            read = invoke(runner, *command, session, "--state", state)
            assert read.exit_code == 0, (command, read.output)

        # writing does: one line naming the path, nothing half-done
        again = invoke(
            runner,
            "run",
            "more",
            "--model",
            model,
            "--session",
            session,
            "--workspace",
            tmp_path,
            "--state",
            state,
        )
        assert again.exit_code == 1, again.output
        assert "Traceback" not in again.output
        assert str(state) in again.output
        fresh = invoke(
            runner, "run", "hi", "--model", model, "--workspace", tmp_path, "--state", disk / "s2"
        )
        assert fresh.exit_code == 1, fresh.output
        assert "Traceback" not in fresh.output
        assert str(disk / "s2") in fresh.output
        decided = invoke(runner, "decide", CRASHED, "c1", "--abandon", "--state", state)
        assert_one_line_error(decided, state)
        (disk / "filler").unlink()
        for name in sessions:  # every failed write left the logs as they were
            verified = invoke(runner, "log", "verify", name, "--state", state)
            assert verified.exit_code == 0, verified.output
        plan = invoke(runner, "recover", CRASHED, "--state", state, "--json")
        assert json.loads(plan.stdout)["calls"][0]["status"] == "indeterminate"


WIPE_TOOLS = '''
import os, shutil
from pathlib import Path
from lodger import tool

@tool
def wipe() -> str:
    """Delete the state directory, as a careless `rm -rf` would."""
    shutil.rmtree(os.environ["WIPE_STATE"])
    return "wiped"

@tool
def mark() -> str:
    """A side effect counted outside the process."""
    Path(os.environ["WIPE_MARK"]).write_text("ran")
    return "marked"
'''


@pytest.mark.parametrize("how", ["deleted", "moved"])
def test_run_whose_state_directory_vanishes_fails_before_the_next_effect(
    runner: CliRunner, tmp_path: Path, how: str
) -> None:
    state = tmp_path / "state"
    tools = tmp_path / "wipe_tools.py"
    tools.write_text(
        WIPE_TOOLS
        if how == "deleted"
        else WIPE_TOOLS.replace("shutil.rmtree(", "os.rename(").replace(
            '["WIPE_STATE"])', '["WIPE_STATE"], os.environ["WIPE_STATE"] + "-moved")'
        )
    )
    script = [
        {"calls": [{"name": "wipe", "args": {}}]},
        {"calls": [{"name": "mark", "args": {}}]},
        {"text": "done"},
    ]
    (tmp_path / "script.json").write_text(json.dumps(script))
    mark = tmp_path / "mark.txt"
    result = runner.invoke(
        main,
        [
            "run",
            "clean up",
            "--model",
            f"script:{tmp_path / 'script.json'}",
            "--tools",
            str(tools),
            "--workspace",
            str(tmp_path),
            "--state",
            str(state),
            "--yes",
        ],
        env={"WIPE_STATE": str(state), "WIPE_MARK": str(mark)},
    )
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert str(state / "log.sqlite3") in result.output
    assert not mark.exists(), "a call ran after its log was gone"


def test_deleted_database_with_its_head_files_left_fails_closed(
    runner: CliRunner, state_dir: Path
) -> None:
    for name in ("log.sqlite3", "log.sqlite3-wal", "log.sqlite3-shm"):
        (state_dir / name).unlink(missing_ok=True)
    listed = invoke(runner, "sessions", "--state", state_dir, "--json")
    assert listed.exit_code == 0, listed.output
    assert sorted(row["session_id"] for row in json.loads(listed.stdout)["sessions"]) == [
        CRASHED,
        DEMO,
    ]
    verified = invoke(runner, "log", "verify", DEMO, "--state", state_dir, "--json")
    assert verified.exit_code == 1, verified.output
    error = json.loads(verified.stdout)["error"]
    assert (error["code"], error["offset"]) == ("truncated", 0)

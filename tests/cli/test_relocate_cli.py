"""Sessions whose workspace was moved, recreated or deleted: every blocked state has a way
out (relocate after checking the log's file hashes, or abandon the turn), and each refusal
names it. Real files, a real SQLite log, the CLI as a user runs it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from lodger.cli import main
from lodger.errors import CommitFailedError
from lodger.events import Event, OperatorDecision, RunEnded, RunStarted, TurnEnded
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.agent import Agent
from lodger.runtime.builtin import workspace_tools
from lodger.storage import EventLog, MemoryArtifactStore, SqliteLogStore, Storage
from lodger.storage.logstore import Record
from lodger.testing import FaultyLogStore

SCRIPT = [
    {"calls": [{"name": "write_file", "args": {"path": "a.txt", "content": "alpha"}}]},
    {"calls": [{"name": "write_file", "args": {"path": "sub/b.txt", "content": "bravo"}}]},
    {"text": "both written"},
    {"text": "a fresh turn"},
]

RELOCATE = "lodger resume s1 --workspace DIR --relocate"
ABANDON = "lodger abandon s1"


def second_t2(records: list[Record], seen: dict[str, int]) -> bool:
    if any(b'"kind":"tool_responded"' in r.data for r in records):
        seen["t2"] += 1
        return seen["t2"] == 2
    return False


@pytest.fixture
async def crashed(tmp_path: Path) -> Path:
    """Session s1 in ``tmp_path/ws``: a.txt written and answered, then sub/b.txt written
    and the process lost before its T2 (the turn is open, the write is indeterminate)."""
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    ws = tmp_path / "ws"
    ws.mkdir()
    state = tmp_path / "state"
    seen = {"t2": 0}
    store = FaultyLogStore(SqliteLogStore(state), fail_when=lambda r: second_t2(r, seen))
    agent = Agent(
        model=ScriptedModel.from_file(tmp_path / "script.json"),
        tools=workspace_tools(),
        storage=Storage(log=EventLog(store), artifacts=MemoryArtifactStore(), state_dir=state),
        workspace=ws,
    )
    with pytest.raises(CommitFailedError):
        await agent.run("write both", session="s1")
    await agent.close()
    assert (ws / "a.txt").read_text() == "alpha"
    assert (ws / "sub/b.txt").read_text() == "bravo"
    return tmp_path


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    # a LodgerError ends in SystemExit with its exit code; anything else is a crash
    assert result.exception is None or isinstance(result.exception, SystemExit), result
    return result.exit_code, result.stdout, result.stderr


def events_of(state: Path) -> list[Event]:
    async def read() -> list[Event]:
        log = EventLog(SqliteLogStore(state))
        try:
            return await log.read_all("s1")
        finally:
            await log.close()

    return asyncio.run(read())


def test_a_moved_workspace_is_refused_naming_relocate_and_relocate_resumes(
    crashed: Path,
) -> None:
    state = str(crashed / "state")
    moved = crashed / "moved"
    os.rename(crashed / "ws", moved)
    before = len(events_of(crashed / "state"))

    code, out, _ = cli("recover", "s1", "--state", state)
    assert code == 0
    assert f"blocked: the session's workspace {crashed / 'ws'} does not exist" in out
    assert "lodger resume s1 --workspace DIR --relocate" in out and "lodger abandon s1" in out
    assert "ready:" not in out

    code, _, err = cli("resume", "s1", "--state", state)
    assert code == 3
    assert f"{str(crashed / 'ws')!r} does not exist" in err
    assert f"next: {RELOCATE} --state {state}" in err
    assert f"next: {ABANDON} --state {state}" in err

    code, _, err = cli("resume", "s1", "--workspace", str(moved), "--state", state)
    assert code == 3
    assert "not the same directory" in err and "does not exist any more" in err
    assert RELOCATE in err and ABANDON in err
    assert len(events_of(crashed / "state")) == before  # refusals append nothing

    code, out, err = cli("resume", "s1", "--relocate", "--state", state)
    assert code == 2 and "--relocate needs the directory" in err

    code, out, err = cli("resume", "s1", "--workspace", str(moved), "--relocate", "--state", state)
    assert code == 0, err
    assert "turn completed" in out
    events = events_of(crashed / "state")
    claims = [e.body for e in events if isinstance(e.body, RunStarted)]
    assert claims[-1].resumed_from is not None
    assert (claims[-1].workspace, claims[-1].workspace_id) != (None, None)
    assert claims[-1].workspace == str(moved)
    assert all(c.workspace is None for c in claims[:-1])
    assert (moved / "sub/b.txt").read_text() == "bravo"  # probed, not written again

    code, out, _ = cli("log", "verify", "s1", "--state", state)
    assert code == 0, out
    code, out, _ = cli("recover", "s1", "--state", state)
    assert "no interrupted turn" in out


def test_relocating_refuses_listing_a_file_that_differs(crashed: Path) -> None:
    state = str(crashed / "state")
    ws = crashed / "ws"
    # recreated under the same name (made while the old one existed, so it cannot reuse
    # its inode), the files restored and one of them edited
    fresh = crashed / "fresh"
    (fresh / "sub").mkdir(parents=True)
    (fresh / "a.txt").write_text("alpha, edited by hand")
    (fresh / "sub/b.txt").write_text("bravo")
    shutil.rmtree(ws)
    os.rename(fresh, ws)
    before = len(events_of(crashed / "state"))

    code, out, _ = cli("recover", "s1", "--state", state, "--json")
    assert json.loads(out)["workspace"] == {"path": str(ws), "state": "replaced"}

    code, _, err = cli("resume", "s1", "--state", state)
    assert code == 3
    assert "is not the directory the session worked in" in err
    assert RELOCATE in err

    code, _, err = cli("resume", "s1", "--workspace", str(ws), "--relocate", "--state", state)
    assert code == 3
    assert "1 file(s) differ" in err
    assert "'a.txt'" in err and "'sub/b.txt'" not in err
    assert ABANDON in err
    assert len(events_of(crashed / "state")) == before

    (ws / "a.txt").write_text("alpha")  # restored: now the hashes match
    code, out, err = cli("resume", "s1", "--workspace", str(ws), "--relocate", "--state", state)
    assert code == 0, err
    assert "turn completed" in out


def test_relocating_accepts_a_write_whose_outcome_is_unknown_either_way(crashed: Path) -> None:
    state = str(crashed / "state")
    copy = crashed / "copy"
    shutil.copytree(crashed / "ws", copy)
    (copy / "sub/b.txt").unlink()  # the indeterminate write's before-state: absent
    code, out, err = cli("resume", "s1", "--workspace", str(copy), "--relocate", "--state", state)
    assert code == 0, err
    assert "turn completed" in out
    assert not (copy / "sub/b.txt").exists()  # the probe found it not applied: not rewritten


def test_abandon_ends_the_turn_and_a_new_turn_runs(crashed: Path) -> None:
    state = str(crashed / "state")
    shutil.rmtree(crashed / "ws")
    other = crashed / "other"
    other.mkdir()

    code, out, err = cli("abandon", "s1", "--reason", "workspace deleted", "--state", state)
    assert code == 0, err
    assert "abandoned: turn" in out
    events = events_of(crashed / "state")
    decision, run_end, turn_end = (e.body for e in events[-3:])
    assert isinstance(decision, OperatorDecision) and decision.decision == "abandon"
    assert isinstance(run_end, RunEnded) and run_end.status == "abandoned"
    assert isinstance(turn_end, TurnEnded)
    assert (turn_end.status, turn_end.reason) == ("abandoned", "workspace deleted")
    assert events[-1].origin == "operator"

    code, _, err = cli("abandon", "s1", "--state", state)
    assert code == 2
    assert "no open turn to abandon" in err
    assert 'next: lodger run "TASK" --session s1' in err

    code, out, err = cli("resume", "s1", "--state", state)
    assert code == 2 and "no interrupted turn" in err

    code, out, err = cli(
        "run",
        "start over",
        "--session",
        "s1",
        "--workspace",
        str(other),
        "--model",
        f"script:{crashed / 'script.json'}",
        "--state",
        state,
    )
    assert code == 0, err
    assert "turn completed" in out
    last = events_of(crashed / "state")[-1].body
    assert isinstance(last, TurnEnded) and last.status == "completed"


def lodger(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodger", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_a_deleted_workspace_gives_one_line_errors_naming_the_ways_out(crashed: Path) -> None:
    state = str(crashed / "state")
    gone = str(crashed / "ws")
    shutil.rmtree(gone)
    cwd = crashed / "elsewhere"
    cwd.mkdir()

    resumed = lodger("resume", "s1", "--state", state, cwd=cwd)
    assert resumed.returncode == 3
    assert "Traceback" not in resumed.stderr
    first = resumed.stderr.splitlines()[0]
    assert first.startswith("blocked: ") and f"{gone!r} does not exist" in first
    assert f"next: {RELOCATE} --state {state}" in resumed.stderr
    assert f"next: {ABANDON} --state {state}" in resumed.stderr

    # `run --session` resumes the open turn first: blocked the same way, same ways out
    model = f"script:{crashed / 'script.json'}"
    ran = lodger("run", "more", "--session", "s1", "--model", model, "--state", state, cwd=cwd)
    assert ran.returncode == 3  # blocked, as resume says
    assert "Traceback" not in ran.stderr
    lines = ran.stderr.splitlines()
    assert lines[0].startswith("error: session 's1' cannot resume: workspace: ")
    assert gone in lines[0] and "does not exist any more" in lines[0]
    assert f"next: {RELOCATE} --state {state}" in lines
    assert f"next: {ABANDON} --state {state} [--reason TEXT]" in lines

    # recover and decide never need the workspace
    plan = lodger("recover", "s1", "--state", state, "--json", cwd=cwd)
    assert plan.returncode == 0, plan.stderr
    calls = json.loads(plan.stdout)["calls"]
    assert json.loads(plan.stdout)["workspace"] == {"path": gone, "state": "missing"}
    assert [c["status"] for c in calls] == ["completed", "indeterminate"]
    decided = lodger(
        "decide", "s1", calls[1]["call_id"], "--not-applied", "--state", state, cwd=cwd
    )
    assert decided.returncode == 0, decided.stderr
    assert "recorded:" in decided.stdout

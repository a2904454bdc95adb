"""`lodger cancel` and `lodger mode` from a second process, for a turn a `lodger run`
subprocess runs: real processes, a real bubblewrap sandbox, no host."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest


def _start(tmp_path: Path, script: list[dict[str, Any]]) -> subprocess.Popen[str]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "script.json").write_text(json.dumps(script))
    args = [
        sys.executable, "-m", "lodger", "run", "go", "--session", "s1",
        "--model", f"script:{tmp_path / 'script.json'}",
        "--workspace", str(ws), "--state", str(tmp_path / "state"),
    ]  # fmt: skip
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended first: {proc.communicate()}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def lodger(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodger", *args, "--state", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # the workspace of a run: never the checkout the tests run from
    )


def _events(tmp_path: Path) -> list[dict[str, Any]]:
    shown = lodger(tmp_path, "log", "show", "s1", "--json", "--all")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)["events"]  # type: ignore[no-any-return]


SLOW = "touch started; sleep 30; touch after"


@pytest.mark.slow
def test_lodger_cancel_stops_a_turn_another_process_runs(tmp_path: Path) -> None:
    script = [
        {
            "calls": [
                {"name": "shell", "args": {"command": SLOW}},
                {"name": "shell", "args": {"command": "touch second"}},
            ]
        },
        {"text": "never"},
    ]
    proc = _start(tmp_path, script)
    ws = tmp_path / "ws"
    _wait_for(ws / "started", proc)
    began = time.monotonic()
    done = lodger(tmp_path, "cancel", "s1", "--reason", "wrong task", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == "cancelled" and answer["turn_status"] == "cancelled"
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - began < 20  # the 30 s command was killed, not waited for
    assert "Traceback" not in err
    assert proc.returncode == 130, (out, err)  # a cancelled turn, as `lodger run` exits

    events = _events(tmp_path)
    kinds = [e["body"]["kind"] for e in events]
    # a turn with a workspace ends with its snapshot, committed with the cancel
    assert kinds[-4:] == ["cancel_requested", "workspace_snapshot", "run_ended", "turn_ended"]
    assert events[-4]["body"]["reason"] == "wrong task"
    assert events[-4]["body"]["who"].startswith("cli:")
    assert events[-2]["body"]["status"] == events[-1]["body"]["status"] == "cancelled"
    dispatched = [e["call_id"] for e in events if e["body"]["kind"] == "tool_dispatched"]
    responded = {e["call_id"]: e["body"] for e in events if e["body"]["kind"] == "tool_responded"}
    assert dispatched and set(dispatched) <= set(responded)
    assert all(responded[c]["status"] == "cancelled" for c in dispatched)
    assert not (ws / "after").exists() and not (ws / "second").exists()
    assert lodger(tmp_path, "log", "verify", "s1").returncode == 0

    # idle now: a second cancel says so and writes nothing
    again = lodger(tmp_path, "cancel", "s1")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("nothing to cancel")
    assert len(_events(tmp_path)) == len(events)
    shown = lodger(tmp_path, "log", "show", "s1", "--all")
    assert "cancel requested by cli:" in shown.stdout and "wrong task" in shown.stdout
    missing = lodger(tmp_path, "cancel", "nosuch")
    assert missing.returncode == 4 and "nosuch" in missing.stderr


@pytest.mark.slow
def test_lodger_mode_from_another_process_applies_from_the_next_step(tmp_path: Path) -> None:
    wait = "touch started; while [ ! -f go ]; do sleep 0.05; done; echo ran"
    script = [
        {"calls": [{"name": "shell", "args": {"command": wait}}]},
        {"calls": [{"name": "write_file", "args": {"path": "x.txt", "content": "hi"}}]},
        {"text": "done"},
    ]
    proc = _start(tmp_path, script)
    ws = tmp_path / "ws"
    _wait_for(ws / "started", proc)
    switched = lodger(tmp_path, "mode", "s1", "plan", "--json")
    assert switched.returncode == 0, switched.stderr
    assert json.loads(switched.stdout) == {
        "v": 1,
        "session_id": "s1",
        "status": "changed",
        "mode": "plan",
        "previous": None,
    }
    (ws / "go").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    events = _events(tmp_path)
    kinds = [e["body"]["kind"] for e in events]
    at = kinds.index("permission_mode_changed")
    # the step that was running when the mode changed ran on: its command completed
    shell_done = next(e for e in events if e["body"]["kind"] == "tool_responded")
    assert shell_done["body"]["status"] == "ok" and "ran" in shell_done["body"]["content"]
    # the next step's edit was refused by plan mode, and the model was told why
    rejected = [e for e in events if e["body"]["kind"] == "call_rejected"]
    assert len(rejected) == 1 and rejected[0]["offset"] > at
    assert rejected[0]["body"]["reason"] == "denied"
    assert "plan mode" in rejected[0]["body"]["message"]
    assert not (ws / "x.txt").exists()
    shown = lodger(tmp_path, "log", "show", "s1", "--all")
    assert "permission mode none -> plan by cli:" in shown.stdout

    same = lodger(tmp_path, "mode", "s1", "plan")  # idle now: written by this process
    assert same.returncode == 0 and "already" in same.stdout
    ask = lodger(tmp_path, "mode", "s1", "ask")
    assert ask.returncode == 0 and "plan -> ask" in ask.stdout
    now = lodger(tmp_path, "mode", "s1", "--json")
    assert json.loads(now.stdout)["mode"] == "ask"
    assert lodger(tmp_path, "log", "verify", "s1").returncode == 0
    bad = lodger(tmp_path, "mode", "s1", "yolo")
    assert bad.returncode == 2


@pytest.mark.slow
def test_lodger_run_starts_a_new_session_in_a_mode(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = [
        {"calls": [{"name": "write_file", "args": {"path": "x.txt", "content": "hi"}}]},
        {"text": "done"},
    ]
    (tmp_path / "script.json").write_text(json.dumps(script))
    run = ["run", "go", "--session", "s1", "--model", f"script:{tmp_path / 'script.json'}",
           "--workspace", str(ws)]  # fmt: skip
    first = lodger(tmp_path, *run, "--mode", "plan")
    assert first.returncode == 0, first.stderr
    assert not (ws / "x.txt").exists()
    again = lodger(tmp_path, *run, "--mode", "plan")  # the same mode: nothing switched
    assert again.returncode == 0, again.stderr
    events = _events(tmp_path)
    kinds = [e["body"]["kind"] for e in events]
    assert kinds[:3] == ["session_started", "permission_mode_changed", "turn_started"]
    assert kinds.count("permission_mode_changed") == 1
    assert kinds.count("call_rejected") == 2
    edits = lodger(tmp_path, *run, "--mode", "accept_edits")
    assert edits.returncode == 0, edits.stderr
    assert (ws / "x.txt").read_text() == "hi"
    assert lodger(tmp_path, "mode", "s1").stdout.strip() == "s1: accept_edits"
    assert lodger(tmp_path, "log", "verify", "s1").returncode == 0


@pytest.mark.slow
def test_lodger_mode_waits_for_a_worker_to_let_the_session_go(tmp_path: Path) -> None:
    """With a control plane (the state directory's own), a switch is written under the
    session's lease: refused, writing nothing, while a worker holds it."""
    import asyncio

    from lodger.runtime.location import CONTROL_FILE
    from lodger.storage.control import SqliteControlPlane

    (tmp_path / "script.json").write_text(json.dumps([{"text": "hi"}]))
    made = lodger(tmp_path, "run", "go", "--session", "s1",
                  "--model", f"script:{tmp_path / 'script.json'}")  # fmt: skip
    assert made.returncode == 0, made.stderr
    before = len(_events(tmp_path))

    async def hold() -> None:
        plane = SqliteControlPlane(tmp_path / "state" / CONTROL_FILE)
        await plane.start()
        try:
            lease = await plane.acquire_session(session_id="s1", holder="worker", ttl_s=300)
            assert lease is not None
            refused = await asyncio.to_thread(lodger, tmp_path, "mode", "s1", "plan")
            assert refused.returncode == 1 and "running in a worker" in refused.stderr
            await plane.release_session(lease=lease)
        finally:
            await plane.close()

    asyncio.run(hold())
    assert len(_events(tmp_path)) == before
    switched = lodger(tmp_path, "mode", "s1", "plan")
    assert switched.returncode == 0 and "none -> plan" in switched.stdout

"""Stopping `lodger run` from outside: real processes, real signals.

The first Ctrl-C (or SIGTERM, or SIGHUP) lets running calls settle and records what they
did, ends the run "interrupted" and leaves the turn open, so `lodger resume` continues it;
a second signal exits at once and names what it left. A sync tool's thread cannot be
stopped: T2 waits for it and records its real outcome."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

TOOLS = '''
import asyncio
import time
from pathlib import Path
from lodger import tool

@tool
async def wait_long() -> str:
    """Waits half a minute."""
    await asyncio.sleep(30)
    return "finished"

@tool
def wait_sync(seconds: float, marker: str) -> str:
    """Blocks a thread, then leaves a marker file."""
    time.sleep(seconds)
    Path(marker).write_text("done")
    return "slept and wrote the marker"
'''


def start(tmp_path: Path, call: dict[str, Any]) -> tuple[subprocess.Popen[str], list[str]]:
    (tmp_path / "tools.py").write_text(TOOLS)
    script = [{"calls": [call]}, {"text": "resumed and done"}]
    (tmp_path / "script.json").write_text(json.dumps(script))
    args = [
        sys.executable, "-m", "lodger", "run", "wait", "--session", "s1",
        "--model", f"script:{tmp_path / 'script.json'}", "--tools", str(tmp_path / "tools.py"),
        "--workspace", str(tmp_path), "--state", str(tmp_path / "state"),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    for line in proc.stdout:  # wait until the call is dispatched
        if f"-> {call['name']}" in line:
            break
        assert time.monotonic() < deadline
    return proc, args


def lodger(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodger", *args, "--state", str(tmp_path / "state")],
        capture_output=True,
        text=True,
    )


def events_of(tmp_path: Path) -> list[dict[str, Any]]:
    shown = lodger(tmp_path, "log", "show", "s1", "--json", "--all")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)["events"]  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_stop_settles_the_running_call_and_the_turn_resumes(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    proc, _ = start(tmp_path, {"name": "wait_long", "args": {}})
    started = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == code, err
    assert time.monotonic() - started < 10  # the 30 s tool was stopped, not waited for
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted: session s1") and "lodger resume s1" in last

    events = events_of(tmp_path)
    responded = [e["body"] for e in events if e["body"]["kind"] == "tool_responded"]
    assert [r["status"] for r in responded] == ["cancelled"]
    assert events[-1]["body"] == {
        "kind": "run_ended",
        "status": "interrupted",
        "error": "stopped from outside",
    }
    assert not any(e["body"]["kind"] == "turn_ended" for e in events)

    resumed = lodger(tmp_path, "resume", "s1", "--tools", str(tmp_path / "tools.py"))
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed and done" in resumed.stdout
    after = events_of(tmp_path)
    assert after[-1]["body"]["kind"] == "turn_ended" and after[-1]["body"]["status"] == "completed"
    # the stopped call was not run again: one dispatch, one response
    assert sum(e["body"]["kind"] == "tool_dispatched" for e in after) == 1


@pytest.mark.slow
def test_sigterm_waits_for_a_sync_tool_and_records_its_real_outcome(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    proc, _ = start(
        tmp_path, {"name": "wait_sync", "args": {"seconds": 1.5, "marker": str(marker)}}
    )
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 143, err
    assert marker.read_text() == "done"  # the thread finished its effect ...
    events = events_of(tmp_path)
    (t2,) = [e["body"] for e in events if e["body"]["kind"] == "tool_responded"]
    # ... and T2, committed after it, says so: not "cancelled" while the thread went on
    assert t2["status"] == "ok" and t2["content"] == "slept and wrote the marker"
    assert events[-1]["body"]["kind"] == "run_ended"


@pytest.mark.slow
def test_a_second_ctrl_c_exits_at_once_and_names_what_it_left(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    proc, _ = start(tmp_path, {"name": "wait_sync", "args": {"seconds": 30, "marker": str(marker)}})
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.stderr is not None
    assert "stopping" in proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert time.monotonic() - started < 10
    assert "left without an outcome: wait_sync" in err and "lodger recover s1" in err
    assert not marker.exists()
    plan = lodger(tmp_path, "recover", "s1", "--json")
    assert plan.returncode == 0, plan.stderr
    (call,) = json.loads(plan.stdout)["calls"]
    assert call["status"] == "indeterminate"  # exactly as after a crash: T1, no T2

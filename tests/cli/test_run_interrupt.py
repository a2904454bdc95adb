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


EXITING_TOOLS = '''
import asyncio
import sys
from lodger import tool

@tool
async def interrupt_now() -> str:
    """Raises KeyboardInterrupt in its first step."""
    raise KeyboardInterrupt

@tool
async def interrupt_later() -> str:
    """Raises KeyboardInterrupt after a wait, in its task."""
    await asyncio.sleep(0.01)
    raise KeyboardInterrupt("from the tool")

@tool
def interrupt_thread() -> str:
    """Raises KeyboardInterrupt on its worker thread."""
    raise KeyboardInterrupt

@tool
def exit_thread() -> str:
    """Calls sys.exit on its worker thread."""
    sys.exit(3)

@tool
async def wait_long() -> str:
    """Waits half a minute."""
    await asyncio.sleep(30)
    return "finished"
'''


def test_what_a_tool_raises_is_its_result_and_only_a_signal_stops_lodger(tmp_path: Path) -> None:
    """A tool's KeyboardInterrupt or SystemExit is its error result (T2 committed, the
    turn goes on to the next step); a real SIGINT to lodger, later in the same run, still
    stops it: exit 130, the running call settled, the turn left open with the resume hint."""
    (tmp_path / "tools.py").write_text(EXITING_TOOLS)
    raisers = ["interrupt_now", "interrupt_later", "interrupt_thread", "exit_thread"]
    script = [
        {"calls": [{"name": name, "args": {}} for name in raisers]},
        {"calls": [{"name": "wait_long", "args": {}}]},
        {"text": "resumed and done"},
    ]
    (tmp_path / "script.json").write_text(json.dumps(script))
    args = [
        sys.executable, "-m", "lodger", "run", "go", "--session", "s1",
        "--model", f"script:{tmp_path / 'script.json'}", "--tools", str(tmp_path / "tools.py"),
        "--workspace", str(tmp_path), "--state", str(tmp_path / "state"),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # the raisers settle, then the model's next step runs
        if "-> wait_long" in line:
            break
    else:
        _, err = proc.communicate(timeout=20)
        pytest.fail(f"the run ended before its second step (exit {proc.returncode}): {err}")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted: session s1") and "lodger resume s1" in last

    events = events_of(tmp_path)
    responded = {e["call_id"]: e["body"] for e in events if e["body"]["kind"] == "tool_responded"}
    by_name = {
        e["body"]["tool"]: responded[e["call_id"]]
        for e in events
        if e["body"]["kind"] == "tool_dispatched"
    }
    for name in ("interrupt_now", "interrupt_later", "interrupt_thread"):
        assert by_name[name]["status"] == "error", by_name[name]
        assert by_name[name]["content"].startswith(f"{name} failed: KeyboardInterrupt")
    assert "from the tool" in by_name["interrupt_later"]["content"]
    assert by_name["exit_thread"]["status"] == "error"
    assert "SystemExit (exit code 3)" in by_name["exit_thread"]["content"]
    assert by_name["wait_long"]["status"] == "cancelled"  # the signal's doing
    assert events[-1]["body"] == {
        "kind": "run_ended",
        "status": "interrupted",
        "error": "stopped from outside",
    }
    assert not any(e["body"]["kind"] == "turn_ended" for e in events)

"""SIGKILL of lodger while a background process is live: the sandbox dies with it
(bubblewrap's --die-with-parent), and the resume records the process's end as
``unknown`` before the new run starts; nothing is started twice (counted outside, in a
file the process writes as it starts)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

CHILD = Path(__file__).with_name("process_child.py")


def child(ws: Path, phase: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, str(CHILD), str(ws), phase],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (an exited process no one reaped yet does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def test_a_process_lost_with_a_killed_lodger_is_recorded_unknown_on_resume(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    died = child(ws, "run")
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert (ws / "starts").read_text() == "up\n"
    resumed = child(ws, "resume")
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["status"] == "completed"
    started, ended = out["facts"]
    assert started["kind"] == "process_started" and started["pid"] > 0
    assert (ended["kind"], ended["process_id"], ended["status"]) == (
        "process_ended",
        started["process_id"],
        "unknown",
    )
    assert not _running(started["pid"])  # gone with lodger
    assert (ws / "starts").read_text() == "up\n"  # and not started again


def test_a_process_kept_for_the_session_and_lost_between_turns_is_unknown_next_turn(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    died = child(ws, "between")
    assert died.returncode == -signal.SIGKILL, died.stderr
    following = child(ws, "next")
    assert following.returncode == 0, following.stderr
    started, ended = json.loads(following.stdout)["facts"]
    assert started["keep"] == "session"
    assert (ended["process_id"], ended["status"]) == (started["process_id"], "unknown")
    assert not _running(started["pid"])

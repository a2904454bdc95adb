"""One writer per session across processes, on object stores and on SQLite.

Real ``lodger run`` processes (a scripted model whose tool waits for a file), real
signals, a ``file://`` store and moto's S3 server. Broke (issue 27 §1): a second
``lodger run --session S --store URL`` started while the first was mid-call read the
open turn, parked the live call as indeterminate and fenced the live run; deleting
``locks/`` under a live SQLite run let a second writer in the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ._s3server import S3Server

SRC = Path(__file__).resolve().parents[2] / "src"
TOOLS = """
import asyncio
from pathlib import Path
from lodger import tool

@tool
async def wait_for(path: str) -> str:
    \"\"\"Waits until a file exists.\"\"\"
    while not Path(path).exists():
        await asyncio.sleep(0.05)
    return "released"
"""


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.slow)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """The storage flags of the runs: a file:// store, moto's S3, or a state directory."""
    if request.param == "file":
        return ["--store", f"file://{tmp_path / 'objects'}"]
    server: S3Server = request.getfixturevalue("s3")
    return ["--store", server.url()]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["LODGER_WRITER_LEASE_TTL_S"] = "1"  # renewed every third of a second
    env.pop("LODGER_STORE", None)
    return env


def _lodger(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodger", *args],
        capture_output=True, text=True, env=_env(), timeout=90, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _start(tmp_path: Path, flags: list[str]) -> subprocess.Popen[str]:
    """``lodger run`` of session s1, returned once its call is dispatched (mid-call)."""
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "tools.py").write_text(TOOLS)
    call = {"name": "wait_for", "args": {"path": str(tmp_path / "go")}}
    (tmp_path / "script.json").write_text(json.dumps([{"calls": [call]}, {"text": "done"}]))
    args = [
        sys.executable, "-m", "lodger", "run", "wait", "--session", "s1",
        "--model", f"script:{tmp_path / 'script.json'}", "--tools", str(tmp_path / "tools.py"),
        "--workspace", str(tmp_path / "ws"), *flags,
    ]  # fmt: skip
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        if "-> wait_for" in line:
            return proc
        assert time.monotonic() < deadline
    raise AssertionError(f"the run never dispatched its call: {proc.communicate()}")


def _second_run(tmp_path: Path, flags: list[str]) -> subprocess.CompletedProcess[str]:
    return _lodger(
        tmp_path, "run", "again", "--session", "s1",
        "--model", f"script:{tmp_path / 'script.json'}", "--tools", str(tmp_path / "tools.py"),
        "--workspace", str(tmp_path / "ws"), *flags,
    )  # fmt: skip


def _resume(tmp_path: Path, flags: list[str]) -> subprocess.CompletedProcess[str]:
    tools = str(tmp_path / "tools.py")
    return _lodger(tmp_path, "resume", "s1", "--tools", tools, "--workspace", str(tmp_path / "ws"),
                   *flags)  # fmt: skip


def _events(tmp_path: Path, flags: list[str]) -> list[dict[str, Any]]:
    shown = _lodger(tmp_path, "log", "show", "s1", "--json", "--all", *flags)
    assert shown.returncode == 0, shown.stderr
    return [e["body"] for e in json.loads(shown.stdout)["events"]]


def _refused_by(done: subprocess.CompletedProcess[str], holder: subprocess.Popen[str]) -> None:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr
    first = done.stderr.strip().splitlines()[0]
    assert first.startswith("error: session 's1' is being written by "), done.stderr
    assert f"pid {holder.pid} on " in first


@pytest.mark.slow  # real processes, ~8-20 s on a loaded machine
def test_a_second_run_is_refused_and_the_live_turn_completes(
    tmp_path: Path, where: list[str]
) -> None:
    holder = _start(tmp_path, where)
    try:
        for _ in range(2):  # refused again and again, well past the 1 s TTL: it is renewed
            _refused_by(_second_run(tmp_path, where), holder)
            time.sleep(0.8)
        (tmp_path / "go").touch()
        out, err = holder.communicate(timeout=60)
    finally:
        holder.kill()
        holder.communicate()
    assert holder.returncode == 0, err
    assert "done" in out
    events = _events(tmp_path, where)
    kinds = [e["kind"] for e in events]
    # the healthy turn was not broken: one call, its result, the turn completed
    assert kinds.count("tool_dispatched") == 1 and kinds.count("tool_responded") == 1
    assert events[-1]["kind"] == "turn_ended" and events[-1]["status"] == "completed"
    assert not any("park" in kind for kind in kinds)
    assert "indeterminate" not in json.dumps(events)


@pytest.mark.slow  # real processes, ~8-20 s on a loaded machine
def test_a_paused_holder_is_taken_over_after_its_lease_lapses_and_then_fenced(
    tmp_path: Path, where: list[str]
) -> None:
    holder = _start(tmp_path, where)
    try:
        holder.send_signal(signal.SIGSTOP)  # alive, but renewing nothing
        time.sleep(1.6)  # past the 1 s TTL
        taken = _resume(tmp_path, where)
        assert "is being written by" not in taken.stderr, taken.stderr
        assert "Traceback" not in taken.stderr
        # the new writer recorded what it decided about the call it found open
        after_takeover = _events(tmp_path, where)
        holder.send_signal(signal.SIGCONT)
        (tmp_path / "go").touch()  # the stale holder's call finishes ...
        _, err = holder.communicate(timeout=60)
    finally:
        holder.kill()
        holder.communicate()
    # ... and its commit is refused: it lost its lease, nothing of it was written
    assert holder.returncode == 1, err
    assert "lost its lease" in err, err
    assert _events(tmp_path, where) == after_takeover
    verified = _lodger(tmp_path, "log", "verify", "s1", *where)
    assert verified.returncode == 0, verified.stderr


def test_a_killed_holder_is_taken_over_at_once_on_its_own_machine(
    tmp_path: Path, where: list[str]
) -> None:
    holder = _start(tmp_path, where)
    holder.send_signal(signal.SIGKILL)
    holder.communicate(timeout=10)
    # its lease object stays for the TTL, but its pid is dead here: no waiting
    taken = _resume(tmp_path, where)
    assert "is being written by" not in taken.stderr, taken.stderr
    assert "Traceback" not in taken.stderr
    assert "t1_without_t2" in taken.stdout + taken.stderr  # it judged the dead call


@pytest.mark.slow  # real processes, ~8-20 s on a loaded machine
def test_deleting_locks_under_a_live_sqlite_run_lets_no_second_writer_in(
    tmp_path: Path,
) -> None:
    flags = ["--state", str(tmp_path / "state")]
    holder = _start(tmp_path, flags)
    try:
        shutil.rmtree(tmp_path / "state" / "locks")
        _refused_by(_second_run(tmp_path, flags), holder)
        (tmp_path / "go").touch()
        _, err = holder.communicate(timeout=60)
    finally:
        holder.kill()
        holder.communicate()
    assert holder.returncode == 0, err
    events = _events(tmp_path, flags)
    assert events[-1]["kind"] == "turn_ended" and events[-1]["status"] == "completed"
    # and once it is over, the next run is let in
    (tmp_path / "script.json").write_text(json.dumps([{"text": "second"}]))
    again = _second_run(tmp_path, flags)
    assert again.returncode == 0, again.stderr

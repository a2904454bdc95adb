"""Requests between processes through the state directory: a record a killed process
left never takes a request, and a request addressed to an earlier run is never read by
a later one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from lodger import ScriptedModel
from lodger.runtime import _local_control
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage

ANNOUNCE = """
import sys, time
from pathlib import Path
from lodger.runtime import _local_control
_local_control._announce(Path(sys.argv[1]), "s1", "deadbeef")
print("announced", flush=True)
time.sleep(60)
"""


def test_a_record_a_killed_process_left_takes_no_request(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-c", ANNOUNCE, str(state)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "announced"
    runner = _local_control.runner_of(state, "s1")
    assert runner is not None and runner.pid == proc.pid and runner.token == "deadbeef"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    assert (state / "running" / "s1.json").exists()  # left behind, and ignored
    assert _local_control.runner_of(state, "s1") is None
    assert _local_control.send_request(state, "s1", {"kind": "cancel"}) is None
    assert not list(state.glob("requests/**/*.json"))  # nothing was left for anyone


def test_a_request_for_an_earlier_run_is_never_read(tmp_path: Path) -> None:
    where = tmp_path / "requests" / "s1"
    where.mkdir(parents=True)
    (where / "oldtoken-1-aa.json").write_text(json.dumps({"kind": "cancel"}))
    assert _local_control._take(tmp_path, "s1", "newtoken") == []
    assert (where / "oldtoken-1-aa.json").exists()
    taken = _local_control._take(tmp_path, "s1", "oldtoken")
    assert taken == [("oldtoken-1-aa.json", {"kind": "cancel"})]
    assert not (where / "oldtoken-1-aa.json").exists()


async def test_a_turn_is_announced_while_it_runs_and_withdrawn_after(tmp_path: Path) -> None:
    """A settled turn leaves no record: a cancel then answers that nothing runs."""
    seen: list[Any] = []
    state = tmp_path / "state"

    def watch(event: Any) -> None:
        if event.kind == "step_started":
            seen.append(_local_control.runner_of(state, "s1"))

    binding = Binding(model=ScriptedModel([{"text": "hi"}]), on_event=watch)
    async with Sessions(Storage.local(state)) as sessions:
        await sessions.run("hello", binding=binding, session="s1")
        assert seen and seen[0] is not None and seen[0].pid == os.getpid()
        assert _local_control.runner_of(state, "s1") is None
        assert not (state / "running" / "s1.json").exists()
        assert (await sessions.cancel("s1")).status == "not_running"
        assert (await sessions.cancel("s2")).status == "unknown_session"

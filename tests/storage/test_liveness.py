"""A writer killed and not yet reaped by its parent (a zombie) is a dead holder.

Broke: ``alive`` compared only the pid's start time, which a zombie keeps until its
parent waits for it, so a lease whose holder was SIGKILLed by (or under) a parent that
had not reaped it yet was honoured for its whole TTL (30 s in the workers bench, whose
killed worker is the bench's unreaped child). A real killed child of this test process
is held unreaped while both checks run.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from obstore.store import LocalStore

from lodger.errors import SessionLockedError
from lodger.storage._liveness import alive, this_process
from lodger.storage._object_lease import StoreLease
from lodger.storage._segments import session_root


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _record_of(pid: int) -> dict[str, Any]:
    start = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    return {**this_process(), "pid": pid, "start": start}


def _kill_unreaped(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _state(proc.pid) != "Z":  # never waited for: the zombie stays
        assert time.monotonic() < deadline, "the child did not die"
        time.sleep(0.01)


def test_a_killed_unreaped_holder_is_dead_and_a_running_one_alive(
    child: subprocess.Popen[bytes],
) -> None:
    record = _record_of(child.pid)
    assert alive(record) is True
    assert alive({**record, "start": "1"}) is False  # the pid is another process's
    _kill_unreaped(child)
    assert alive(record) is False
    assert alive(this_process()) is True


def test_a_lease_of_a_zombie_holder_is_taken_over_at_once(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    store = LocalStore(str(tmp_path), mkdir=True)
    # the holder's lease lasts another hour: only its death lets a taker in
    expires = time.time_ns() // 1000 + 3_600_000_000
    key = f"{session_root('s1')}lease/{1:020d}"
    path = tmp_path / key
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**_record_of(child.pid), "run": "x", "expires_us": expires}))

    async def take() -> str | None:
        lease = StoreLease(store, "s1")
        await lease.acquire()
        try:
            return lease.key
        finally:
            await lease.release()

    with pytest.raises(SessionLockedError, match="is being written by"):
        asyncio.run(take())  # alive: refused
    _kill_unreaped(child)
    assert asyncio.run(take()) == f"{session_root('s1')}lease/{2:020d}"

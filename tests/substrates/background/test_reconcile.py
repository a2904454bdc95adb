"""Resume's reconciliation of the background processes the log says are live, against
real processes: the same pid with the same start time is adopted (and stopped with the
turn); a pid that is gone, or reused by another process, is recorded ``unknown``."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from lodger.events import ProcessEnded, ProcessStarted
from lodger.substrates.background import process_identity, reconcile, table_for, turn_ending


def _started(process_id: str, pid: int, sandbox: str) -> Any:
    body = ProcessStarted(
        process_id=process_id, operation_id="op", command="sleep", pid=pid, sandbox=sandbox
    )
    return SimpleNamespace(body=body)


@pytest.fixture
def live() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def gone() -> subprocess.Popen[bytes]:
    process = subprocess.Popen(["true"])
    process.wait()
    return process


async def test_a_live_process_is_adopted_and_a_gone_one_is_unknown(
    live: subprocess.Popen[bytes], gone: subprocess.Popen[bytes]
) -> None:
    same = f"bubblewrap {process_identity(live.pid)}"
    events = [
        _started("adopt", live.pid, same),
        _started("reused", live.pid, "bubblewrap start=1 boot=elsewhere"),
        _started("gone", gone.pid, same),
        _started("ended", gone.pid, same),
        SimpleNamespace(body=ProcessEnded(process_id="ended", status="exited")),
    ]
    ended = reconcile("sess-r", events)
    assert [(e.process_id, e.status) for e in ended] == [
        ("reused", "unknown"),
        ("gone", "unknown"),
    ]
    table = table_for("sess-r", create=False)
    assert table is not None and list(table.processes) == ["adopt"]
    assert live.poll() is None  # adopted: still running
    stopped = await turn_ending("sess-r")
    assert [(e.process_id, e.status) for e in stopped] == [("adopt", "stopped")]
    assert await asyncio.to_thread(live.wait, 10) == -9
    assert table_for("sess-r", create=False) is None

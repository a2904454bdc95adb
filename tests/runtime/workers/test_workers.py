"""Real worker processes sharing one queue: SIGKILL mid-turn, SIGSTOP past the lease,
idempotency keys, timers and cron schedules."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from lodger.errors import ControlPlaneError
from lodger.storage.control import open_control
from lodger.testing.postgres import PostgresServer

from ._workers import Workers, lodger, wait_for

pytestmark = pytest.mark.slow


def _script(tmp_path: Path, steps: list[dict[str, Any]]) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(steps))
    return path


def _status(dsn: str, session: str) -> str | None:
    async def get() -> str | None:
        control = open_control(dsn)
        await control.start()
        try:
            row = await control.get_session(session_id=session)
            return row.status if row else None
        finally:
            await control.close()

    try:
        return asyncio.run(get())
    except ControlPlaneError:  # the worker holds the file's lock: polled again
        return None


def _kinds(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["body"]["kind"] == kind]


def test_a_worker_killed_mid_turn_is_recovered_by_another(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    script = _script(tmp_path, [{"calls": [{"name": "effect", "args": {"tag": "a"}}]},
                                {"text": "paid"}])  # fmt: skip
    dsn = postgres.new_database()
    workers = Workers(tmp_path, f"file://{tmp_path / 'objects'}", dsn, script)
    try:
        for _ in range(3):
            workers.start()
        sent = workers.send("s1", "pay once")
        assert sent.returncode == 0, sent.stderr
        wait_for("a worker inside the tool", (tmp_path / "holding-a").exists)
        victim = int((tmp_path / "holding-a").read_text())
        assert victim in [p.pid for p in workers.procs]
        os.kill(victim, signal.SIGKILL)  # after the effect, before T2
        (tmp_path / "gate-a").touch()
        wait_for("the session settled", lambda: _status(dsn, "s1") == "completed")
    finally:
        workers.stop_all()
    assert (tmp_path / "effects").read_text().splitlines() == ["a"]  # once, not twice
    assert (tmp_path / "invocations").read_text().splitlines() == [f"a {victim}"]
    events = workers.events("s1")
    assert [e["body"]["input"] for e in _kinds(events, "turn_started")] == ["pay once"]
    runs = _kinds(events, "run_started")
    assert len(runs) == 2 and runs[1]["body"]["parent_run_id"] == runs[0]["run_id"]
    assert len(_kinds(events, "tool_dispatched")) == 1  # the probe found it: no re-run
    assert _kinds(events, "turn_ended")[-1]["body"]["status"] == "completed"
    assert lodger(tmp_path, "log", "verify", "s1", "--store", workers.store).returncode == 0


def test_a_paused_worker_past_its_lease_cannot_commit(tmp_path: Path) -> None:
    script = _script(tmp_path, [{"calls": [{"name": "note", "args": {"tag": "b"}}]},
                                {"text": "noted"}])  # fmt: skip
    dsn = str(tmp_path / "control.sqlite3")
    workers = Workers(tmp_path, f"file://{tmp_path / 'objects'}", dsn, script)
    try:
        for _ in range(2):
            workers.start()
        assert workers.send("s1", "note it").returncode == 0
        wait_for("a worker inside the tool", (tmp_path / "holding-b").exists)
        victim_pid = int((tmp_path / "holding-b").read_text())
        (victim,) = [p for p in workers.procs if p.pid == victim_pid]
        os.kill(victim_pid, signal.SIGSTOP)  # holds the lease, past T1, and stops renewing
        (tmp_path / "gate-b").touch()
        wait_for("the other worker settled it", lambda: _status(dsn, "s1") == "completed")
        settled = workers.events("s1")
        os.kill(victim_pid, signal.SIGCONT)  # wakes up long after its lease expired
        victim.send_signal(signal.SIGTERM)
        victim.wait(timeout=60)
    finally:
        workers.stop_all()
    err = workers.log(workers.procs.index(victim))
    assert "no longer current" in err  # its renewal or its late commit was refused
    after = workers.events("s1")
    assert after == settled  # nothing of the paused worker reached the log
    dispatched = _kinds(after, "tool_dispatched")
    responded = _kinds(after, "tool_responded")
    assert len(dispatched) == 2 and dispatched[1]["body"]["retry_of"] is not None
    assert [r["body"]["operation_id"] for r in responded] == [dispatched[1]["body"]["operation_id"]]
    other = [p.pid for p in workers.procs if p.pid != victim_pid]
    assert f"b {other[0]}" in (tmp_path / "invocations").read_text().splitlines()


def test_keys_timers_and_schedules_wake_sessions(tmp_path: Path) -> None:
    script = _script(tmp_path, [{"text": "ok"}])
    dsn = str(tmp_path / "control.sqlite3")
    workers = Workers(tmp_path, f"file://{tmp_path / 'objects'}", dsn, script)
    first = json.loads(workers.send("s2", "once", "--idempotency-key", "k1").stdout)
    again = json.loads(workers.send("s2", "once", "--idempotency-key", "k1").stdout)
    assert first["duplicate"] is False and again["duplicate"] is True
    sent_at = time.time()
    assert workers.send("s3", "later", "--at", "+2s").returncode == 0
    made = lodger(tmp_path, "schedule", "s4", "--cron", "* * * * * */2", "tick",
                  "--control", dsn, "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    next_at = json.loads(made.stdout)["next_at"]
    try:
        workers.start()
        wait_for("all three woke", lambda: all(
            _status(dsn, s) == "completed" for s in ("s2", "s3", "s4")))  # fmt: skip
    finally:
        workers.stop_all()
    tolerance_us = 15e6  # a loaded machine; the order is what matters
    assert [e["body"]["input"] for e in _kinds(workers.events("s2"), "turn_started")] == ["once"]
    (timer,) = _kinds(workers.events("s3"), "turn_started")
    assert (sent_at + 2) * 1e6 - 0.5e6 <= timer["ts"] <= (sent_at + 2) * 1e6 + tolerance_us
    ticks = _kinds(workers.events("s4"), "turn_started")
    assert ticks and ticks[0]["body"]["input"] == "tick"
    assert next_at * 1e6 <= ticks[0]["ts"] <= next_at * 1e6 + tolerance_us


def test_sigterm_hands_the_turn_back_within_the_grace_period(tmp_path: Path) -> None:
    script = _script(tmp_path, [{"calls": [{"name": "note", "args": {"tag": "c"}}]},
                                {"text": "noted"}])  # fmt: skip
    dsn = str(tmp_path / "control.sqlite3")
    workers = Workers(tmp_path, f"file://{tmp_path / 'objects'}", dsn, script)
    try:
        first = workers.start("--grace", "0.5", lease_ttl=30.0)  # the lease cannot expire
        assert workers.send("s1", "note it").returncode == 0
        wait_for("the worker inside the tool", (tmp_path / "holding-c").exists)
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
        assert first.returncode == 0, workers.log(0)
        assert _status(dsn, "s1") == "interrupted"
        (tmp_path / "gate-c").touch()
        workers.start(lease_ttl=30.0)  # takes it at once: the lease was released
        wait_for("the second worker finished it", lambda: _status(dsn, "s1") == "completed")
    finally:
        workers.stop_all()
    events = workers.events("s1")
    assert [e["body"]["input"] for e in _kinds(events, "turn_started")] == ["note it"]
    runs = _kinds(events, "run_ended")
    assert [r["body"]["status"] for r in runs] == ["interrupted", "completed"]


def _quietly(read: Callable[[], Coroutine[Any, Any, int]]) -> int | None:
    """``read()`` run now, or None while the worker holds the SQLite control plane's lock
    (polled again)."""
    try:
        return asyncio.run(read())
    except ControlPlaneError:
        return None


def test_a_wake_that_keeps_failing_is_dropped_and_indexed(tmp_path: Path) -> None:
    dsn = str(tmp_path / "control.sqlite3")
    workers = Workers(tmp_path, f"file://{tmp_path / 'objects'}", dsn, _script(tmp_path, []))

    async def pending() -> int:
        control = open_control(dsn)
        await control.start()
        try:
            return len(await control.pending_wakes())
        finally:
            await control.close()

    try:
        workers.start("--max-attempts", "2", model=False)  # a new session needs a model
        assert workers.send("s1", "hello").returncode == 0
        wait_for("the session indexed", lambda: _status(dsn, "s1") == "error:worker_model")
        # the index is written just before the wake is finished: wait for both (a wake
        # that is handed back instead stays pending, and this times out)
        wait_for("the wake dropped", lambda: _quietly(pending) == 0)
    finally:
        workers.stop_all()
    assert not workers.has_session("s1")  # nothing was written to the store
    assert _status(dsn, "s1") == "error:worker_model"

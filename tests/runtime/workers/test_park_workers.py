"""Real ``lodger worker --approval-park`` processes on a real PostgreSQL control plane and
a ``file://`` store: a call that needs approval parks and the session goes dormant (the
worker releases its lease; no process holds it), the other call of the batch runs once;
an answer given after the worker is gone wakes the session on a new worker, which runs
the call exactly once (effects counted outside the processes); an unanswered question
expires into a denial; a worker SIGKILLed right after it recorded the question and
before it released the lease leaves an answerable question, and the session resumes
correctly once its lease expires."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from lodger.runtime.sessions import Sessions
from lodger.storage import Storage
from lodger.storage.control import ControlPlane, open_control
from lodger.storage.control.interface import ApprovalRequest
from lodger.testing.postgres import PostgresServer

from ._workers import Workers, env, lodger, wait_for

pytestmark = pytest.mark.slow

T = TypeVar("T")
PARK_TOOLS = Path(__file__).with_name("_park_tools.py")
KILLER = Path(__file__).with_name("_park_killer.py")
SHIP_AND_LOG = [
    {"calls": [{"name": "ship", "args": {"target": "prod"}},
               {"name": "log_line", "args": {"text": "hello"}}]},
    {"text": "done"},
]  # fmt: skip
SHIP = [{"calls": [{"name": "ship", "args": {"target": "prod"}}]}, {"text": "done"}]


def _setup(tmp_path: Path, postgres: PostgresServer, steps: list[Any]) -> Workers:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(steps))
    return Workers(tmp_path, f"file://{tmp_path / 'objects'}", postgres.new_database(), script)


def _start(workers: Workers, *extra: str) -> subprocess.Popen[str]:
    return workers.start("--approval-park", "--tools", str(PARK_TOOLS), *extra)


def _on_plane(dsn: str, work: Callable[[ControlPlane], Awaitable[T]]) -> T:
    async def run() -> T:
        plane = open_control(dsn)
        await plane.start()
        try:
            return await work(plane)
        finally:
            await plane.close()

    return asyncio.run(run())


def _pending(dsn: str, session: str) -> list[ApprovalRequest]:
    async def work(plane: ControlPlane) -> list[ApprovalRequest]:
        return await plane.list_approvals(session_id=session)

    return _on_plane(dsn, work)


def _status(dsn: str, session: str) -> str | None:
    async def work(plane: ControlPlane) -> str | None:
        row = await plane.get_session(session_id=session)
        return row.status if row else None

    return _on_plane(dsn, work)


def _lease(dsn: str, session: str) -> tuple[str, float, float] | None:
    """(holder, expires_at, now) of the session's lease row, by the control plane's clock."""

    async def work(plane: ControlPlane) -> tuple[str, float, float] | None:
        async with plane._tx() as tx:  # type: ignore[attr-defined]
            rows = await tx.rows(
                "SELECT holder, expires_at FROM session_leases WHERE session_id = %s",
                (session,),
            )
            return (rows[0][0], float(rows[0][1]), tx.now) if rows else None

    return _on_plane(dsn, work)


def _answer(dsn: str, session: str, call_id: str, *, allow: bool) -> tuple[str | None, bool]:
    async def work(plane: ControlPlane) -> tuple[str | None, bool]:
        row, won = await plane.answer_approval(
            session_id=session, call_id=call_id, allow=allow, by="op"
        )
        return (row.status if row else None), won

    return _on_plane(dsn, work)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["body"]["kind"] == kind]


def _model_sees(workers: Workers, session: str) -> list[Any]:
    """What the model is shown of the session's history next (its tool results)."""

    async def read() -> list[Any]:
        storage = Storage.from_url(workers.store)
        try:
            state = await Sessions(storage).state(session)
            return [m for m in state.projector.project().messages if hasattr(m, "call_id")]
        finally:
            await storage.close()

    return asyncio.run(read())


def _wait_dormant(workers: Workers, session: str) -> ApprovalRequest:
    """Until the question is pending and the session indexed waiting with its lease
    released; the pending question."""
    dsn = workers.control
    wait_for("a parked question", lambda: len(_pending(dsn, session)) == 1)
    wait_for("the session indexed waiting", lambda: _status(dsn, session) == "waiting")

    def released() -> bool:
        lease = _lease(dsn, session)
        return lease is not None and lease[1] <= lease[2]

    wait_for("the lease released", released)
    (pending,) = _pending(dsn, session)
    return pending


def test_a_parked_session_is_dormant_and_an_answer_runs_the_call_once_on_a_new_worker(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    workers = _setup(tmp_path, postgres, SHIP_AND_LOG)
    dsn = workers.control
    try:
        first = _start(workers)
        assert workers.send("s1", "ship it").returncode == 0
        pending = _wait_dormant(workers, "s1")
        assert (pending.tool, pending.mode, pending.summary) == ("ship", "park",
                                                                 '{"target": "prod"}')  # fmt: skip
        # released, not merely expired: nobody holds the session, anyone may take it now
        lease = _lease(dsn, "s1")
        assert lease is not None and lease[1] == 0
        assert first.poll() is None  # the worker lives on, holding nothing of s1

        async def take(plane: ControlPlane) -> bool:
            taken = await plane.acquire_session(session_id="s1", holder="probe", ttl_s=30)
            if taken is not None:
                await plane.release_session(lease=taken)
            return taken is not None

        assert _on_plane(dsn, take)
        # the other call of the batch ran, once; the parked one did not
        assert [line.split()[0] for line in _lines(tmp_path / "logged")] == ["hello"]
        assert _lines(tmp_path / "shipped") == []
        events = workers.events("s1")
        decided = [e for e in _of(events, "permission_decided") if e["call_id"] == pending.call_id]
        assert [d["body"]["decision"] for d in decided] == ["park"]
        assert pending.call_id not in [e["call_id"] for e in _of(events, "tool_dispatched")]
        assert _of(events, "run_ended")[-1]["body"]["status"] == "interrupted"
        assert _of(events, "turn_ended") == []

        os.kill(first.pid, signal.SIGKILL)  # no worker at all while a person decides
        first.wait(timeout=30)
        assert _answer(dsn, "s1", pending.call_id, allow=True) == ("allow", True)
        assert _answer(dsn, "s1", pending.call_id, allow=False) == ("allow", False)
        second = _start(workers)
        wait_for("the turn completed", lambda: _status(dsn, "s1") == "completed")
    finally:
        workers.stop_all()
    assert _lines(tmp_path / "shipped") == [f"prod {second.pid}"]  # once, by the new worker
    assert [line.split()[0] for line in _lines(tmp_path / "logged")] == ["hello"]
    events = workers.events("s1")
    assert [e["body"]["input"] for e in _of(events, "turn_started")] == ["ship it"]
    ship_calls = [e for e in _of(events, "tool_dispatched") if e["body"]["tool"] == "ship"]
    assert [e["call_id"] for e in ship_calls] == [pending.call_id]
    decided = [e for e in _of(events, "permission_decided") if e["call_id"] == pending.call_id]
    assert [(d["body"]["decision"], d["body"]["by"]) for d in decided] == [
        ("park", "user"), ("allow", "user"),
    ]  # fmt: skip
    assert _of(events, "turn_ended")[-1]["body"]["status"] == "completed"
    seen = {m.call_id: m for m in _model_sees(workers, "s1")}
    assert seen[pending.call_id].content == "shipped prod"
    assert lodger(tmp_path, "log", "verify", "s1", "--store", workers.store).returncode == 0


def test_an_unanswered_parked_question_expires_into_a_denial(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    workers = _setup(tmp_path, postgres, SHIP)
    dsn = workers.control
    try:
        _start(workers, "--approval-expiry", "2")
        assert workers.send("s1", "ship it").returncode == 0
        wait_for("a parked question", lambda: len(_pending(dsn, "s1")) == 1)
        (pending,) = _pending(dsn, "s1")
        # the wake queued with the question comes due at the expiry: the same worker
        # resumes the session, and the expired question denies the call
        wait_for("the turn completed", lambda: _status(dsn, "s1") == "completed")
    finally:
        workers.stop_all()
    assert _lines(tmp_path / "shipped") == []
    assert _answer(dsn, "s1", pending.call_id, allow=True) == ("expired", False)
    events = workers.events("s1")
    decided = [d["body"]["decision"] for d in _of(events, "permission_decided")]
    assert decided == ["park", "deny"]
    assert [r["body"]["reason"] for r in _of(events, "call_rejected")] == ["denied"]
    assert _of(events, "tool_dispatched") == []
    (seen,) = _model_sees(workers, "s1")
    assert seen.is_error and "denied" in seen.content


def test_a_worker_killed_after_it_recorded_the_question_leaves_it_answerable(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    workers = _setup(tmp_path, postgres, SHIP)
    dsn = workers.control
    assert workers.send("s1", "ship it").returncode == 0
    killer = subprocess.run(
        [sys.executable, str(KILLER), workers.store, dsn, str(workers.script), str(PARK_TOOLS),
         str(tmp_path)],
        env=env(tmp_path), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert killer.returncode == -signal.SIGKILL, killer.stderr
    victim = (tmp_path / "parked-by").read_text()
    # it died holding the lease: the row still names it and was never released (0)
    lease = _lease(dsn, "s1")
    assert lease is not None and f":{victim}:" in lease[0] and lease[1] > 0
    assert _status(dsn, "s1") is None  # it never indexed the session
    # the question is live without that lease (live or not, listing does not depend on it)
    (pending,) = _pending(dsn, "s1")
    assert pending.mode == "park"
    events = workers.events("s1")
    assert [d["body"]["decision"] for d in _of(events, "permission_decided")] == ["park"]
    assert _answer(dsn, "s1", pending.call_id, allow=True) == ("allow", True)
    try:
        replacement = _start(workers)
        # the dead worker's claim on the message and its lease expire; then it resumes
        wait_for("the turn completed", lambda: _status(dsn, "s1") == "completed")
    finally:
        workers.stop_all()
    assert _lines(tmp_path / "shipped") == [f"prod {replacement.pid}"]
    events = workers.events("s1")
    assert [e["body"]["input"] for e in _of(events, "turn_started")] == ["ship it"]
    assert [e["call_id"] for e in _of(events, "tool_dispatched")] == [pending.call_id]
    assert [d["body"]["decision"] for d in _of(events, "permission_decided")] == [
        "park", "allow",
    ]  # fmt: skip
    runs = _of(events, "run_started")
    assert len(runs) == 2 and runs[1]["body"]["parent_run_id"] == runs[0]["run_id"]
    assert _of(events, "turn_ended")[-1]["body"]["status"] == "completed"

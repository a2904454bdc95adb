"""`lodger cancel --control` for a turn that one of two worker processes runs, through a
real PostgreSQL control plane (and the SQLite one): the worker holding the session
delivers the request, the running call settles, the turn ends cancelled; asking again
writes nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lodger.testing.postgres import PostgresServer

from ._workers import Workers, lodger, wait_for

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("plane", ["postgres", "sqlite"])
def test_cancel_reaches_the_worker_that_runs_the_turn(
    tmp_path: Path, plane: str, request: pytest.FixtureRequest
) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps([{"calls": [{"name": "note", "args": {"tag": "c"}}]}, {"text": "never"}])
    )
    if plane == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres")
        dsn = server.new_database()
    else:
        dsn = str(tmp_path / "control.sqlite3")
    workers = Workers(tmp_path, f"file://{tmp_path / 'objects'}", dsn, script)
    try:
        for _ in range(2):
            workers.start()
        sent = workers.send("s1", "wait for ever")
        assert sent.returncode == 0, sent.stderr
        wait_for("a worker inside the tool", (tmp_path / "holding-c").exists)
        holder = int((tmp_path / "holding-c").read_text())
        assert holder in [p.pid for p in workers.procs]

        def cancel() -> subprocess.CompletedProcess[str]:
            return lodger(tmp_path, "cancel", "s1", "--reason", "enough",
                          "--store", workers.store, "--control", dsn, "--json")  # fmt: skip

        done = cancel()
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["status"] == "cancelled"
        events = workers.events("s1")
        kinds = [e["body"]["kind"] for e in events]
        # committed together with the turn's end (and its workspace snapshot, on a store)
        assert kinds[-4:] == [
            "cancel_requested", "workspace_snapshot", "run_ended", "turn_ended"
        ], kinds  # fmt: skip
        assert events[-4]["body"]["reason"] == "enough"
        assert events[-1]["body"]["status"] == "cancelled"
        responded = [e["body"] for e in events if e["body"]["kind"] == "tool_responded"]
        assert [r["status"] for r in responded] == ["cancelled"]
        assert not (tmp_path / "invocations").exists()  # the gated note never finished
        # asked again: the same request (the worker still holds the session) or nothing
        # runs any more; either way nothing more is written
        again = cancel()
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["status"] in ("already_cancelling", "not_running")
        assert len(workers.events("s1")) == len(events)
        verified = lodger(tmp_path, "log", "verify", "s1", "--store", workers.store)
        assert verified.returncode == 0, verified.stderr
    finally:
        workers.stop_all()


@pytest.mark.parametrize("plane", ["postgres"])
def test_lodger_mode_reaches_the_turn_a_worker_runs(
    tmp_path: Path, plane: str, request: pytest.FixtureRequest
) -> None:
    """`lodger mode --control` for a turn a worker runs: the worker commits the switch
    through the running turn (``session_modes``), and the same mode again writes nothing."""
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps([{"calls": [{"name": "note", "args": {"tag": "m"}}]}, {"text": "done"}])
    )
    server: PostgresServer = request.getfixturevalue("postgres")
    dsn = server.new_database()
    workers = Workers(tmp_path, f"file://{tmp_path / 'objects'}", dsn, script)
    try:
        workers.start()
        assert workers.send("s1", "note it").returncode == 0
        wait_for("the worker inside the tool", (tmp_path / "holding-m").exists)

        def mode(name: str) -> dict[str, object]:
            done = lodger(tmp_path, "mode", "s1", name, "--store", workers.store,
                          "--control", dsn, "--json")  # fmt: skip
            assert done.returncode == 0, done.stderr
            return dict(json.loads(done.stdout))

        assert mode("plan")["status"] == "changed"
        assert mode("plan")["status"] == "unchanged"
        (tmp_path / "gate-m").touch()
        wait_for(
            "the turn's end",
            lambda: any(e["body"]["kind"] == "turn_ended" for e in workers.events("s1")),
        )
        events = workers.events("s1")
        (changed,) = [e for e in events if e["body"]["kind"] == "permission_mode_changed"]
        (started,) = [e for e in events if e["body"]["kind"] == "turn_started"]
        assert changed["body"]["mode"] == "plan" and changed["turn_id"] == started["turn_id"]
    finally:
        workers.stop_all()

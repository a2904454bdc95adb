"""Global authorities across real processes, and surviving a PostgreSQL restart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lodger.storage.control.postgres import PostgresControlPlane
from lodger.testing.postgres import PostgresServer

from ._workers import SRC, Workers, env, wait_for


@pytest.mark.slow
def test_a_semaphore_of_two_never_has_three_holders(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    dsn = postgres.new_database()
    (tmp_path / "holders").mkdir()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("_semaphore_holder.py")),
                dsn,
                str(tmp_path),
                "6",
            ],
            env={**env(tmp_path), "PYTHONPATH": str(SRC)},
        )
        for _ in range(3)
    ]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    results = [json.loads(p.read_text()) for p in tmp_path.glob("result-*")]
    assert len(results) == 3 and all(r["rounds"] == 6 for r in results)
    assert max(r["most"] for r in results) <= 2  # never three at once
    assert sum(r["refused"] for r in results) > 0  # and three did contend


async def test_the_control_plane_survives_a_postgres_restart(postgres: PostgresServer) -> None:
    control = PostgresControlPlane(postgres.new_database(), timeout_s=20)
    await control.start()
    try:
        before = await control.send(session_id="s1", message="before")
        postgres.restart()  # every pooled connection is now dead
        after = await control.send(session_id="s1", message="after")
        assert before is not None and after is not None and after > before
        assert [w.message for w in await control.pending_wakes()] == ["before", "after"]
    finally:
        await control.close()


@pytest.mark.slow
def test_a_worker_survives_a_postgres_restart_mid_run(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "ok"}]))
    dsn = postgres.new_database()
    workers = Workers(tmp_path, f"file://{tmp_path / 'objects'}", dsn, script)

    def turns() -> int:
        return len([e for e in workers.events("s1") if e["body"]["kind"] == "turn_ended"])

    try:
        worker = workers.start()
        assert workers.send("s1", "first").returncode == 0
        wait_for("the first turn", lambda: workers.has_session("s1") and turns() == 1)
        postgres.restart()
        assert workers.send("s1", "second").returncode == 0
        wait_for("the second turn, after the restart", lambda: turns() == 2)
        assert worker.poll() is None  # the same worker process, still serving
    finally:
        workers.stop_all()

"""``lodger decide`` and ``lodger abandon`` beside workers: with a control plane (named,
or the state directory's own ``control.sqlite3``), the fact is appended under the
session's lease, so never while a worker runs the session; an abandon withdraws the
turn's parked questions; and the wakes a worker held back for the turn are due at once.
Without one, nothing of a control plane is made."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from click.testing import CliRunner

from lodger.cli import main
from lodger.storage import EventLog, SqliteLogStore
from lodger.storage.control import SqliteControlPlane

T = TypeVar("T")
CRASHED = "s-crash"  # its turn stopped after T1 of call c1 (tests/cli/conftest.py)


def _on_plane(path: Path, work: Callable[[SqliteControlPlane], Awaitable[T]]) -> T:
    async def run() -> T:
        plane = SqliteControlPlane(path)
        await plane.start()
        try:
            return await work(plane)
        finally:
            await plane.close()

    return asyncio.run(run())


async def _held_wake(plane: SqliteControlPlane) -> int:
    """A message a worker looked at and held back for the session's open turn."""
    wake = await plane.send(session_id=CRASHED, message="and then?")
    assert wake is not None
    (claimed,) = await plane.claim_wakes(holder="worker", limit=1, ttl_s=60)
    await plane.hand_back_wake(wake_id=claimed.id, delay_s=3600, held=True)
    return wake


async def _due(plane: SqliteControlPlane) -> list[int]:
    now = await plane.now()
    return [w.id for w in await plane.pending_wakes(session_id=CRASHED) if w.due_at <= now]


def _events(state: Path) -> int:
    async def count() -> int:
        log = EventLog(SqliteLogStore(state))
        try:
            return len(await log.read_all(CRASHED))
        finally:
            await log.close()

    return asyncio.run(count())


def test_a_decision_releases_the_wakes_held_for_it(state_dir: Path) -> None:
    plane_file = state_dir / "control.sqlite3"  # where `lodger worker` keeps it by default
    wake = _on_plane(plane_file, _held_wake)
    assert _on_plane(plane_file, _due) == []
    result = CliRunner().invoke(
        main, ["decide", CRASHED, "c1", "--not-applied", "--state", str(state_dir)]
    )
    assert result.exit_code == 0, result.output
    assert _on_plane(plane_file, _due) == [wake]

    async def lease_free(plane: SqliteControlPlane) -> bool:
        return await plane.acquire_session(session_id=CRASHED, holder="w", ttl_s=5) is not None

    assert _on_plane(plane_file, lease_free)  # the command let the session go


def test_a_session_a_worker_runs_is_refused_and_nothing_is_written(
    state_dir: Path, tmp_path: Path
) -> None:
    plane_file = tmp_path / "elsewhere.sqlite3"

    async def running(plane: SqliteControlPlane) -> None:
        assert await plane.acquire_session(session_id=CRASHED, holder="worker", ttl_s=600)

    _on_plane(plane_file, running)
    before = _events(state_dir)
    for args in (["abandon", CRASHED], ["decide", CRASHED, "c1", "--completed"]):
        result = CliRunner().invoke(
            main, [*args, "--state", str(state_dir), "--control", str(plane_file)]
        )
        assert result.exit_code != 0
        assert "running in a worker" in result.stderr and "nothing was written" in result.stderr
    assert _events(state_dir) == before


def test_abandon_withdraws_the_turns_questions_and_releases_its_wakes(
    state_dir: Path, tmp_path: Path
) -> None:
    plane_file = tmp_path / "plane.sqlite3"

    async def parked(plane: SqliteControlPlane) -> int:
        await plane.park_approval(
            session_id=CRASHED, call_id="c1", tool="shell", summary="{}", holder="worker",
            expires_s=3600,
        )  # fmt: skip
        return await _held_wake(plane)

    wake = _on_plane(plane_file, parked)

    async def pending(plane: SqliteControlPlane) -> list[str]:
        return [a.call_id for a in await plane.list_approvals(session_id=CRASHED)]

    assert _on_plane(plane_file, pending) == ["c1"]
    result = CliRunner().invoke(
        main,
        ["abandon", CRASHED, "--state", str(state_dir), "--control", str(plane_file), "--json"],
    )
    assert result.exit_code == 0, result.output
    assert _on_plane(plane_file, pending) == []
    assert wake in _on_plane(plane_file, _due)


def test_without_a_control_plane_none_is_made(state_dir: Path) -> None:
    result = CliRunner().invoke(
        main, ["decide", CRASHED, "c1", "--not-applied", "--state", str(state_dir)]
    )
    assert result.exit_code == 0, result.output
    assert not (state_dir / "control.sqlite3").exists()


def test_a_control_plane_that_fails_after_the_fact_is_a_warning(state_dir: Path) -> None:
    """The decision is committed before the control plane is told; if telling it fails
    (here a trigger refuses every update of a wake), the command says so and succeeds."""
    plane_file = state_dir / "control.sqlite3"
    _on_plane(plane_file, _held_wake)
    with sqlite3.connect(plane_file) as conn:
        conn.execute(
            "CREATE TRIGGER refuse BEFORE UPDATE ON wakes BEGIN "
            "SELECT RAISE(ABORT, 'the plane refuses'); END"
        )
    before = _events(state_dir)
    result = CliRunner().invoke(
        main, ["decide", CRASHED, "c1", "--not-applied", "--state", str(state_dir)]
    )
    assert result.exit_code == 0, result.output
    assert "warning: the fact is recorded" in result.stderr
    assert "the plane refuses" in result.stderr
    assert _events(state_dir) == before + 1  # the decision is in the log

"""``lodger send``, ``lodger schedule`` and ``lodger sessions --control``: what they store,
and one clear line and exit 2 for bad input, with nothing enqueued."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from lodger.cli import main
from lodger.errors import UsageError
from lodger.storage.control import SqliteControlPlane, open_control
from lodger.storage.control.interface import SessionRow
from lodger.storage.control.postgres import PostgresControlPlane
from lodger.storage.control.schedule import next_fire, parse_at


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"LODGER_STORE": None, "LODGER_CONTROL": None, "COLUMNS": "200"})


def _pending(dsn: str) -> list[tuple[str, str | None, float]]:
    async def read() -> list[tuple[str, str | None, float]]:
        control = open_control(dsn)
        await control.start()
        try:
            return [(w.session_id, w.message, w.due_at) for w in await control.pending_wakes()]
        finally:
            await control.close()

    return asyncio.run(read())


def test_send_and_schedule_store_what_they_say(runner: CliRunner, tmp_path: Path) -> None:
    dsn = str(tmp_path / "c.sqlite3")
    out = runner.invoke(main, ["send", "s1", "hi", "--control", dsn, "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["duplicate"] is False
    later = runner.invoke(
        main, ["send", "s1", "later", "--at", "2030-01-01T00:00:00Z", "--control", dsn]
    )
    assert later.exit_code == 0 and "queued wake 2" in later.output
    made = runner.invoke(main, ["schedule", "s2", "--cron", "0 9 * * 1-5", "daily",
                                "--control", dsn, "--json"])  # fmt: skip
    assert made.exit_code == 0, made.output
    assert json.loads(made.output)["cron"] == "0 9 * * 1-5"
    assert _pending(dsn) == [("s1", "hi", _pending(dsn)[0][2]), ("s1", "later", 1893456000.0)]


def test_the_default_control_plane_is_beside_the_state(runner: CliRunner, tmp_path: Path) -> None:
    out = runner.invoke(main, ["send", "s1", "hi", "--state", str(tmp_path / "st")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "st" / "control.sqlite3").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["send", "../etc", "hi"], "invalid session id"),
        (["send", "s1", "hi", "--at", "tomorrow-ish"], "invalid time"),
        (["schedule", "s1", "--cron", "every day", "hi"], "invalid cron expression"),
        (["schedule", "s1", "--cron", "61 * * * *", "hi"], "invalid cron expression"),
        (["send", "s1", "hi", "--control", "mysql://x"], "invalid control plane DSN"),
        (["send", "s1", "hi", "--control", "sqlite://relative.db"], "invalid control plane DSN"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    runner: CliRunner, tmp_path: Path, args: list[str], needle: str
) -> None:
    dsn = str(tmp_path / "c.sqlite3")
    if "--control" not in args:
        args = [*args, "--control", dsn]
    out = runner.invoke(main, args)
    assert out.exit_code == 2, out.output
    assert needle in out.output and "Traceback" not in out.output
    if Path(dsn).exists():
        assert _pending(dsn) == []


def test_sessions_lists_the_index_without_a_store(runner: CliRunner, tmp_path: Path) -> None:
    dsn = str(tmp_path / "c.sqlite3")

    async def seed() -> None:
        control = SqliteControlPlane(dsn)
        await control.start()
        await control.record_session(
            row=SessionRow(session_id="s9", status="parked", last_activity=1.0, events=5)
        )
        await control.close()

    asyncio.run(seed())
    out = runner.invoke(main, ["sessions", "--control", dsn, "--json",
                               "--state", str(tmp_path / "nowhere")])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert [
        (r["session_id"], r["status"], r["events"]) for r in json.loads(out.output)["sessions"]
    ] == [("s9", "parked", 5)]
    assert not (tmp_path / "nowhere").exists()  # no log was opened or created
    table = runner.invoke(main, ["sessions", "--control", dsn])
    assert "s9" in table.output and "parked" in table.output


def test_times_and_dsns() -> None:
    assert parse_at("+90s", now=100.0) == 190.0
    assert parse_at("+2h", now=0.0) == 7200.0
    assert parse_at("1700000000", now=0.0) == 1700000000.0
    assert parse_at("2026-01-01T01:00:00+01:00", now=0.0) == 1767225600.0
    with pytest.raises(UsageError):
        parse_at("+5 minutes", now=0.0)
    assert next_fire("0 0 1 1 *", 0.0) == 31536000.0  # 1971-01-01, the first after epoch
    assert isinstance(open_control("postgresql://u@h/db"), PostgresControlPlane)
    assert isinstance(open_control("host=h dbname=db"), PostgresControlPlane)
    assert isinstance(open_control("sqlite:///tmp/x.db"), SqliteControlPlane)
    assert isinstance(open_control("state/control.sqlite3"), SqliteControlPlane)

"""Schema migrations: from an empty database and from the previous version, on both
control planes; a database newer than this lodger is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from lodger.errors import ControlPlaneError
from lodger.storage.control import SqliteControlPlane
from lodger.storage.control._sql import LATEST_VERSION, SqlControlPlane
from lodger.storage.control.interface import SessionRow
from lodger.storage.control.postgres import PostgresControlPlane
from lodger.testing.postgres import PostgresServer

Make = Callable[[], SqlControlPlane]


@pytest.fixture(params=["sqlite", "postgres"])
async def make(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Make]:
    made: list[SqlControlPlane] = []
    dsn = ""
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres")
        dsn = server.new_database()

    def new() -> SqlControlPlane:
        control: SqlControlPlane = (
            PostgresControlPlane(dsn)
            if request.param == "postgres"
            else SqliteControlPlane(tmp_path / "control.sqlite3")
        )
        made.append(control)
        return control

    yield new
    for control in made:
        await control.close()


async def test_from_an_empty_database(make: Make) -> None:
    control = make()
    await control.start()
    assert await control.schema_version() == LATEST_VERSION == 11
    # what versions 2, 3, 4 and 5 added works
    assert await control.acquire_permit(name="api", limit=1, holder="a", ttl_s=60)
    asked = await control.ask_approval(
        session_id="s1", call_id="c1", tool="deploy", summary="{}", holder="w", wait_s=60
    )
    assert asked.status == "pending"
    made = await control.add_token(token_hash="ab" * 32, scope="admin", session_id=None, label="")
    assert await control.get_token(token_hash="ab" * 32) == made
    assert await control.claim_delivery(hook="gh", delivery="d", session_id="s9") == "s9"
    failed = await control.send(session_id="s9", message="m")
    assert failed is not None
    await control.finish_wake(wake_id=failed, error="internal_error: boom")
    info = await control.get_wake(wake_id=failed)
    assert info is not None and info.status == "failed"


async def test_from_the_previous_version(make: Make) -> None:
    old = make()
    await old.start(version=1)
    assert await old.schema_version() == 1
    await old.record_session(
        row=SessionRow(session_id="s1", status="completed", last_activity=5.0, events=3)
    )
    wake = await old.send(session_id="s1", message="kept", idempotency_key="k")
    with pytest.raises(ControlPlaneError):  # version 1 has no schedules table
        await old.add_schedule(session_id="s1", cron="* * * * *", message="m")
    await old.close()

    new = make()
    await new.start()
    assert await new.schema_version() == LATEST_VERSION
    (row,) = await new.list_sessions()
    assert (row.session_id, row.events) == ("s1", 3)
    assert [w.id for w in await new.pending_wakes()] == [wake]
    assert await new.send(session_id="s1", message="kept", idempotency_key="k") is None
    schedule = await new.add_schedule(session_id="s1", cron="*/5 * * * *", message="m")
    assert [s.id for s in await new.list_schedules()] == [schedule.id]


async def test_from_version_2(make: Make) -> None:
    old = make()
    await old.start(version=2)
    assert await old.schema_version() == 2
    await old.record_session(
        row=SessionRow(session_id="s1", status="parked", last_activity=5.0, events=7)
    )
    wake = await old.send(session_id="s1", message="kept", idempotency_key="k2")
    schedule = await old.add_schedule(session_id="s1", cron="*/5 * * * *", message="m")
    with pytest.raises(ControlPlaneError):  # version 2 has no approvals table
        await old.list_approvals()
    await old.close()

    new = make()
    await new.start()
    assert await new.schema_version() == LATEST_VERSION
    (row,) = await new.list_sessions()
    assert (row.session_id, row.status, row.events) == ("s1", "parked", 7)
    assert [w.id for w in await new.pending_wakes()] == [wake]
    assert [s.id for s in await new.list_schedules()] == [schedule.id]
    assert await new.send(session_id="s1", message="kept", idempotency_key="k2") is None
    assert await new.acquire_session(session_id="s1", holder="w", ttl_s=60)
    await new.ask_approval(
        session_id="s1", call_id="c1", tool="deploy", summary="{}", holder="w", wait_s=60
    )
    assert [a.call_id for a in await new.list_approvals(session_id="s1")] == ["c1"]


async def test_from_version_3(make: Make) -> None:
    old = make()
    await old.start(version=3)
    assert await old.schema_version() == 3
    await old.record_session(
        row=SessionRow(session_id="s1", status="completed", last_activity=5.0, model="m")
    )
    wake = await old.send(session_id="s1", message="kept", idempotency_key="host:s1:k")
    assert await old.acquire_session(session_id="s1", holder="w", ttl_s=60)
    await _old_approval(old)
    with pytest.raises(ControlPlaneError):  # version 3 has no host tokens table
        await old.get_token(token_hash="cd" * 32)
    with pytest.raises(ControlPlaneError):  # nor webhook deliveries
        await old.claim_delivery(hook="gh", delivery="d", session_id="s1")
    await old.close()

    new = make()
    await new.start()
    assert await new.schema_version() == LATEST_VERSION == 11
    (row,) = await new.list_sessions()
    assert (row.session_id, row.model) == ("s1", "m")
    assert [w.id for w in await new.pending_wakes()] == [wake]
    info = await new.wake_for_key(idempotency_key="host:s1:k")
    assert info is not None and info.wake.id == wake
    assert (info.status, info.error) == ("queued", None)
    assert [a.call_id for a in await new.list_approvals(session_id="s1")] == ["c1"]
    made = await new.add_token(token_hash="cd" * 32, scope="session", session_id="s1", label="l")
    assert await new.get_token(token_hash="cd" * 32) == made
    assert await new.claim_delivery(hook="gh", delivery="d", session_id="s1") == "s1"
    assert await new.claim_delivery(hook="gh", delivery="d", session_id="s2") == "s1"


async def _old_approval(old: SqlControlPlane) -> None:
    """A pending approval written as a worker before version 6 wrote it (no ``mode``)."""
    async with old._tx() as tx:
        await tx.change(
            "INSERT INTO approvals (session_id, call_id, tool, summary, status, asked_by, "
            "asked_at, expires_at) VALUES ('s1', 'c1', 'deploy', '{}', 'pending', 'w', "
            "%s, %s)",
            (tx.now, tx.now + 60),
        )


async def test_from_version_5_approvals_keep_waiting_and_parked_ones_are_new(make: Make) -> None:
    old = make()
    await old.start(version=5)
    assert await old.acquire_session(session_id="s1", holder="w", ttl_s=60)
    await _old_approval(old)
    await old.close()

    new = make()
    await new.start()
    assert await new.schema_version() == LATEST_VERSION == 11
    (kept,) = await new.list_approvals(session_id="s1")
    assert (kept.call_id, kept.mode, kept.asked_by) == ("c1", "wait", "w")
    parked = await new.park_approval(
        session_id="s1", call_id="c2", tool="deploy", summary="{}", holder="w", expires_s=60
    )
    assert (parked.status, parked.mode) == ("pending", "park")
    assert {a.call_id for a in await new.list_approvals(session_id="s1")} == {"c1", "c2"}


async def test_a_newer_schema_is_refused(make: Make) -> None:
    control = make()
    await control.start()
    async with control._tx() as tx:
        await tx.change("INSERT INTO schema_version (version) VALUES (%s)", (LATEST_VERSION + 1,))
    later = make()
    with pytest.raises(ControlPlaneError) as caught:
        await later.start()
    assert caught.value.code == "schema_too_new"


async def test_from_version_6_queued_wakes_are_not_held(make: Make) -> None:
    """A wake queued before version 7 has no ``held`` column: it reads as not held, so
    releasing its session's held wakes leaves its delay alone."""
    old = make()
    await old.start(version=6)
    # a wake handed back by a worker of version 6 (its code wrote no ``held``)
    wake = await old.send(session_id="s1", message="kept", due_at=(await old.now()) + 600)
    assert wake is not None
    await old.close()

    new = make()
    await new.start()
    assert await new.schema_version() == LATEST_VERSION == 11
    assert await new.release_held_wakes(session_id="s1") == 0
    (pending,) = await new.pending_wakes(session_id="s1")
    assert pending.id == wake and pending.due_at >= (await new.now()) + 300
    assert await new.claim_wakes(holder="w", limit=1, ttl_s=60) == []
    await new.hand_back_wake(wake_id=wake, delay_s=600, held=True)
    assert await new.release_held_wakes(session_id="s1") == 1
    assert [w.id for w in await new.claim_wakes(holder="w", limit=1, ttl_s=60)] == [wake]


async def test_from_version_8_wakes_are_kept_and_steers_work(make: Make) -> None:
    old = make()
    await old.start(version=8)
    kept = await old.send(session_id="s1", message="kept", idempotency_key="k8")
    await old.close()
    new = make()
    await new.start()
    assert await new.schema_version() == LATEST_VERSION == 11
    assert [w.id for w in await new.pending_wakes(session_id="s1")] == [kept]
    # version 9: steers for sessions on workers (none holds s2: the steer is a wake)
    assert await new.add_steer(session_id="s2", steer_id="st", text="go", who=None) is False
    assert [w.message for w in await new.pending_wakes(session_id="s2")] == ["go"]


async def test_version_10_adds_cancel_requests_to_a_version_9_database(make: Make) -> None:
    old = make()
    await old.start(version=9)
    lease = await old.acquire_session(session_id="s1", holder="w1", ttl_s=60)
    assert lease is not None
    with pytest.raises(ControlPlaneError):  # version 9 has no session_cancels table
        await old.request_cancel(session_id="s1", who=None, reason="")
    await old.close()
    new = make()
    await new.start()
    made, created = await new.request_cancel(session_id="s1", who="cli:a", reason="stop")
    assert created and made is not None and made.epoch == lease.epoch  # the lease was kept

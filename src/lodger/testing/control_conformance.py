"""The one conformance suite every control plane passes.

Subclass ``ControlConformance`` in a test module that provides a ``make_control`` fixture:
an async factory returning a started ``ControlPlane``, each call a new connection to the
same database (several calls play several workers), all closed by the fixture::

    @pytest.fixture
    async def make_control(tmp_path):
        made = []
        async def make():
            control = SqliteControlPlane(tmp_path / "control.sqlite3")
            await control.start()
            made.append(control)
            return control
        yield make
        for control in made:
            await control.close()

    class TestSqliteControl(ControlConformance):
        pass

Expiry is judged by the control plane's own clock, so the few tests about expiry use
short leases and wait past them (waiting longer on a loaded machine only makes them
more certainly expired); nothing asserts that something has *not* happened yet after a
sleep.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable

import pytest

from lodger.errors import LeaseLostError, StaleTokenError, UsageError
from lodger.storage.control._sql import LATEST_VERSION
from lodger.storage.control.interface import ControlPlane, ParkedCall, SessionRow, WakeEnd

__all__ = ["ControlConformance", "MakeControl"]

MakeControl = Callable[[], Awaitable[ControlPlane]]

_LONG = 60.0  # seconds: a lease that cannot expire during a test
_SHORT = 0.3


async def _past(control: ControlPlane, when: float) -> None:
    """Wait until the control plane's clock is past ``when``."""
    while await control.now() <= when:  # noqa: ASYNC110 - the clock is the database's
        await asyncio.sleep(0.05)


class ControlConformance:
    @pytest.fixture
    async def control(self, make_control: MakeControl) -> ControlPlane:
        return await make_control()

    # ----------------------------------------------------------- schema

    async def test_schema_is_at_the_latest_version(self, control: ControlPlane) -> None:
        assert await control.schema_version() == LATEST_VERSION

    async def test_starting_twice_migrates_once(self, make_control: MakeControl) -> None:
        first = await make_control()
        second = await make_control()  # same database: nothing left to migrate
        assert await second.schema_version() == await first.schema_version() == LATEST_VERSION

    # ----------------------------------------------------------- session leases

    async def test_secrets_are_kept_replaced_listed_and_deleted_as_given(
        self, make_control: MakeControl
    ) -> None:
        control, other = await make_control(), await make_control()
        value = bytes(range(256))  # every byte, as a sealed value has
        await control.put_secret(name="mcp-login:a", value=value)
        await control.put_secret(name="mcp-login:b", value=b"\x00")
        await control.put_secret(name="other:c", value=b"c")
        assert await other.get_secret(name="mcp-login:a") == value  # another connection
        await other.put_secret(name="mcp-login:a", value=b"new")
        assert await control.get_secret(name="mcp-login:a") == b"new"
        assert await control.list_secrets(prefix="mcp-login:") == ["mcp-login:a", "mcp-login:b"]
        assert await control.delete_secret(name="mcp-login:a") is True
        assert await control.delete_secret(name="mcp-login:a") is False
        assert await control.get_secret(name="mcp-login:a") is None

    async def test_a_session_lease_has_one_holder(self, control: ControlPlane) -> None:
        lease = await control.acquire_session(session_id="s1", holder="w1", ttl_s=_LONG)
        assert lease is not None and lease.epoch == 1
        assert await control.acquire_session(session_id="s1", holder="w2", ttl_s=_LONG) is None
        await control.check_session(lease=lease)
        renewed = await control.renew_session(lease=lease, ttl_s=_LONG)
        assert renewed.epoch == 1 and renewed.expires_at >= lease.expires_at
        other = await control.acquire_session(session_id="s2", holder="w2", ttl_s=_LONG)
        assert other is not None and other.epoch == 1

    async def test_each_grant_raises_the_epoch_and_fences_the_old(
        self, control: ControlPlane
    ) -> None:
        first = await control.acquire_session(session_id="s1", holder="w1", ttl_s=_LONG)
        assert first is not None
        await control.release_session(lease=first)
        second = await control.acquire_session(session_id="s1", holder="w2", ttl_s=_LONG)
        assert second is not None and second.epoch == 2
        with pytest.raises(LeaseLostError) as caught:
            await control.check_session(lease=first)
        assert caught.value.code == "lease_lost" and caught.value.session_id == "s1"
        with pytest.raises(LeaseLostError):
            await control.renew_session(lease=first, ttl_s=_LONG)
        await control.release_session(lease=first)  # a stale release changes nothing
        await control.check_session(lease=second)

    async def test_an_expired_lease_is_taken_over(self, control: ControlPlane) -> None:
        first = await control.acquire_session(session_id="s1", holder="w1", ttl_s=_SHORT)
        assert first is not None
        await _past(control, first.expires_at)
        with pytest.raises(LeaseLostError):  # expired, even before anyone takes it
            await control.check_session(lease=first)
        second = await control.acquire_session(session_id="s1", holder="w2", ttl_s=_LONG)
        assert second is not None and second.epoch == first.epoch + 1
        with pytest.raises(LeaseLostError):
            await control.renew_session(lease=first, ttl_s=_LONG)

    # ----------------------------------------------------------- wakes

    async def test_a_wake_is_claimed_once(self, make_control: MakeControl) -> None:
        one, two = await make_control(), await make_control()
        wake_id = await one.send(session_id="s1", message="hello")
        assert wake_id is not None
        claimed = await one.claim_wakes(holder="w1", limit=5, ttl_s=_LONG)
        assert [(w.id, w.session_id, w.message, w.attempts) for w in claimed] == [
            (wake_id, "s1", "hello", 1)
        ]
        assert await two.claim_wakes(holder="w2", limit=5, ttl_s=_LONG) == []
        await one.mark_wake_started(wake_id=wake_id, offset=7)
        assert [w.started_offset for w in await two.pending_wakes(session_id="s1")] == [7]
        await one.finish_wake(wake_id=wake_id)
        assert await two.pending_wakes() == []
        done = await two.get_wake(wake_id=wake_id)
        assert done is not None and (done.status, done.error) == ("done", None)

    async def test_a_wake_given_up_on_reads_failed_with_why(self, control: ControlPlane) -> None:
        wake_id = await control.send(session_id="s1", message="hello", idempotency_key="k-f")
        assert wake_id is not None
        await control.claim_wakes(holder="w", limit=1, ttl_s=_LONG)
        await control.finish_wake(wake_id=wake_id, error="worker_model: no model")
        assert await control.pending_wakes() == []
        info = await control.wake_for_key(idempotency_key="k-f")
        assert info is not None
        assert (info.status, info.error) == ("failed", "worker_model: no model")

    async def test_an_idempotency_key_enqueues_once(self, control: ControlPlane) -> None:
        first = await control.send(session_id="s1", message="pay", idempotency_key="k-1")
        again = await control.send(session_id="s1", message="pay", idempotency_key="k-1")
        other = await control.send(session_id="s1", message="pay", idempotency_key="k-2")
        assert first is not None and again is None and other is not None
        assert [w.id for w in await control.pending_wakes(session_id="s1")] == [first, other]

    async def test_a_timer_is_not_claimed_before_it_is_due(self, control: ControlPlane) -> None:
        now = await control.now()
        later = await control.send(session_id="s1", message="later", due_at=now + _LONG)
        soon = await control.send(session_id="s2", message="soon", due_at=now + _SHORT)
        assert await control.claim_wakes(holder="w", limit=5, ttl_s=_LONG) == []
        await _past(control, now + _SHORT)
        assert [w.id for w in await control.claim_wakes(holder="w", limit=5, ttl_s=_LONG)] == [soon]
        assert later in [w.id for w in await control.pending_wakes()]

    async def test_a_sessions_messages_are_claimed_in_order(self, control: ControlPlane) -> None:
        first = await control.send(session_id="s1", message="one")
        second = await control.send(session_id="s1", message="two")
        claimed = await control.claim_wakes(holder="w", limit=5, ttl_s=_LONG)
        assert [w.id for w in claimed] == [first]
        assert await control.claim_wakes(holder="w", limit=5, ttl_s=_LONG) == []
        assert first is not None
        await control.finish_wake(wake_id=first)
        assert [w.id for w in await control.claim_wakes(holder="w", limit=5, ttl_s=_LONG)] == [
            second
        ]

    async def test_wakes_of_a_held_session_wait(self, control: ControlPlane) -> None:
        lease = await control.acquire_session(session_id="s1", holder="w1", ttl_s=_LONG)
        assert lease is not None
        wake_id = await control.send(session_id="s1", message="m")
        assert await control.claim_wakes(holder="w2", limit=5, ttl_s=_LONG) == []
        await control.release_session(lease=lease)
        assert [w.id for w in await control.claim_wakes(holder="w2", limit=5, ttl_s=_LONG)] == [
            wake_id
        ]

    async def test_a_handed_back_wake_is_claimed_again(self, control: ControlPlane) -> None:
        wake_id = await control.send(session_id="s1", message="m")
        assert wake_id is not None
        (wake,) = await control.claim_wakes(holder="w1", limit=1, ttl_s=_LONG)
        await control.hand_back_wake(wake_id=wake.id, delay_s=_LONG)
        assert await control.claim_wakes(holder="w2", limit=1, ttl_s=_LONG) == []  # delayed
        await control.hand_back_wake(wake_id=wake.id)  # a delay never moves it earlier
        assert await control.claim_wakes(holder="w2", limit=1, ttl_s=_LONG) == []
        (pending,) = await control.pending_wakes()
        assert pending.due_at >= (await control.now()) + _LONG / 2

    async def test_held_wakes_are_due_when_their_turn_settles(self, control: ControlPlane) -> None:
        """A wake handed back ``held`` waits out its delay unless its session's turn
        settles first; releasing touches only that session's held wakes, never one that
        was sent for later or handed back plainly, and a released wake is not held again."""
        now = await control.now()
        sent = [
            await control.send(session_id="s1", message="after the approval"),
            await control.send(session_id="s1", message="tomorrow", due_at=now + 3 * _LONG),
            await control.send(session_id="s1", message="retry later"),
            await control.send(session_id="s2", message="another session"),
        ]
        assert None not in sent
        held, later, plain, other = (int(w or 0) for w in sent)
        handed: set[int] = set()
        while claimed := await control.claim_wakes(holder="w1", limit=5, ttl_s=_LONG):
            for wake in claimed:  # one wake of a session at a time
                keep = wake.id in (held, other)
                await control.hand_back_wake(wake_id=wake.id, delay_s=_LONG, held=keep)
                handed.add(wake.id)
        assert handed == {held, plain, other}
        assert await control.release_held_wakes(session_id="s1") == 1
        assert [w.id for w in await control.claim_wakes(holder="w2", limit=5, ttl_s=_LONG)] == [
            held
        ]
        assert await control.release_held_wakes(session_id="s1") == 0
        pending = {w.id: w.due_at for w in await control.pending_wakes()}
        assert pending[later] >= now + 2 * _LONG  # sent for later: untouched
        assert pending[plain] >= now + _LONG / 2 and pending[other] >= now + _LONG / 2

    async def test_an_abandoned_claim_is_claimed_by_another(self, control: ControlPlane) -> None:
        wake_id = await control.send(session_id="s1", message="m")
        (first,) = await control.claim_wakes(holder="dead", limit=1, ttl_s=_SHORT)
        await _past(control, (await control.now()) + _SHORT)
        (second,) = await control.claim_wakes(holder="alive", limit=1, ttl_s=_LONG)
        assert first.id == second.id == wake_id and second.attempts == 2

    async def test_concurrent_claimers_never_share_a_wake(self, make_control: MakeControl) -> None:
        workers = [await make_control() for _ in range(4)]
        sent = {await workers[0].send(session_id=f"s{i}", message="m") for i in range(24)}

        async def drain(index: int) -> list[int]:
            mine: list[int] = []
            while True:
                got = await workers[index].claim_wakes(holder=f"w{index}", limit=3, ttl_s=_LONG)
                if not got:
                    return mine
                mine += [w.id for w in got]

        claims = await asyncio.gather(*(drain(i) for i in range(4)))
        flat = [wake for claim in claims for wake in claim]
        assert sorted(flat) == sorted(w for w in sent if w is not None)  # each exactly once

    async def test_a_commit_check_can_record_where_a_wake_started(
        self, control: ControlPlane
    ) -> None:
        sent = int(await control.send(session_id="s1", message="hi") or 0)
        (claim,) = await control.claim_sessions(holder="w1", limit=1, ttl_s=_LONG)
        await control.check_session(lease=claim.lease, wake_started=(sent, 7))
        info = await control.get_wake(wake_id=sent)
        assert info is not None and info.wake.started_offset == 7
        await control.check_session(lease=claim.lease)  # a plain check changes nothing
        info = await control.get_wake(wake_id=sent)
        assert info is not None and info.wake.started_offset == 7
        await control.release_session(lease=claim.lease)
        with pytest.raises(LeaseLostError):
            await control.check_session(lease=claim.lease, wake_started=(sent, 9))

    async def test_a_claim_takes_wakes_and_their_leases_at_once(
        self, make_control: MakeControl
    ) -> None:
        """``claim_sessions``: up to ``limit`` wakes, each with its session's lease (a new
        epoch that fences the one before) and its index row, in one transaction; a
        session held by another holder is left alone."""
        one, two = await make_control(), await make_control()
        old = await one.acquire_session(session_id="s0", holder="earlier", ttl_s=_LONG)
        assert old is not None
        await one.release_session(lease=old)
        held = await one.acquire_session(session_id="held", holder="other", ttl_s=_LONG)
        assert held is not None
        await one.record_session(
            row=SessionRow(session_id="s1", status="completed", last_activity=1.0, events=5)
        )
        sent = [await one.send(session_id=f"s{i}", message=f"m{i}") for i in range(5)]
        await one.send(session_id="held", message="waits for its lease")
        first = await one.claim_sessions(holder="w1", limit=3, ttl_s=_LONG)
        assert [c.wake.id for c in first] == sent[:3]
        assert [(c.lease.session_id, c.lease.holder, c.lease.epoch) for c in first] == [
            ("s0", "w1", 2), ("s1", "w1", 1), ("s2", "w1", 1),
        ]  # fmt: skip
        assert [c.wake.attempts for c in first] == [1, 1, 1]
        assert [c.row.events if c.row else None for c in first] == [None, 5, None]
        for claim in first:
            await two.check_session(lease=claim.lease)
            assert await two.acquire_session(
                session_id=claim.wake.session_id, holder="w2", ttl_s=_LONG
            ) is None  # fmt: skip
        with pytest.raises(LeaseLostError):
            await two.check_session(lease=old)
        rest = await two.claim_sessions(holder="w2", limit=10, ttl_s=_LONG)
        assert [c.wake.id for c in rest] == sent[3:]  # never "held", never a claimed one
        assert await two.claim_sessions(holder="w3", limit=10, ttl_s=_LONG) == []

    async def test_concurrent_session_claimers_share_neither_wakes_nor_leases(
        self, make_control: MakeControl
    ) -> None:
        workers = [await make_control() for _ in range(4)]
        sent = set()
        for i in range(24):  # two messages a session: the second waits for the first
            sent.add(await workers[0].send(session_id=f"s{i % 12}", message=f"m{i}"))

        async def drain(index: int) -> list[int]:
            mine: list[int] = []
            idle = 0
            while idle < 3:
                got = await workers[index].claim_sessions(holder=f"w{index}", limit=3, ttl_s=_LONG)
                idle = 0 if got else idle + 1
                for claim in got:
                    mine.append(claim.wake.id)
                    await workers[index].end_wake(wake_id=claim.wake.id, lease=claim.lease)
                await asyncio.sleep(0)
            return mine

        claims = await asyncio.gather(*(drain(i) for i in range(4)))
        flat = [wake for claim in claims for wake in claim]
        assert sorted(flat) == sorted(w for w in sent if w is not None)  # each exactly once
        epochs = [
            await workers[0].acquire_session(session_id=f"s{i}", holder="x", ttl_s=_LONG)
            for i in range(12)
        ]
        assert [e.epoch if e else None for e in epochs] == [3] * 12  # two grants each

    async def test_ending_a_wake_finishes_or_hands_it_back_and_releases_its_lease(
        self, control: ControlPlane
    ) -> None:
        done_id = int(await control.send(session_id="s1", message="done") or 0)
        later_id = int(await control.send(session_id="s2", message="later") or 0)
        claims = {c.wake.id: c for c in await control.claim_sessions(
            holder="w1", limit=5, ttl_s=_LONG)}  # fmt: skip
        assert set(claims) == {done_id, later_id}
        await control.end_wake(wake_id=done_id, lease=claims[done_id].lease,
                               end=WakeEnd(error="x: why"))  # fmt: skip
        await control.end_wake(wake_id=later_id, lease=claims[later_id].lease,
                               end=WakeEnd(delay_s=_LONG))  # fmt: skip
        info = await control.get_wake(wake_id=done_id)
        assert info is not None and (info.status, info.error) == ("failed", "x: why")
        (pending,) = await control.pending_wakes()
        assert pending.id == later_id and pending.due_at >= (await control.now()) + _LONG / 2
        for claim in claims.values():  # released: the next grant fences it
            with pytest.raises(LeaseLostError):
                await control.check_session(lease=claim.lease)
            again = await control.acquire_session(
                session_id=claim.wake.session_id, holder="w2", ttl_s=_LONG
            )
            assert again is not None and again.epoch == 2

    async def test_indexing_a_session_records_parks_and_releases_held_wakes(
        self, control: ControlPlane
    ) -> None:
        held = await control.send(session_id="s1", message="after the approval")
        (claim,) = await control.claim_sessions(holder="w1", limit=1, ttl_s=_LONG)
        await control.end_wake(wake_id=claim.wake.id, lease=claim.lease,
                               end=WakeEnd(delay_s=_LONG, held=True))  # fmt: skip
        before = await control.now()
        calls = [ParkedCall(session_id="s1", call_id="c1", tool="pay", reason="r", since=0.0)]
        row = SessionRow(session_id="s1", status="parked", last_activity=0.0, events=3,
                         snapshot="sha256:a", model="script:x")  # fmt: skip
        assert await control.index_session(row=row, parked=calls) == 0  # nothing released
        got = await control.get_session(session_id="s1")
        assert got is not None and (got.status, got.events, got.snapshot) == ("parked", 3,
                                                                           "sha256:a")  # fmt: skip
        assert got.last_activity >= before  # stamped with the control plane's clock
        (parked,) = await control.list_parked(session_id="s1")
        assert parked.call_id == "c1" and parked.since >= before
        settled = SessionRow(session_id="s1", status="completed", last_activity=0.0, events=6)
        assert await control.index_session(row=settled, parked=[], release_held=True) == 1
        assert await control.list_parked(session_id="s1") == []
        got = await control.get_session(session_id="s1")
        assert got is not None and (got.status, got.snapshot) == ("completed", "sha256:a")
        (again,) = await control.claim_sessions(holder="w2", limit=1, ttl_s=_LONG)
        assert again.wake.id == held

    async def test_ending_a_wake_with_its_index_is_one_step(self, control: ControlPlane) -> None:
        first = int(await control.send(session_id="s1", message="one") or 0)
        (claim,) = await control.claim_sessions(holder="w1", limit=1, ttl_s=_LONG)
        calls = [ParkedCall(session_id="s1", call_id="c1", tool="pay", reason="r", since=0.0)]
        row = SessionRow(session_id="s1", status="parked", last_activity=0.0, events=3,
                         snapshot="sha256:a", model="script:x")  # fmt: skip
        before = await control.now()
        # handed back held, as asked, though its own release_held would free it
        await control.end_wake(wake_id=first, lease=claim.lease, end=WakeEnd(
            row=row, parked=calls, delay_s=_LONG, held=True, release_held=True))  # fmt: skip
        got = await control.get_session(session_id="s1")
        assert got is not None and (got.status, got.events, got.model) == ("parked", 3,
                                                                        "script:x")  # fmt: skip
        assert got.last_activity >= before  # stamped with the control plane's clock
        assert [c.call_id for c in await control.list_parked(session_id="s1")] == ["c1"]
        (pending,) = await control.pending_wakes(session_id="s1")
        assert pending.id == first and pending.due_at >= before + _LONG / 2
        with pytest.raises(LeaseLostError):  # released
            await control.check_session(lease=claim.lease)
        waited = await control.send(session_id="s1", message="two")
        (again,) = await control.claim_sessions(holder="w2", limit=1, ttl_s=_LONG)
        assert again.wake.id == waited and again.lease.epoch == claim.lease.epoch + 1
        settled = SessionRow(session_id="s1", status="completed", last_activity=0.0, events=6)
        await control.end_wake(wake_id=waited, lease=again.lease,
                               end=WakeEnd(row=settled, release_held=True))  # fmt: skip
        got = await control.get_session(session_id="s1")
        assert got is not None and (got.status, got.events) == ("completed", 6)
        assert got.snapshot == "sha256:a" and got.model == "script:x"  # kept
        assert await control.list_parked(session_id="s1") == []
        info = await control.get_wake(wake_id=waited)
        assert info is not None and info.status == "done"
        # the turn settled: the held wake is due now, and the lease is free
        (last,) = await control.claim_sessions(holder="w3", limit=1, ttl_s=_LONG)
        assert last.wake.id == first and last.lease.epoch == again.lease.epoch + 1

    async def test_a_missed_schedule_fires_once(self, control: ControlPlane) -> None:
        now = await control.now()
        schedule = await control.add_schedule(
            session_id="s1", cron="* * * * *", message="tick", start=now - 3600
        )
        assert schedule.next_at <= now  # an hour of runs were missed
        assert await control.fire_schedules() == 1
        assert await control.fire_schedules() == 0
        (wake,) = await control.pending_wakes(session_id="s1")
        assert wake.message == "tick"
        (moved,) = await control.list_schedules()
        assert now < moved.next_at <= now + 61

    # ----------------------------------------------------------- indexes

    async def test_the_session_index(self, control: ControlPlane) -> None:
        await control.record_session(
            row=SessionRow(session_id="s1", status="completed", last_activity=10.0, events=9,
                           snapshot="sha256:a", model="script:x")
        )  # fmt: skip
        await control.record_session(
            row=SessionRow(session_id="s2", status="parked", last_activity=20.0, events=4)
        )
        # a later row without a snapshot keeps the last known one
        await control.record_session(
            row=SessionRow(session_id="s1", status="interrupted", last_activity=30.0, events=12)
        )
        rows = await control.list_sessions()
        assert [(r.session_id, r.status, r.events, r.snapshot) for r in rows] == [
            ("s1", "interrupted", 12, "sha256:a"),
            ("s2", "parked", 4, None),
        ]
        got = await control.get_session(session_id="s1")
        assert got is not None and got.model == "script:x"
        assert await control.get_session(session_id="nope") is None

    async def test_the_parked_index(self, control: ControlPlane) -> None:
        calls = [
            ParkedCall(session_id="s1", call_id="c1", tool="pay", reason="indeterminate", since=1),
            ParkedCall(session_id="s1", call_id="c2", tool="pay", reason="indeterminate", since=2),
        ]
        await control.set_parked(session_id="s1", calls=calls)
        other = ParkedCall(session_id="s2", call_id="c9", tool="mail", reason="x", since=3)
        await control.set_parked(session_id="s2", calls=[other])
        assert [c.call_id for c in await control.list_parked(session_id="s1")] == ["c1", "c2"]
        await control.set_parked(session_id="s1", calls=[])
        assert [(c.session_id, c.call_id) for c in await control.list_parked()] == [("s2", "c9")]

    # ----------------------------------------------------------- global authorities

    async def test_named_lease_tokens_fence_late_writes(self, control: ControlPlane) -> None:
        first = await control.acquire_named(name="browser:tab1", holder="a", ttl_s=_SHORT)
        assert first is not None
        assert await control.acquire_named(name="browser:tab1", holder="b", ttl_s=_LONG) is None
        await control.admit_token(name="browser:tab1", token=first.token)
        await _past(control, first.expires_at)
        second = await control.acquire_named(name="browser:tab1", holder="b", ttl_s=_LONG)
        assert second is not None and second.token > first.token
        with pytest.raises(StaleTokenError) as caught:
            await control.admit_token(name="browser:tab1", token=first.token)
        assert caught.value.code == "stale_token"
        await control.admit_token(name="browser:tab1", token=second.token)
        with pytest.raises(StaleTokenError):
            await control.admit_token(name="never-granted", token=1)
        await control.release_named(lease=first)  # stale: changes nothing
        assert await control.acquire_named(name="browser:tab1", holder="c", ttl_s=_LONG) is None
        await control.release_named(lease=second)
        third = await control.acquire_named(name="browser:tab1", holder="c", ttl_s=_LONG)
        assert third is not None and third.token == second.token + 1

    async def test_a_semaphore_counts_permits(self, control: ControlPlane) -> None:
        a = await control.acquire_permit(name="mcp:github", limit=2, holder="a", ttl_s=_LONG)
        b = await control.acquire_permit(name="mcp:github", limit=2, holder="b", ttl_s=_SHORT)
        assert a is not None and b is not None and a != b
        assert await control.acquire_permit(name="mcp:github", limit=2, holder="c",
                                            ttl_s=_LONG) is None  # fmt: skip
        assert await control.acquire_permit(name="other", limit=1, holder="c", ttl_s=_LONG)
        await control.release_permit(name="mcp:github", permit=a)
        c = await control.acquire_permit(name="mcp:github", limit=2, holder="c", ttl_s=_LONG)
        assert c is not None
        await _past(control, (await control.now()) + _SHORT)  # b's permit expires
        assert await control.acquire_permit(name="mcp:github", limit=2, holder="d", ttl_s=_LONG)

    async def test_concurrent_permits_never_exceed_the_limit(
        self, make_control: MakeControl
    ) -> None:
        workers = [await make_control() for _ in range(4)]
        got = await asyncio.gather(
            *(
                w.acquire_permit(name="api", limit=2, holder=f"h{i}-{j}", ttl_s=_LONG)
                for i, w in enumerate(workers)
                for j in range(3)
            )
        )
        assert len([p for p in got if p is not None]) == 2

    async def test_a_quota_per_minute(self, control: ControlPlane) -> None:
        assert [await control.take_quota(name="api", per_minute=3) for _ in range(3)] == [0.0] * 3
        wait = await control.take_quota(name="api", per_minute=3)
        assert 0 < wait <= 60
        assert await control.take_quota(name="other", per_minute=3, per_hour=10) == 0.0
        wait_hour = await control.take_quota(name="api", per_minute=100, per_hour=3)
        assert 60 < wait_hour <= 3600  # the hour's limit, not the minute's, decides

    # ----------------------------------------------------------- host tokens, deliveries

    async def test_host_tokens_are_shared_by_hash_and_revoked_for_good(
        self, make_control: MakeControl
    ) -> None:
        a, b = await make_control(), await make_control()
        digest = _sha256("lgr_conformance-token")
        made = await a.add_token(token_hash=digest, scope="session", session_id="s1", label="ci")
        assert (made.token_hash, made.scope, made.session_id, made.label) == (
            digest, "session", "s1", "ci",
        )  # fmt: skip
        assert made.revoked_at is None and made.created_at > 0
        assert await b.get_token(token_hash=digest) == made  # another connection sees it
        assert await b.get_token(token_hash=_sha256("lgr_never-made")) is None
        # adding the hash again keeps (and returns) the first row: no widening by re-adding
        assert (
            await b.add_token(token_hash=digest, scope="admin", session_id=None, label="x") == made
        )
        admin = _sha256("lgr_admin")
        assert (await b.add_token(token_hash=admin, scope="admin", session_id=None,
                                  label="")).scope == "admin"  # fmt: skip
        assert await b.revoke_token(token_hash=digest) is True
        assert await a.revoke_token(token_hash=digest) is False  # revoked once
        revoked = await a.get_token(token_hash=digest)
        assert revoked is not None and revoked.revoked_at is not None
        again = await a.add_token(token_hash=digest, scope="session", session_id="s1", label="ci")
        assert again.revoked_at == revoked.revoked_at  # re-adding does not revive it
        still = await a.get_token(token_hash=admin)
        assert still is not None and still.revoked_at is None  # only that token
        listed = {row.token_hash: row for row in await b.list_tokens()}
        assert set(listed) == {digest, admin}  # revoked ones too, by hash only
        assert listed[digest].revoked_at is not None and listed[admin].revoked_at is None

    async def test_a_plain_token_or_a_wrong_scope_is_refused(self, control: ControlPlane) -> None:
        for bad in ("lgr_" + "a" * 43, "A" * 64, "g" * 64, "", "a" * 63, "a" * 65):
            with pytest.raises(UsageError) as caught:
                await control.add_token(token_hash=bad, scope="admin", session_id=None, label="")
            assert caught.value.code == "invalid_token_hash"
            with pytest.raises(UsageError):
                await control.get_token(token_hash=bad)
            with pytest.raises(UsageError):
                await control.revoke_token(token_hash=bad)
        digest = _sha256("lgr_scoped")
        for scope, session in (("session", None), ("admin", "s1"), ("root", None)):
            with pytest.raises(UsageError) as caught:
                await control.add_token(
                    token_hash=digest, scope=scope, session_id=session, label=""
                )
            assert caught.value.code == "invalid_request"
        assert await control.get_token(token_hash=digest) is None  # nothing was kept

    async def test_a_webhook_delivery_claims_one_session(self, make_control: MakeControl) -> None:
        a, b = await make_control(), await make_control()
        assert await a.claim_delivery(hook="gh", delivery="d1", session_id="s-a") == "s-a"
        assert await b.claim_delivery(hook="gh", delivery="d1", session_id="s-b") == "s-a"
        # deliveries are per hook: another hook's delivery with the same id is its own
        assert await b.claim_delivery(hook="stripe", delivery="d1", session_id="s-b") == "s-b"
        hosts = [await make_control() for _ in range(4)]
        got = await asyncio.gather(
            *(
                h.claim_delivery(hook="gh", delivery="d2", session_id=f"s{i}")
                for i, h in enumerate(hosts)
            )
        )
        assert len(set(got)) == 1 and got[0] in {f"s{i}" for i in range(4)}
        assert await a.claim_delivery(hook="gh", delivery="d2", session_id="late") == got[0]

    # ----------------------------------------------------------- steers

    async def test_a_steer_goes_to_the_holder_or_becomes_a_wake(
        self, make_control: MakeControl
    ) -> None:
        host, worker = await make_control(), await make_control()
        lease = await worker.acquire_session(session_id="s1", holder="w1", ttl_s=_LONG)
        assert lease is not None
        held = await host.add_steer(session_id="s1", steer_id="st1", text="left", who="ana")
        assert held is True
        await host.add_steer(session_id="s1", steer_id="st2", text="right", who=None)
        taken = await worker.take_steers(session_id="s1", holder="w1")
        assert [(t.steer_id, t.text, t.who) for t in taken] == [
            ("st1", "left", "ana"),
            ("st2", "right", None),
        ]
        assert await worker.take_steers(session_id="s1", holder="w1") == []  # taken once
        # another holder (after a crash) takes what was not done again
        again = await worker.take_steers(session_id="s1", holder="w2")
        assert [t.steer_id for t in again] == ["st1", "st2"]
        await worker.done_steers(session_id="s1", steer_ids=["st1"])
        assert await worker.requeue_steers(session_id="s1") == 0  # still held: nothing
        await worker.release_session(lease=lease)
        assert await worker.requeue_steers(session_id="s1") == 1  # st2, as a wake
        assert [w.message for w in await host.pending_wakes(session_id="s1")] == ["right"]
        assert await worker.requeue_steers(session_id="s1") == 0
        # with nobody holding the session, a steer is a wake at once (once per steer id)
        assert await host.add_steer(session_id="s2", steer_id="st3", text="up", who=None) is False
        assert await host.add_steer(session_id="s2", steer_id="st3", text="up", who=None) is False
        assert [w.message for w in await host.pending_wakes(session_id="s2")] == ["up"]
        assert await worker.take_steers(session_id="s2", holder="w1") == []

    async def test_requeue_skips_steers_the_log_holds(self, make_control: MakeControl) -> None:
        control = await make_control()
        lease = await control.acquire_session(session_id="s1", holder="w1", ttl_s=_LONG)
        assert lease is not None
        for steer_id in ("a", "b"):
            await control.add_steer(session_id="s1", steer_id=steer_id, text=steer_id, who=None)
        await control.release_session(lease=lease)
        assert await control.requeue_steers(session_id="s1", skip=["a"]) == 1
        assert [w.message for w in await control.pending_wakes(session_id="s1")] == ["b"]

    # ----------------------------------------------------------- cancel requests

    async def test_a_cancel_needs_a_held_lease_and_is_asked_once(
        self, make_control: MakeControl
    ) -> None:
        worker, host, other = await make_control(), await make_control(), await make_control()
        # nobody holds the session: nothing runs, nothing is recorded
        assert await host.request_cancel(session_id="s1", who="h", reason="") == (None, False)
        lease = await worker.acquire_session(session_id="s1", holder="w1", ttl_s=_LONG)
        assert lease is not None
        assert await worker.pending_cancel(lease=lease) is None
        asked = await asyncio.gather(
            host.request_cancel(session_id="s1", who="token:a", reason="stop"),
            other.request_cancel(session_id="s1", who="cli:b", reason="again"),
        )
        assert sorted(created for _, created in asked) == [False, True]
        first = next(c for c, created in asked if created)
        assert first is not None and first.epoch == lease.epoch and first.status == "pending"
        assert {c.id for c, _ in asked if c is not None} == {first.id}  # one request
        pending = await worker.pending_cancel(lease=lease)
        assert pending == first
        await worker.settle_cancel(cancel_id=first.id, status="cancelled")
        await worker.settle_cancel(cancel_id=first.id, status="not_running")  # settled once
        settled = await host.get_cancel(cancel_id=first.id)
        assert settled is not None and settled.status == "cancelled"
        assert await worker.pending_cancel(lease=lease) is None
        assert await host.get_cancel(cancel_id=first.id + 1000) is None

    async def test_a_cancel_is_for_one_lease_grant(self, control: ControlPlane) -> None:
        first = await control.acquire_session(session_id="s1", holder="w1", ttl_s=_LONG)
        assert first is not None
        made, created = await control.request_cancel(session_id="s1", who=None, reason="x")
        assert made is not None and created
        await control.release_session(lease=first)  # the turn ended before delivery
        second = await control.acquire_session(session_id="s1", holder="w2", ttl_s=_LONG)
        assert second is not None
        assert await control.pending_cancel(lease=second) is None  # the next run never sees it
        again, created = await control.request_cancel(session_id="s1", who=None, reason="y")
        assert again is not None and created and again.epoch == second.epoch

    async def test_ending_a_wake_settles_the_cancel_no_turn_took(
        self, control: ControlPlane
    ) -> None:
        for message, end in (("one", None), ("two", WakeEnd(delay_s=_LONG))):
            await control.send(session_id="s1", message=message)
            (claim,) = await control.claim_sessions(holder="w1", limit=1, ttl_s=_LONG)
            made, _ = await control.request_cancel(session_id="s1", who=None, reason="x")
            assert made is not None and made.epoch == claim.lease.epoch
            # asked after the worker's last look: its end answers the asker all the same
            await control.end_wake(wake_id=claim.wake.id, lease=claim.lease, end=end)
            settled = await control.get_cancel(cancel_id=made.id)
            assert settled is not None and settled.status == "not_running"
        taken = await control.acquire_session(session_id="s2", holder="w1", ttl_s=_LONG)
        assert taken is not None
        kept, _ = await control.request_cancel(session_id="s2", who=None, reason="x")
        assert kept is not None
        await control.end_wake(wake_id=0, lease=claim.lease)  # another session's end
        found = await control.get_cancel(cancel_id=kept.id)
        assert found is not None and found.status == "pending"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()

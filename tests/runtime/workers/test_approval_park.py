"""Parked approvals in the control plane (schema version 6), on SQLite and PostgreSQL:
a parked question is live without any lease, until its own expiry; parking queues the
session's one wake (key ``approval:<session>:<call>``) due at the expiry; the answer
that wins makes that wake due at once, in the same transaction; a second answer loses;
an expired question is refused and stays expired (a denial), even for a worker that
asks in the waiting mode; the parking approver reads the answer back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lodger import tool
from lodger.cli import main
from lodger.engine.permissions import _ASKING, Answered, Asking
from lodger.events import (
    EventDraft,
    TurnEnded,
    TurnStarted,
)
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.approvals import ParkingApprovals
from lodger.runtime.sessions import Binding
from lodger.runtime.worker import Worker, WorkerConfig
from lodger.storage import Storage
from lodger.storage.control import SqliteControlPlane
from lodger.storage.control._sql import SqlControlPlane, approval_key
from lodger.tools.spec import Tool


async def _park(plane: SqlControlPlane, call: str = "c1", expires_s: float = 3600.0) -> Any:
    return await plane.park_approval(
        session_id="s1", call_id=call, tool="deploy", summary='{"target": "prod"}',
        holder="worker-a", expires_s=expires_s,
    )  # fmt: skip


async def _due_wakes(plane: SqlControlPlane) -> list[int]:
    """The wakes a worker could claim now (claimed here, then handed back untouched)."""
    claimed = await plane.claim_wakes(holder="probe", limit=10, ttl_s=60)
    for wake in claimed:
        async with plane._tx() as tx:  # undo the claim: the test only looks
            await tx.change(
                "UPDATE wakes SET claimed_by = NULL, claim_expires_at = NULL, "
                "attempts = attempts - 1 WHERE id = %s",
                (wake.id,),
            )
    return [w.id for w in claimed]


async def test_a_parked_question_lives_without_a_lease_and_its_answer_wakes(
    plane: SqlControlPlane,
) -> None:
    asked = await _park(plane)
    assert (asked.status, asked.mode, asked.asked_by) == ("pending", "park", "worker-a")
    assert asked.expires_at - asked.asked_at == pytest.approx(3600.0)
    # nobody holds the session (there is no lease row at all): still listed, answerable
    assert await plane.acquire_session(session_id="s1", holder="probe", ttl_s=60) is not None
    async with plane._tx() as tx:
        await tx.change("DELETE FROM session_leases")
    assert [a.call_id for a in await plane.list_approvals()] == ["c1"]
    (wake,) = await plane.pending_wakes(session_id="s1")
    assert wake.message is None and wake.due_at == pytest.approx(asked.expires_at)
    info = await plane.wake_for_key(idempotency_key=approval_key("s1", "c1"))
    assert info is not None and info.wake.id == wake.id
    assert await _due_wakes(plane) == []  # not before the answer (or the expiry)
    # parked again (a resume that found no answer yet): the same question, the same wake
    again = await _park(plane, expires_s=10.0)
    assert (again.status, again.expires_at) == ("pending", asked.expires_at)
    assert [w.id for w in await plane.pending_wakes(session_id="s1")] == [wake.id]

    answers = await asyncio.gather(
        *(
            plane.answer_approval(session_id="s1", call_id="c1", allow=i % 2 == 0, by=f"p{i}")
            for i in range(6)
        )
    )
    winners = [row for row, won in answers if won]
    assert len(winners) == 1 and winners[0] is not None
    assert all(row is not None and row.status == winners[0].status for row, _ in answers)
    # one wake, due now
    assert await _due_wakes(plane) == [wake.id]
    assert [w.id for w in await plane.pending_wakes(session_id="s1")] == [wake.id]
    late, won = await plane.answer_approval(session_id="s1", call_id="c1", allow=True, by="x")
    assert not won and late is not None and late.status == winners[0].status
    assert await plane.list_approvals() == []
    # parked once more after the answer (a crash before the call's T1): the answer stands
    kept = await _park(plane)
    assert kept.status == winners[0].status


async def test_an_abandoned_turns_questions_are_withdrawn(plane: SqlControlPlane) -> None:
    await _park(plane, "c1")
    await _park(plane, "c2")
    other = await plane.park_approval(
        session_id="s2", call_id="c1", tool="deploy", summary="{}", holder="w", expires_s=60
    )
    await plane.answer_approval(session_id="s1", call_id="c2", allow=True, by="op")
    assert await plane.withdraw_approvals(session_id="s1") == 1  # only the pending one
    assert await plane.withdraw_approvals(session_id="s1") == 0
    row, won = await plane.answer_approval(session_id="s1", call_id="c1", allow=True, by="op")
    assert not won and row is not None and row.status == "expired"
    answered = await plane.poll_approval(session_id="s1", call_id="c2")
    assert answered is not None and answered.status == "allow"  # an answer stands
    assert [(a.session_id, a.call_id) for a in await plane.list_approvals()] == [
        (other.session_id, other.call_id)
    ]  # another session's question is untouched


async def test_an_expired_parked_question_is_a_denial_and_wakes_its_session(
    plane: SqlControlPlane,
) -> None:
    await _park(plane, expires_s=0.3)
    (wake,) = await plane.pending_wakes(session_id="s1")
    async with asyncio.timeout(30):
        while not await _due_wakes(plane):  # noqa: ASYNC110 - the control plane's clock
            await asyncio.sleep(0.05)
    assert await _due_wakes(plane) == [wake.id]
    assert await plane.list_approvals() == []
    row, won = await plane.answer_approval(session_id="s1", call_id="c1", allow=True, by="op")
    assert not won and row is not None and row.status == "expired"
    # neither a waiting worker nor a parking one asks it afresh: it stays a denial
    assert await plane.acquire_session(session_id="s1", holder="worker-b", ttl_s=60)
    waited = await plane.ask_approval(
        session_id="s1", call_id="c1", tool="deploy", summary="{}", holder="worker-b", wait_s=60
    )
    assert waited.status == "expired"
    assert (await _park(plane)).status == "expired"


async def test_a_waiting_workers_abandoned_question_parks_afresh(plane: SqlControlPlane) -> None:
    lease = await plane.acquire_session(session_id="s1", holder="worker-a", ttl_s=0.2)
    assert lease is not None
    await plane.ask_approval(
        session_id="s1", call_id="c1", tool="deploy", summary="{}", holder="worker-a", wait_s=60
    )
    await asyncio.sleep(0.4)  # worker-a died: its waiting question is answered by nobody
    assert await plane.list_approvals() == []
    parked = await plane.park_approval(
        session_id="s1", call_id="c1", tool="deploy", summary="{}", holder="worker-b",
        expires_s=60,
    )  # fmt: skip
    assert (parked.status, parked.mode, parked.asked_by) == ("pending", "park", "worker-b")
    row, won = await plane.answer_approval(session_id="s1", call_id="c1", allow=True, by="op")
    assert won and row is not None and row.status == "allow"


async def test_the_parking_approver_reads_the_answer(plane: SqlControlPlane) -> None:
    approvals = ParkingApprovals(plane)
    approve = approvals.approver("s1")
    t = Tool(name="deploy", description="", parameters={"type": "object"}, handler=_noop)

    async def answer_for(call: str, *, may_park: bool = True) -> Any:
        token = _ASKING.set(Asking(call_id=call, summary="{}", may_park=may_park))
        try:
            return await approve(t, {})
        finally:
            _ASKING.reset(token)

    assert await approve(t, {}) == "deny"  # asked about no call: never allowed
    assert await answer_for("c1") == "park"  # nothing asked yet
    await _park(plane, "c1")
    assert await answer_for("c1") == "park"  # asked, not answered
    await plane.answer_approval(session_id="s1", call_id="c1", allow=True, by="op")
    assert await answer_for("c1") == Answered("once", "op")  # and who answered
    await _park(plane, "c2")
    await plane.answer_approval(session_id="s1", call_id="c2", allow=False, by="op")
    assert await answer_for("c2") == Answered("deny", "op")
    await _park(plane, "c3", expires_s=0.2)
    await asyncio.sleep(0.4)
    assert await answer_for("c3") == "deny"  # expired
    # where a call cannot wait (a code cell), park goes back to the gate, which denies
    assert await answer_for("c4", may_park=False) == "park"
    assert await plane.poll_approval(session_id="s1", call_id="c4") is None
    # ... but an answer given already stands there too (a re-dispatch after a crash)
    assert await answer_for("c1", may_park=False) == Answered("once", "op")


async def _noop(arguments: dict[str, Any], ctx: Any) -> str:
    return ""


@dataclass
class _Running:
    """An in-process worker (SQLite control plane, ``file://`` store) and what the tests
    read of it."""

    control: SqliteControlPlane
    storage: Storage
    task: asyncio.Task[None]
    plane_file: Path
    store: str

    async def until(self, what: str, check: Callable[[], Awaitable[bool]]) -> None:
        async with asyncio.timeout(60):
            while not await check():
                assert not self.task.done(), what
                await asyncio.sleep(0.02)

    async def status(self, session_id: str) -> str | None:
        row = await self.control.get_session(session_id=session_id)
        return row.status if row else None

    async def two_turns_completed(self, session_id: str) -> bool:
        events = await self.storage.log.read_all(session_id)
        ended = [e.body.status for e in events if isinstance(e.body, TurnEnded)]
        return ended == ["completed", "completed"]

    async def inputs(self, session_id: str) -> list[str]:
        events = await self.storage.log.read_all(session_id)
        return [e.body.input for e in events if isinstance(e.body, TurnStarted)]

    async def looked_at(self, wake_id: int, times: int) -> bool:
        """Whether the wake was claimed ``times`` times and is queued again."""
        info = await self.control.get_wake(wake_id=wake_id)
        return info is not None and info.wake.attempts >= times and info.status == "queued"


@contextlib.asynccontextmanager
async def _worker(
    tmp_path: Path, tools: list[Tool], turns: list[Any], *, parked_delay_s: float
) -> AsyncIterator[_Running]:
    """A worker whose binding parks approvals, running until the block ends."""
    plane_file = tmp_path / "control.sqlite3"
    control = SqliteControlPlane(plane_file)
    await control.start()
    store = f"file://{tmp_path / 'objects'}"
    storage = Storage.from_url(store)
    approvals = ParkingApprovals(control)

    def bind(session_id: str, recorded: str | None, workspace: Path) -> Binding:
        return Binding(
            model=ScriptedModel(turns=turns),
            tools=tools,
            workspace=workspace,
            approver=approvals.approver(session_id),
        )

    worker = Worker(
        control=control,
        storage=storage,
        bind=bind,
        config=WorkerConfig(poll_s=0.02, parked_delay_s=parked_delay_s, lease_ttl_s=5),
        workdir=tmp_path,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield _Running(control, storage, task, plane_file, store)
    finally:
        stop.set()
        await task
        await storage.close()
        await control.close()


SHIP_TURNS = [
    [{"calls": [{"name": "ship", "args": {"target": "prod"}}]}, {"text": "shipped"}],
    [{"text": "second answered"}],
]


def _ship_tool(ran: list[str]) -> Tool:
    @tool(approval=True)
    def ship(target: str) -> str:
        """Ship (needs approval)."""
        ran.append(target)
        return f"shipped {target}"

    return ship


async def test_a_message_sent_while_parked_waits_without_touching_the_log(
    tmp_path: Path,
) -> None:
    """A message sent to a session whose approval is unanswered is looked at and handed
    back without resuming the turn (its log does not grow), and is delivered as the next
    turn once the answer has let the waiting turn finish."""
    ran: list[str] = []
    async with _worker(tmp_path, [_ship_tool(ran)], SHIP_TURNS, parked_delay_s=0.2) as run:
        await run.control.send(session_id="s1", message="ship it")
        await run.until("parked", lambda: _is(lambda: run.status("s1"), "waiting"))
        (pending,) = await run.control.list_approvals(session_id="s1")
        dormant = len(await run.storage.log.read_all("s1"))
        message = await run.control.send(session_id="s1", message="second")
        assert message is not None
        await run.until("looked at and handed back twice", lambda: run.looked_at(message, 2))
        assert len(await run.storage.log.read_all("s1")) == dormant  # no resume, no new fact
        assert ran == []
        await run.control.answer_approval(session_id="s1", call_id=pending.call_id,
                                          allow=True, by="op")  # fmt: skip
        await run.until("both turns completed", lambda: run.two_turns_completed("s1"))
        assert await run.inputs("s1") == ["ship it", "second"]
    assert ran == ["prod"]


async def _is(read: Callable[[], Awaitable[object]], expected: object) -> bool:
    return bool(await read() == expected)


def test_the_worker_refuses_to_both_wait_and_park(tmp_path: Path) -> None:
    runner = CliRunner(env={"LODGER_STORE": None, "LODGER_CONTROL": None, "COLUMNS": "200"})
    out = runner.invoke(
        main,
        ["worker", "--approval-park", "--approval-wait", "30",
         "--control", str(tmp_path / "c.sqlite3"), "--state", str(tmp_path / "state")],
    )  # fmt: skip
    assert out.exit_code == 2, out.output
    assert "--approval-park and --approval-wait" in out.output
    assert "Traceback" not in out.output
    assert not (tmp_path / "c.sqlite3").exists()  # refused before anything was opened
    for bad in ("0", "inf", "nan", "soon"):  # a question lives one second to a year
        refused = runner.invoke(
            main,
            ["worker", "--approval-park", "--approval-expiry", bad,
             "--control", str(tmp_path / "c.sqlite3"), "--state", str(tmp_path / "state")],
        )  # fmt: skip
        assert refused.exit_code == 2 and "--approval-expiry" in refused.output, bad
        assert not (tmp_path / "c.sqlite3").exists()
    shown = runner.invoke(main, ["worker", "--help"])
    assert "--approval-park" in shown.output and "--approval-expiry" in shown.output


@pytest.mark.parametrize(
    ("command", "option"),
    [("worker", "--lease-ttl"), ("worker", "--grace"), ("worker", "--poll"),
     ("worker", "--approval-wait"), ("serve", "--poll")],
)  # fmt: skip
def test_no_seconds_option_takes_nan_or_inf(tmp_path: Path, command: str, option: str) -> None:
    runner = CliRunner(env={"LODGER_STORE": None, "LODGER_CONTROL": None, "COLUMNS": "200"})
    for bad in ("nan", "inf", "-inf"):
        refused = runner.invoke(
            main,
            [command, option, bad, "--control", str(tmp_path / "c.sqlite3"),
             "--state", str(tmp_path / "state")],
        )  # fmt: skip
        assert refused.exit_code == 2, (option, bad, refused.output)
        assert option in refused.output and "Traceback" not in refused.output
        assert not (tmp_path / "c.sqlite3").exists()  # refused before anything was opened


async def test_a_message_held_for_a_parked_turn_goes_as_soon_as_the_turn_settles(
    tmp_path: Path,
) -> None:
    """With the worker's next look at a parked session an hour away, a message sent while
    the approval is unanswered is still delivered right after the answer lets the turn
    finish: the worker that settles the turn releases the held message (schema v7)."""
    ran: list[str] = []
    async with _worker(tmp_path, [_ship_tool(ran)], SHIP_TURNS, parked_delay_s=3600) as run:
        await run.control.send(session_id="s1", message="ship it")
        await run.until("parked", lambda: _is(lambda: run.status("s1"), "waiting"))
        (pending,) = await run.control.list_approvals(session_id="s1")
        message = await run.control.send(session_id="s1", message="second")
        assert message is not None
        await run.until("the message looked at and held", lambda: run.looked_at(message, 1))
        (looked,) = [w for w in await run.control.pending_wakes(session_id="s1") if w.id == message]
        assert looked.due_at > (await run.control.now()) + 1800  # only a release brings it
        await run.control.answer_approval(session_id="s1", call_id=pending.call_id,
                                          allow=True, by="op")  # fmt: skip
        await run.until(
            "both turns completed well before the next look", lambda: run.two_turns_completed("s1")
        )
        assert await run.inputs("s1") == ["ship it", "second"]
    assert ran == ["prod"]


async def test_a_message_held_for_an_operator_goes_as_soon_as_lodger_decide_runs(
    tmp_path: Path, stopped_after_t1: Callable[[str, str], list[EventDraft]]
) -> None:
    """A turn stopped after T1 of a call only an operator can settle: the worker holds a
    message back (its next look an hour away); ``lodger decide --control`` records the
    decision and releases it, and a worker resumes the turn and delivers the message."""
    drafts = stopped_after_t1("charge", str(tmp_path / "gone"))

    @tool
    def charge() -> str:
        """Charge a card (not idempotent: a stop after T1 needs an operator)."""
        raise AssertionError("never runs again")

    turns = [  # the first turn's step 0 is the one in the log above
        [{"calls": [{"name": "charge", "args": {}}]}, {"text": "it never ran, so I stop"}],
        [{"text": "second answered"}],
    ]
    async with _worker(tmp_path, [charge], turns, parked_delay_s=3600) as run:
        async with await run.storage.log.open_writer("d1") as writer:
            await writer.append(drafts, expected_offset=0)
        message = await run.control.send(session_id="d1", message="second")
        assert message is not None
        await run.until("the message looked at and held", lambda: run.looked_at(message, 1))
        blocked = [e.kind for e in await run.storage.log.read_all("d1")][len(drafts) :]
        assert "tool_responded" not in blocked and "turn_ended" not in blocked  # still open
        decided = await asyncio.to_thread(
            CliRunner().invoke,
            main,
            ["decide", "d1", "c1", "--not-applied", "--store", run.store,
             "--control", str(run.plane_file)],
        )  # fmt: skip
        assert decided.exit_code == 0, decided.output
        await run.until(
            "both turns completed well before the next look", lambda: run.two_turns_completed("d1")
        )

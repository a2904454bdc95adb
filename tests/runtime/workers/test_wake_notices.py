"""Workers built for many sessions, on a real PostgreSQL: wakes delivered by
``LISTEN``/``NOTIFY`` (a worker that polls once an hour still claims at once), and finding
due work that stays O(due) among 10,000 dormant sessions (the plans use the indexes)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from lodger import FunctionModel
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.runtime.sessions import Binding
from lodger.runtime.worker import Worker, WorkerConfig
from lodger.storage import Storage
from lodger.storage.control._sql import DUE_SCHEDULES, DUE_WAKES
from lodger.storage.control.interface import WakeBell
from lodger.storage.control.postgres import _CLAIM_SESSIONS, PostgresControlPlane
from lodger.testing.postgres import PostgresServer

_HOUR = 3600.0
_BOUND = 60.0  # seconds: only a failing test waits this long


async def _rung(bell: WakeBell, after: int) -> None:
    """Until ``bell`` has rung more than ``after`` times (bounded: a failure, not a hang)."""
    async with asyncio.timeout(_BOUND):
        while bell.rings <= after:
            bell.clear()
            await bell.wait()


async def _live(bell: WakeBell) -> None:
    async with asyncio.timeout(_BOUND):
        while not bell.live:  # noqa: ASYNC110 - set by the listener's connection
            await asyncio.sleep(0.01)


async def test_a_due_wake_and_a_released_lease_ring_the_listeners(
    postgres: PostgresServer,
) -> None:
    dsn = postgres.new_database()
    control, listener = PostgresControlPlane(dsn), PostgresControlPlane(dsn)
    await control.start()
    await listener.start()
    bell = WakeBell()
    listening = asyncio.ensure_future(listener.listen_wakes(bell))
    try:
        await _live(bell)
        await _rung(bell, 0)  # a (re)connection rings once, for what nobody heard
        rings = bell.rings
        await control.send(session_id="s1", message="first")
        await _rung(bell, rings)
        # a second message waits for the session's lease, then rings when it is released
        (claim,) = await control.claim_sessions(holder="w", limit=5, ttl_s=_HOUR)
        rings = bell.rings
        await control.send(session_id="s1", message="second")
        await _rung(bell, rings)
        rings = bell.rings
        assert await control.claim_sessions(holder="w2", limit=5, ttl_s=_HOUR) == []
        await control.end_wake(wake_id=claim.wake.id, lease=claim.lease)
        await _rung(bell, rings)
        (second,) = await control.claim_sessions(holder="w2", limit=5, ttl_s=_HOUR)
        assert second.wake.message == "second"
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        await listener.close()
        await control.close()
    assert not bell.live


async def test_a_notified_worker_claims_at_once_and_reuses_its_folds(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """The worker polls once an hour: only the notifications can bring it the wakes.
    Its second wake of a session opens the fold from its cache (the stored head matched);
    after a turn run outside the worker the head differs and the log is read again."""
    dsn = postgres.new_database()
    control = PostgresControlPlane(dsn)
    await control.start()
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    seen: dict[str, str] = {}

    def bind(session_id: str, recorded: str | None, workspace: Path) -> Binding:
        def answer(request: ModelRequest) -> ModelResponse:
            seen[session_id] = repr(request.messages)  # the context the turn was given
            return ModelResponse(text=f"done {session_id}")

        return Binding(model=FunctionModel(answer), workspace=workspace)

    config = WorkerConfig(poll_s=_HOUR, notified_poll_s=_HOUR, schedules_every_s=_HOUR,
                          lease_ttl_s=30, concurrency=4)  # fmt: skip
    worker = Worker(control=control, storage=storage, bind=bind, config=config,
                    workdir=tmp_path)  # fmt: skip
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker.run(stop))
    try:
        await _live(worker.bell)
        sent = [await control.send(session_id=f"s{i}", message="hello") for i in range(3)]
        sent.append(await control.send(session_id="s0", message="again"))  # waits for s0
        await _done(control, sent_ids=sent, running=running)
        first = {r.session_id: r.events for r in await control.list_sessions()}
        again = await control.send(session_id="s1", message="again")
        await _done(control, sent_ids=[again], running=running)
        assert worker.stats.folds_reused >= 1
        # a turn outside the worker moves the head: the cached fold is not used
        outside = _outside_turn(storage, "s1")
        await outside
        read_before = worker.stats.folds_read
        last = await control.send(session_id="s1", message="once more")
        await _done(control, sent_ids=[last], running=running)
        assert worker.stats.folds_read > read_before
        events = await storage.log.read_all("s1")
        row = await control.get_session(session_id="s1")
        assert row is not None and row.events == len(events) > first["s1"]
        assert "from outside" in seen["s1"]  # the last turn saw the outside turn
    finally:
        stop.set()
        await asyncio.wait_for(running, _BOUND)
        await storage.close()
        await control.close()
    assert worker.stats.claimed == 6 and worker.stats.fenced == 0


async def _outside_turn(storage: Storage, session: str) -> None:
    from lodger.runtime.sessions import Sessions

    model = FunctionModel(lambda request: ModelResponse(text="from outside"))
    await Sessions(storage).run("outside", binding=Binding(model=model), session=session)


async def _done(control: PostgresControlPlane, *, sent_ids: list[Any], running: Any) -> None:
    async with asyncio.timeout(_BOUND):
        while True:
            assert not running.done(), running.exception()
            infos = [await control.get_wake(wake_id=w) for w in sent_ids]
            if all(i is not None and i.status == "done" for i in infos):
                return
            await asyncio.sleep(0.02)


async def test_due_work_is_found_by_index_among_10000_dormant_sessions(
    postgres: PostgresServer,
) -> None:
    """Dormant sessions (finished wakes, schedules and timers far ahead) leave the due
    wakes and due schedules to index scans that examine only what is due."""
    control = PostgresControlPlane(postgres.new_database())
    await control.start()
    try:
        async with control._tx() as tx:
            n = 10_000
            await tx.change(
                "INSERT INTO sessions (session_id, status, last_activity) "
                "SELECT 'd' || i, 'completed', %s FROM generate_series(1, %s) AS i",
                (tx.now, n),
            )
            await tx.change(
                "INSERT INTO wakes (session_id, message, due_at, done_at) "
                "SELECT 'd' || i, 'm', %s, %s FROM generate_series(1, %s) AS i",
                (tx.now - 60, tx.now - 30, n),
            )
            await tx.change(  # timers far ahead, and schedules not due for a day
                "INSERT INTO wakes (session_id, message, due_at) "
                "SELECT 'd' || i, NULL, %s FROM generate_series(1, %s) AS i",
                (tx.now + 86_400, n // 2),
            )
            await tx.change(
                "INSERT INTO schedules (session_id, cron, message, next_at) "
                "SELECT 'd' || i, '0 9 * * *', 'tick', %s FROM generate_series(1, %s) AS i",
                (tx.now + 86_400, n),
            )
            for i in range(3):
                await tx.change(
                    "INSERT INTO wakes (session_id, message, due_at) VALUES (%s, 'go', %s)",
                    (f"due{i}", tx.now - 1),
                )
            for table in ("wakes", "schedules", "session_leases", "sessions"):
                await tx.change(f"ANALYZE {table}")
            wakes = await _plan(tx, DUE_WAKES, (tx.now,) * 4 + (10,))
            schedules = await _plan(tx, DUE_SCHEDULES, (tx.now,))
        assert _scans(wakes) == {("wakes_pending", "wakes")}, wakes
        assert _scans(schedules) == {("schedules_due", "schedules")}, schedules
        assert _examined(wakes, "wakes_pending") <= 10  # the 3 due wakes, not 15,000 rows
        assert _examined(schedules, "schedules_due") == 0
        # the statement a PostgreSQL worker claims with (wakes, leases, index rows in one):
        # run under EXPLAIN ANALYZE, then rolled back; every table it reads among 10,000
        # dormant sessions is read by index, a handful of rows each
        try:
            async with control._tx() as tx:
                claim = await _plan(tx, _CLAIM_SESSIONS.decode(), (10, "w", 60.0, "w"))
                raise _RolledBack
        except _RolledBack:
            pass
        read = {n["Relation Name"]: n["Node Type"] for n in _nodes(claim) if "Relation Name" in n}
        assert "Seq Scan" not in read.values(), read
        assert {"wakes", "sessions", "session_leases"} <= set(read), read
        scans = [n for n in _nodes(claim) if "Relation Name" in n]
        assert sum(_read(n) for n in scans) <= 40, [(n.get("Alias"), _read(n)) for n in scans]
        claimed = await control.claim_sessions(holder="w", limit=10, ttl_s=60)
        assert sorted(c.wake.session_id for c in claimed) == ["due0", "due1", "due2"]
    finally:
        await control.close()


async def _plan(tx: Any, sql: str, params: tuple[Any, ...]) -> dict[str, Any]:
    rows = await tx.rows("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
    plan = rows[0][0]
    return dict((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"])


class _RolledBack(Exception):
    """Leaves a transaction undone."""


def _read(node: dict[str, Any]) -> int:
    """Rows a scan produced and filtered away, all its loops."""
    rows = int(node.get("Actual Rows", 0)) + int(node.get("Rows Removed by Filter", 0))
    return rows * int(node.get("Actual Loops", 1))


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out.extend(_nodes(child))
    return out


def _scans(plan: dict[str, Any]) -> set[tuple[str, str]]:
    """(index, table) of every scan of the outer query's table (the NOT EXISTS probes
    look up single sessions; they are checked by how much they read, not here)."""
    outer = [n for n in _nodes(plan) if n.get("Parent Relationship") != "SubPlan"]
    return {
        (n.get("Index Name", "(sequential)"), n["Relation Name"])
        for n in outer
        if "Relation Name" in n
        and n.get("Alias") in (None, "wakes", "schedules")
        and n["Relation Name"] in ("wakes", "schedules")
    }


def _examined(plan: dict[str, Any], index: str) -> int:
    """Rows the scan over ``index`` produced and filtered away, all loops."""
    total = 0
    for node in _nodes(plan):
        if node.get("Index Name") == index:
            loops = int(node.get("Actual Loops", 1))
            total += (int(node["Actual Rows"]) + int(node.get("Rows Removed by Filter", 0))) * loops
    return total


async def test_a_worker_claims_for_all_its_free_slots_at_once(tmp_path: Path) -> None:
    """Eight due wakes and four slots: the first claim takes four (one transaction), the
    rest follow as slots free; on SQLite, which sends no notifications, by polling."""
    from lodger.storage.control import SqliteControlPlane

    control = SqliteControlPlane(tmp_path / "control.sqlite3")
    await control.start()
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")

    def bind(session_id: str, recorded: str | None, workspace: Path) -> Binding:
        model = FunctionModel(lambda request: ModelResponse(text=f"done {session_id}"))
        return Binding(model=model, workspace=workspace)

    sent = [await control.send(session_id=f"s{i}", message="hello") for i in range(8)]
    config = WorkerConfig(poll_s=0.02, lease_ttl_s=30, concurrency=4)
    worker = Worker(control=control, storage=storage, bind=bind, config=config,
                    workdir=tmp_path)  # fmt: skip
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker.run(stop))
    try:
        async with asyncio.timeout(_BOUND):
            while True:
                assert not running.done(), running.exception()
                infos = [await control.get_wake(wake_id=int(w or 0)) for w in sent]
                if all(info is not None and info.status == "done" for info in infos):
                    break
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await asyncio.wait_for(running, _BOUND)
        await storage.close()
        await control.close()
    assert worker.stats.claimed == 8 and worker.stats.turns == 8
    assert worker.stats.claims <= 5  # 4 at once, then as slots freed (one each at worst)
    assert not worker.bell.live and worker.bell.rings == 0


async def test_a_workers_store_lease_lasts_no_longer_than_its_session_lease(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """A worker killed on another machine (its death unseen here) holds the log's writer
    lease only as long as its session lease: the store's own 30 s TTL is cut to it."""
    dsn = postgres.new_database()
    control = PostgresControlPlane(dsn)
    await control.start()
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    left: list[float] = []

    def bind(session_id: str, recorded: str | None, workspace: Path) -> Binding:
        def answer(request: ModelRequest) -> ModelResponse:
            leases = sorted((tmp_path / "objects" / "sessions" / session_id / "lease").iterdir())
            record = json.loads(leases[-1].read_text())  # the running turn's writer lease
            left.append(record["expires_us"] / 1e6 - time.time())
            return ModelResponse(text="ok")

        return Binding(model=FunctionModel(answer), workspace=workspace)

    config = WorkerConfig(poll_s=0.05, lease_ttl_s=3.0)
    worker = Worker(control=control, storage=storage, bind=bind, config=config,
                    workdir=tmp_path)  # fmt: skip
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker.run(stop))
    try:
        sent = await control.send(session_id="s1", message="hello")
        await _done(control, sent_ids=[sent], running=running)
    finally:
        stop.set()
        await asyncio.wait_for(running, _BOUND)
        await storage.close()
        await control.close()
    assert left and 0 < left[0] <= 3.0


async def test_where_a_message_started_is_recorded_with_the_turns_first_commit(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """``mark_wake_started`` rides in the first commit check of the delivered turn: by the
    time the model is asked (after ``turn_started`` is committed) the wake says where the
    message started, and no statement of its own was spent on it."""
    dsn = postgres.new_database()
    control = PostgresControlPlane(dsn)
    await control.start()
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    offsets: list[int | None] = []
    wake_ids: list[int] = []

    def bind(session_id: str, recorded: str | None, workspace: Path) -> Binding:
        async def answer(request: ModelRequest) -> ModelResponse:
            info = await control.get_wake(wake_id=wake_ids[-1])
            offsets.append(info.wake.started_offset if info else None)
            return ModelResponse(text="ok")

        return Binding(model=FunctionModel(answer), workspace=workspace)

    config = WorkerConfig(poll_s=0.05)
    worker = Worker(control=control, storage=storage, bind=bind, config=config,
                    workdir=tmp_path)  # fmt: skip
    marked: list[int] = []
    plain = control.mark_wake_started

    async def mark(*, wake_id: int, offset: int) -> None:
        marked.append(wake_id)
        await plain(wake_id=wake_id, offset=offset)

    control.mark_wake_started = mark  # type: ignore[method-assign]
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker.run(stop))
    try:
        for message in ("hello", "again"):
            wake_ids.append(int(await control.send(session_id="s1", message=message) or 0))
            await _done(control, sent_ids=wake_ids[-1:], running=running)
            if message == "hello":
                first_len = len(await storage.log.read_all("s1"))
    finally:
        stop.set()
        await asyncio.wait_for(running, _BOUND)
        await storage.close()
        await control.close()
    assert offsets == [0, first_len]
    assert marked == []  # no round trip of its own
    assert worker.guard._starts == {}  # nothing left pending

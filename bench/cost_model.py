"""What dormant sessions and wakes cost on a PostgreSQL control plane and an object store.

The figures behind the cost-model page (docs/guides/cost-model.md). In one process: a real
PostgreSQL (``lodger.testing.postgres``, loopback, fsync off), a ``file://`` object store
under the current directory, and one in-process ``Worker`` (concurrency 4) with a
scripted model whose turn makes one call of a no-op tool.

1. ``--sessions`` sessions are created by a message each and run to dormancy (``completed``,
   no process, no lease). Then, per dormant session: control-plane rows per table and
   bytes (``pg_total_relation_size``: heap, TOAST and indexes), object count and bytes.
   Measured at two sizes (a tenth and all of ``--sessions``) so growth can be read as
   linear or not.
2. One wake of a dormant session (a message in, the turn settled), over ``--wakes``
   sessions one after another: object-store requests (PUT, GET, LIST, HEAD, DELETE, lease
   object requests) and control-plane transactions per wake (``pg_stat_database`` before
   and after, less an idle interval of the same length), and its wall time (p50, p99).
3. Finding due work with nothing due, at both sizes: ``claim_wakes`` p50 (O(due): flat).

    python bench/cost_model.py [--quick] [--sessions N] [--wakes N]

A shared 2-core machine: read the per-session figures (they are counts), and the times as
orders of magnitude. The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lodger import tool
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.sessions import Binding
from lodger.runtime.worker import Worker, WorkerConfig
from lodger.storage import Storage
from lodger.storage.control.postgres import PostgresControlPlane
from lodger.storage.objectstore import ObjectLogStore
from lodger.testing.postgres import PostgresServer

TABLES = ("sessions", "session_leases", "wakes", "idempotency_keys", "parked")
REQUESTS = ("puts", "gets", "lists", "heads", "deletes")


@tool(recovery="idempotent")
def noop(text: str) -> str:
    """Return the text."""
    return text


def bind(session_id: str, model: str | None, workspace: Path) -> Binding:
    script = ScriptedModel(
        [{"calls": [{"name": "noop", "args": {"text": "x" * 100}}]}, {"text": "done"}]
    )
    return Binding(model=script, tools=[noop])


async def until_settled(control: PostgresControlPlane, sessions: set[str], events: int) -> None:
    while True:
        rows = {r.session_id: r for r in await control.list_sessions()}
        done = all(
            s in rows and rows[s].status == "completed" and rows[s].events > events
            for s in sessions
        )
        if done and not await control.pending_wakes():
            return
        await asyncio.sleep(0.01)


async def footprint(control: PostgresControlPlane, objects: Path) -> dict[str, Any]:
    rows: dict[str, int] = {}
    table_bytes: dict[str, int] = {}
    async with control._tx() as tx:
        for table in TABLES:
            rows[table] = int((await tx.rows(f"SELECT count(*) FROM {table}"))[0][0])
            size = await tx.rows("SELECT pg_total_relation_size(%s)", (table,))
            table_bytes[table] = int(size[0][0])
    files = await asyncio.to_thread(lambda: [p for p in objects.rglob("*") if p.is_file()])
    return {
        "sessions": len(await control.list_sessions()),
        "rows": rows,
        "table_bytes": table_bytes,
        "objects": len(files),
        "object_bytes": sum(p.stat().st_size for p in files),
    }


async def transactions(control: PostgresControlPlane) -> int:
    async with control._tx() as tx:
        row = await tx.rows(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
    return int(row[0][0])


async def counted(control: PostgresControlPlane, seconds: float) -> int:
    """Transactions the database saw over ``seconds`` (stats are flushed about each 1 s)."""
    before = await transactions(control)
    await asyncio.sleep(seconds)
    await asyncio.sleep(1.2)
    return await transactions(control) - before - 2  # the two reads themselves


async def create(control: PostgresControlPlane, start: int, count: int) -> None:
    for i in range(start, start + count):
        await control.send(session_id=f"s{i:06d}", message="hello")


async def idle_claim_ms(control: PostgresControlPlane, samples: int = 50) -> float:
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        assert await control.claim_wakes(holder="probe", limit=4, ttl_s=5.0) == []
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _per(value: int | float, sessions: int) -> float:
    return round(value / sessions, 2)


async def wakes(control: PostgresControlPlane, store: ObjectLogStore, count: int) -> dict[str, Any]:
    before = {name: getattr(store.stats, name) for name in REQUESTS}
    lease_before = store.lease_requests
    tx_before = await transactions(control)
    times: list[float] = []
    started_all = time.perf_counter()
    for i in range(count):
        sid = f"s{i:06d}"
        row = await control.get_session(session_id=sid)
        assert row is not None
        started = time.perf_counter()
        await control.send(session_id=sid, message="again")
        await until_settled(control, {sid}, row.events)
        times.append(time.perf_counter() - started)
    elapsed = time.perf_counter() - started_all
    await asyncio.sleep(1.2)  # statistics reach pg_stat_database about once a second
    tx = await transactions(control) - tx_before
    idle = await counted(control, elapsed)  # the worker's polling over the same time
    requests = {name: getattr(store.stats, name) - before[name] for name in REQUESTS}
    requests["lease"] = store.lease_requests - lease_before
    return {
        "wakes": count,
        "requests_per_wake": {k: round(v / count, 2) for k, v in requests.items()},
        "transactions_per_wake": round((tx - idle) / count, 1),
        "idle_transactions_per_s": round(idle / elapsed, 1),
        "wake_p50_ms": round(statistics.median(times) * 1000, 1),
        "wake_p99_ms": round(sorted(times)[int(len(times) * 0.99)] * 1000, 1),
    }


async def measure(args: argparse.Namespace, root: Path, dsn: str) -> dict[str, Any]:
    control = PostgresControlPlane(dsn)
    await control.start()
    storage = Storage.from_url(f"file://{root / 'objects'}")
    store = storage.log.store
    assert isinstance(store, ObjectLogStore)
    worker = Worker(
        control=control,
        storage=storage,
        bind=bind,
        config=WorkerConfig(concurrency=4, poll_s=0.05, lease_ttl_s=10.0),
        workdir=root / "work",
    )
    (root / "work").mkdir()
    stop = asyncio.Event()
    runner = asyncio.create_task(worker.run(stop))
    out: dict[str, Any] = {}
    try:
        small = max(args.sessions // 10, 1)
        for size, start in ((small, 0), (args.sessions, small)):
            began = time.perf_counter()
            await create(control, start, size - start)
            await until_settled(control, {f"s{i:06d}" for i in range(size)}, 0)
            print(f"  {size} sessions dormant ({time.perf_counter() - began:.1f} s)")
            out[f"at_{size}"] = {
                **await footprint(control, root / "objects"),
                "idle_claim_ms": round(await idle_claim_ms(control), 3),
            }
        out["wake"] = await wakes(control, store, args.wakes)
    finally:
        stop.set()
        await runner
        await storage.close()
        await control.close()
    return out


def report(result: dict[str, Any], sessions: int) -> None:
    big = result[f"at_{sessions}"]
    n = big["sessions"]
    print(f"per dormant session, at {n} sessions:")
    for table in TABLES:
        print(
            f"  {table:<18} rows {_per(big['rows'][table], n):>6}"
            f"   bytes {_per(big['table_bytes'][table], n):>8}"
        )
    print(f"  objects {_per(big['objects'], n)}   object bytes {_per(big['object_bytes'], n)}")
    for key in sorted(k for k in result if k.startswith("at_")):
        print(f"  claim with nothing due at {result[key]['sessions']} sessions: "
              f"{result[key]['idle_claim_ms']} ms")  # fmt: skip
    wake = result["wake"]
    print(f"one wake (message in, a one-call turn settled), over {wake['wakes']} wakes:")
    print(f"  object-store requests {wake['requests_per_wake']}")
    print(f"  control-plane transactions {wake['transactions_per_wake']}"
          f" (polling adds {wake['idle_transactions_per_s']}/s)")  # fmt: skip
    print(f"  wall time p50 {wake['wake_p50_ms']} ms, p99 {wake['wake_p99_ms']} ms")
    print(f"load average {os.getloadavg()[0]:.2f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 sessions, 20 wakes")
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--wakes", type=int, default=100)
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.wakes = 200, 20
    server = PostgresServer()
    server.init()
    root = Path.cwd() / tempfile.mkdtemp(prefix="lodger-bench-cost-", dir=".")
    try:
        result = await measure(args, root, server.new_database())
    finally:
        server.destroy()
        shutil.rmtree(root, ignore_errors=True)
    report(result, args.sessions)
    print(json.dumps({"bench": "cost_model", **result}))


if __name__ == "__main__":
    asyncio.run(main())

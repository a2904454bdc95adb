"""Workers on a PostgreSQL control plane and a local-directory object store.

Measured in one run, on this machine (shared and loaded: read ratios, not absolutes):

- wake latency of a dormant session: from ``send`` (enqueue) to the step start of the
  turn it wakes (the model request follows at once; the model is scripted), p50/p99,
  with one idle worker polling every ``--poll`` s; baseline: the same turn run directly
  through ``Sessions.run`` in-process (no queue, no worker), start to step start;
- throughput of N one-step sessions over 1, 2 and 4 worker processes (scaling ratio
  against 1 worker);
- lease handover after a SIGKILL: a worker is killed inside a tool; the time from the
  kill to another worker's resumed run, against the lease TTL (the floor);
- rows and bytes per dormant session: control-plane rows and table bytes, and object
  store bytes, divided by the sessions stored.

    python bench/workers.py [--quick]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lodger.providers.scripted import ScriptedModel
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage
from lodger.storage.control.postgres import PostgresControlPlane
from lodger.testing.postgres import PostgresServer

SRC = Path(__file__).resolve().parents[1] / "src"
LODGER = [sys.executable, "-c", "import sys; from lodger.cli import main; main()"]
TOOLS = '''
import asyncio, os
from pathlib import Path
from lodger import tool

@tool(recovery="idempotent")
async def hold(tag: str) -> str:
    """Wait for the gate file the first time."""
    root = Path(os.environ["BENCH_DIR"])
    if not (root / "gate").exists():
        (root / "holding").write_text(str(os.getpid()))
        while not (root / "gate").exists():
            await asyncio.sleep(0.01)
    return "ok"
'''


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC), "BENCH_DIR": str(root)}


class Bench:
    def __init__(self, root: Path, dsn: str, poll: float, ttl: float) -> None:
        self.root, self.dsn, self.poll, self.ttl = root, dsn, poll, ttl
        self.store = f"file://{root / 'objects'}"
        (root / "script.json").write_text(json.dumps([{"text": "ok"}]))
        (root / "hold.json").write_text(
            json.dumps([{"calls": [{"name": "hold", "args": {"tag": "x"}}]}, {"text": "ok"}])
        )
        (root / "tools.py").write_text(TOOLS)
        self.procs: list[subprocess.Popen[bytes]] = []

    def worker(self, script: str = "script.json") -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [*LODGER, "worker", "--store", self.store, "--control", self.dsn,
             "--model", f"script:{self.root / script}", "--tools", str(self.root / "tools.py"),
             "--poll", str(self.poll), "--lease-ttl", str(self.ttl), "--workdir", str(self.root)],
            env=_env(self.root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


async def _events(store: str, session: str) -> list[Any]:
    storage = Storage.from_url(store)
    try:
        return await storage.log.read_all(session)
    finally:
        await storage.close()


async def _wait_completed(
    control: PostgresControlPlane, sessions: set[str], *, more_than: int = 0
) -> None:
    """Until every session's index row is completed with more than ``more_than`` events."""
    while True:
        rows = {r.session_id: r for r in await control.list_sessions()}
        if all(
            s in rows and rows[s].status == "completed" and rows[s].events > more_than
            for s in sessions
        ):
            return
        await asyncio.sleep(0.02)


async def wake_latency(bench: Bench, control: PostgresControlPlane, n: int) -> list[float]:
    """send -> step start of the woken turn, per dormant session (one idle worker)."""
    sessions = [f"wake-{i}" for i in range(n)]
    for sid in sessions:  # make them exist, then let them go dormant
        await control.send(session_id=sid, message="hello")
    bench.worker()
    await _wait_completed(control, set(sessions))
    await asyncio.sleep(1.0)
    out = []
    for sid in sessions:
        row = await control.get_session(session_id=sid)
        assert row is not None
        sent = await control.now()
        await control.send(session_id=sid, message="again")
        await _wait_completed(control, {sid}, more_than=row.events)
        events = await _events(bench.store, sid)
        step = [e for e in events if e.body.kind == "step_started"][-1]
        out.append(step.ts / 1e6 - sent)
    bench.stop()
    return out


async def direct_latency(root: Path, n: int) -> list[float]:
    """The baseline: the same turn through Sessions.run in this process."""
    storage = Storage.from_url(f"file://{root / 'direct'}")
    model_path = root / "script.json"
    out = []
    try:
        for i in range(n):
            sessions = Sessions(storage)
            binding = Binding(model=ScriptedModel.from_file(str(model_path)))
            await sessions.run("hello", binding=binding, session=f"d{i}")
            start = time.time()
            await sessions.run("again", binding=binding, session=f"d{i}")
            events = await storage.log.read_all(f"d{i}")
            step = [e for e in events if e.body.kind == "step_started"][-1]
            out.append(step.ts / 1e6 - start)
    finally:
        await storage.close()
    return out


async def throughput(bench: Bench, control: PostgresControlPlane, n: int, k: int) -> float:
    sessions = {f"tp{k}-{i}" for i in range(n)}
    for _ in range(k):
        bench.worker()
    await asyncio.sleep(2.0)  # let the workers import and connect: measure the queue
    start = time.monotonic()
    for sid in sorted(sessions):
        await control.send(session_id=sid, message="go")
    await _wait_completed(control, sessions)
    elapsed = time.monotonic() - start
    bench.stop()
    return n / elapsed


async def handover(bench: Bench, control: PostgresControlPlane) -> float:
    for path in (bench.root / "gate", bench.root / "holding"):
        path.unlink(missing_ok=True)
    bench.worker("hold.json")
    bench.worker("hold.json")
    await control.send(session_id="handover", message="hold")
    while not (bench.root / "holding").exists():  # noqa: ASYNC110 - another process
        await asyncio.sleep(0.01)
    victim = int((bench.root / "holding").read_text())
    (bench.root / "gate").touch()
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    await _wait_completed(control, {"handover"})
    events = await _events(bench.store, "handover")
    resumed = [e for e in events if e.body.kind == "run_started"][-1]
    bench.stop()
    return resumed.ts / 1e6 - killed


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n_wake = 10 if args.quick else 50
    n_tp = 40 if args.quick else 1000
    poll, ttl = 0.05, 2.0
    server = PostgresServer()
    server.init()
    root = Path(tempfile.mkdtemp(prefix="lodger-bench-workers-"))
    try:
        dsn = server.new_database()
        control = PostgresControlPlane(dsn)
        await control.start()
        bench = Bench(root, dsn, poll, ttl)
        try:
            wake = await wake_latency(bench, control, n_wake)
            direct = await direct_latency(root, n_wake)
            rates = {k: await throughput(bench, control, n_tp, k) for k in (1, 2, 4)}
            hand = await handover(bench, control)
            rows: dict[str, int] = {}
            table_bytes = 0
            async with control._tx() as tx:
                for table in ("sessions", "session_leases", "wakes", "idempotency_keys", "parked"):
                    rows[table] = int((await tx.rows(f"SELECT count(*) FROM {table}"))[0][0])
                    size = await tx.rows("SELECT pg_total_relation_size(%s)", (table,))
                    table_bytes += int(size[0][0])
            stored = len(await control.list_sessions())
        finally:
            bench.stop()
            await control.close()
        obj_bytes = _du(root / "objects")
    finally:
        server.destroy()
        shutil.rmtree(root, ignore_errors=True)

    live_rows = rows["sessions"] + rows["session_leases"] + rows["parked"]
    print("workers: PostgreSQL control plane (loopback, fsync off) + file:// object store")
    print("numbers from a shared, loaded 2-core machine; compare the ratios")
    print(f"{'measure':<48}{'value':>14}")
    print(f"{'wake latency send->step p50 (s)':<48}{_pct(wake, 0.5):>14.4f}")
    print(f"{'wake latency send->step p99 (s)':<48}{_pct(wake, 0.99):>14.4f}")
    print(f"{'baseline: direct Sessions.run->step p50 (s)':<48}{statistics.median(direct):>14.4f}")
    for k, rate in rates.items():
        print(f"{f'throughput, {k} worker(s), {n_tp} sessions (/s)':<48}{rate:>14.1f}")
    print(f"{'lease handover after SIGKILL (s), ttl 2 s':<48}{hand:>14.3f}")
    print(f"{'control rows per session (live: sessions+leases)':<48}{live_rows / stored:>14.2f}")
    print(f"{'control rows per session (with finished wakes)':<48}"
          f"{(live_rows + rows['wakes'] + rows['idempotency_keys']) / stored:>14.2f}")  # fmt: skip
    print(f"{'control table bytes per session (incl. indexes)':<48}{table_bytes / stored:>14.0f}")
    print(f"{'object store bytes per session':<48}{obj_bytes / stored:>14.0f}")
    print(
        json.dumps(
            {
                "wake_p50_s": round(_pct(wake, 0.5), 4),
                "wake_p99_s": round(_pct(wake, 0.99), 4),
                "direct_p50_s": round(statistics.median(direct), 4),
                "wake_vs_direct": round(_pct(wake, 0.5) / statistics.median(direct), 2),
                "throughput_per_s": {str(k): round(v, 2) for k, v in rates.items()},
                "scaling_2_vs_1": round(rates[2] / rates[1], 2),
                "scaling_4_vs_1": round(rates[4] / rates[1], 2),
                "handover_s": round(hand, 3),
                "handover_vs_ttl": round(hand / ttl, 2),
                "rows_per_session": round(live_rows / stored, 2),
                "rows_per_session_with_wakes": round(
                    (live_rows + rows["wakes"] + rows["idempotency_keys"]) / stored, 2
                ),
                "control_bytes_per_session": round(table_bytes / stored),
                "object_bytes_per_session": round(obj_bytes / stored),
                "sessions": stored,
                "quick": args.quick,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())

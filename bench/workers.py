"""Workers on a PostgreSQL control plane and a local-directory object store.

Measured in one run, on this machine (shared and loaded: read ratios, not absolutes):

- wake latency of a dormant session: from ``send`` (enqueue) to the step start of the
  turn it wakes (the model request follows at once; the model is scripted), p50/p99,
  with one idle worker polling every ``--poll`` s; baseline: the same turn run directly
  through ``Sessions.run`` in-process (no queue, no worker), start to step start;
- idle wake: from ``send`` to the turn settled and indexed (no tool call), p50/p99, both
  ends on PostgreSQL's clock;
- throughput of a burst of N one-step sessions woken at once over 1, 2 and 4 worker
  processes (scaling ratio against 1 worker), and one worker with ``--concurrency 8``
  against ``--concurrency 1``; for each run the CPU seconds of the worker processes and
  of PostgreSQL (``/proc/<pid>/stat``), the machine's busy share over the run
  (``/proc/stat``, every process, ours or not) and wakes per CPU-second;
- with ``--before-src DIR`` (a checkout's ``src``, e.g. the commit before this work):
  the same burst with workers running that code, in its own database, as the "before"
  of wakes per CPU-second and scaling;
- with ``--before-src``, the wake latencies with that code too (its own database and
  worker), each wake alternating with one of the code now;
- lease handover after a SIGKILL: a worker is killed inside a tool; the time from the
  kill to another worker's resumed run, against the lease TTL (the floor);
- rows and bytes per dormant session: control-plane rows and table bytes, and object
  store bytes, divided by the sessions stored.

    python bench/workers.py [--quick] [--before-src /path/to/old/src]

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

import psycopg

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


def _env(root: Path, src: Path = SRC) -> dict[str, str]:
    """The workers' environment. Their bytecode is cached (in the bench's directory) even
    where the caller's environment says not to write it, as an installed lodger's is:
    else every worker compiles every module it imports, and the bursts measure that."""
    env = {**os.environ, "PYTHONPATH": str(src), "BENCH_DIR": str(root)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    return env


class Bench:
    def __init__(self, root: Path, dsn: str, poll: float, ttl: float, src: Path = SRC) -> None:
        self.root, self.dsn, self.poll, self.ttl, self.src = root, dsn, poll, ttl, src
        self.store = f"file://{root / 'objects'}"
        (root / "script.json").write_text(json.dumps([{"text": "ok"}]))
        (root / "hold.json").write_text(
            json.dumps([{"calls": [{"name": "hold", "args": {"tag": "x"}}]}, {"text": "ok"}])
        )
        (root / "tools.py").write_text(TOOLS)
        self.procs: list[subprocess.Popen[bytes]] = []

    def worker(self, script: str = "script.json", concurrency: int = 1) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [*LODGER, "worker", "--store", self.store, "--control", self.dsn,
             "--model", f"script:{self.root / script}", "--tools", str(self.root / "tools.py"),
             "--poll", str(self.poll), "--lease-ttl", str(self.ttl), "--workdir", str(self.root),
             "--concurrency", str(concurrency)],
            env=_env(self.root, self.src), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
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


async def wake_latency(
    benches: list[tuple[Bench, PostgresControlPlane]], n: int
) -> list[tuple[list[float], list[float]]]:
    """Per bench (its own database and one idle worker each): send -> step start of the
    woken turn, per dormant session; and send -> the turn settled and indexed (both on
    PostgreSQL's clock). With two benches (now and before) the wakes alternate between
    them, so both sample the same seconds of a shared machine."""
    sessions = [f"wake-{i}" for i in range(n)]
    for bench, control in benches:
        for sid in sessions:  # make them exist, then let them go dormant
            await control.send(session_id=sid, message="hello")
        bench.worker()
    for _, control in benches:
        await _wait_completed(control, set(sessions))
    await asyncio.sleep(1.0)
    out: list[tuple[list[float], list[float]]] = [([], []) for _ in benches]
    for sid in sessions:
        for (bench, control), (steps, idle) in zip(benches, out, strict=True):
            row = await control.get_session(session_id=sid)
            assert row is not None
            sent = await control.now()
            await control.send(session_id=sid, message="again")
            await _wait_completed(control, {sid}, more_than=row.events)
            events = await _events(bench.store, sid)
            step = [e for e in events if e.body.kind == "step_started"][-1]
            steps.append(step.ts / 1e6 - sent)
            settled = await control.get_session(session_id=sid)
            assert settled is not None
            idle.append(settled.last_activity - sent)
    for bench, _ in benches:
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


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(parent: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == parent:
                out.append(int(entry.name))
    return out


def _machine() -> tuple[float, float]:
    """(busy, total) jiffies of every CPU since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])
    return total - idle, total


class CpuMeter:
    """CPU seconds of the worker processes and of PostgreSQL (the postmaster and its
    children, less the bench's own watching connection) over one run."""

    def __init__(self, server: PostgresServer, workers: list[int], exclude: int) -> None:
        first = (server.data / "postmaster.pid").read_text().split("\n", 1)[0]
        self.postmaster = int(first)
        self.workers, self.exclude = workers, exclude

    def sample(self) -> tuple[float, float, tuple[float, float]]:
        pg = [self.postmaster, *_children(self.postmaster)]
        return (
            sum(_cpu_s(p) for p in self.workers),
            sum(_cpu_s(p) for p in pg if p != self.exclude),
            _machine(),
        )


async def throughput(
    bench: Bench, server: PostgresServer, n: int, k: int, *, concurrency: int = 1, tag: str = ""
) -> dict[str, float]:
    """A burst of ``n`` wakes of one-step sessions over ``k`` workers: wakes/s and CPU."""
    sessions = sorted(f"tp{tag}{k}c{concurrency}-{i}" for i in range(n))
    watch = await psycopg.AsyncConnection.connect(bench.dsn, autocommit=True)
    started = await _server_now(watch)
    procs = [bench.worker(concurrency=concurrency) for _ in range(k)]
    try:
        backend = int((await (await watch.execute("SELECT pg_backend_pid()")).fetchall())[0][0])
        meter = CpuMeter(server, [p.pid for p in procs], backend)
        control = PostgresControlPlane(bench.dsn, max_size=2)
        await control.start(version=await _version(watch))
        await _ready(watch, started, k)
        # a few wakes first: what a worker imports at its first turn is not the burst's
        warm = [f"warm{tag}{k}c{concurrency}-{i}" for i in range(3 * k)]
        for sid in warm:
            await control.send(session_id=sid, message="go")
        await _drained(watch, f"warm{tag}{k}c{concurrency}-%")
        before = meter.sample()
        start = time.monotonic()
        for sid in sessions:
            await control.send(session_id=sid, message="go")
        await _drained(watch, f"tp{tag}{k}c{concurrency}-%")
        elapsed = time.monotonic() - start
        after = meter.sample()
        await control.close()
    finally:
        await watch.close()
        bench.stop()
    workers_cpu, pg_cpu = after[0] - before[0], after[1] - before[1]
    busy = (after[2][0] - before[2][0]) / max(1, after[2][1] - before[2][1])
    return {
        "wakes_per_s": n / elapsed,
        "elapsed_s": elapsed,
        "workers_cpu_s": workers_cpu,
        "postgres_cpu_s": pg_cpu,
        "ours_busy": (workers_cpu + pg_cpu) / (elapsed * (os.cpu_count() or 1)),
        "machine_busy": busy,
        "wakes_per_cpu_s": n / max(1e-9, workers_cpu + pg_cpu),
    }


async def _drained(conn: psycopg.AsyncConnection[Any], pattern: str) -> None:
    while True:  # one cheap query a tick, not a list of every session
        cursor = await conn.execute(
            "SELECT count(*) FROM wakes WHERE done_at IS NULL AND session_id LIKE %s",
            (pattern,),
        )
        if int((await cursor.fetchall())[0][0]) == 0:
            return
        await asyncio.sleep(0.02)


async def _server_now(conn: psycopg.AsyncConnection[Any]) -> Any:
    return (await (await conn.execute("SELECT now()")).fetchall())[0][0]


async def _ready(conn: psycopg.AsyncConnection[Any], since: Any, k: int) -> None:
    """Until the ``k`` workers started after ``since`` listen for wakes (they have imported
    everything and connected: what they spend from then on is the burst's), then a
    moment more for their first look at the empty queue. A worker that never listens
    (the code before notifications) is given 10 s."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        cursor = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_start > %s AND query LIKE 'LISTEN%%'",
            (since,),
        )
        if int((await cursor.fetchall())[0][0]) >= k:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)


async def _version(conn: psycopg.AsyncConnection[Any]) -> int:
    cursor = await conn.execute("SELECT max(version) FROM schema_version")
    return int((await cursor.fetchall())[0][0])


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


def _row(label: str, value: float, fmt: str = ".4f") -> None:
    print(f"{label:<56}{value:>14{fmt}}")


async def _bursts(
    bench: Bench, server: PostgresServer, n: int, before: Bench | None
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Each burst now and (with ``before``) with the old code, interleaved so both sample
    the same minutes of a shared machine."""
    now: dict[str, dict[str, float]] = {}
    old: dict[str, dict[str, float]] = {}
    for k, c in ((1, 1), (2, 1), (4, 1), (1, 8)):
        name = f"{k}w" if c == 1 else f"{k}w_c{c}"
        now[name] = await throughput(bench, server, n, k, concurrency=c)
        if before is not None:
            old[name] = await throughput(before, server, n, k, concurrency=c, tag="b")
    return now, old


def _report(runs: dict[str, dict[str, float]], label: str, n: int) -> None:
    for name, run in runs.items():
        _row(f"{label}burst {n}, {name}: wakes/s", run["wakes_per_s"], ".1f")
        _row(f"{label}  CPU s: workers", run["workers_cpu_s"], ".2f")
        _row(f"{label}  CPU s: PostgreSQL", run["postgres_cpu_s"], ".2f")
        _row(f"{label}  busy: ours / machine (%)", 100 * run["ours_busy"], ".0f")
        _row(f"{label}  busy: machine, every process (%)", 100 * run["machine_busy"], ".0f")
        _row(f"{label}  wakes per CPU-second", run["wakes_per_cpu_s"], ".1f")


def _summary(runs: dict[str, dict[str, float]]) -> dict[str, Any]:
    one = runs["1w"]["wakes_per_s"]
    # every run is the same burst: wakes over CPU seconds of all of them together
    cpu_per_burst = sum(1 / r["wakes_per_cpu_s"] for r in runs.values())
    return {
        "runs": {k: {m: round(v, 3) for m, v in r.items()} for k, r in runs.items()},
        "scaling_2_vs_1": round(runs["2w"]["wakes_per_s"] / one, 2),
        "scaling_4_vs_1": round(runs["4w"]["wakes_per_s"] / one, 2),
        "concurrency_8_vs_1": round(runs["1w_c8"]["wakes_per_s"] / one, 2),
        "wakes_per_cpu_s": round(len(runs) / cpu_per_burst, 1),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--before-src", type=Path, default=None, help="the src directory of the code before"
    )
    args = parser.parse_args()
    n_wake = 10 if args.quick else 50
    n_tp = 40 if args.quick else 200
    poll, ttl = 0.05, 2.0
    load_start = os.getloadavg()
    server = PostgresServer()
    server.init()
    root = Path(tempfile.mkdtemp(prefix="lodger-bench-workers-"))
    try:
        dsn = server.new_database()
        control = PostgresControlPlane(dsn)
        await control.start()
        bench = Bench(root, dsn, poll, ttl)
        before = old_control = None
        if args.before_src is not None:
            (root / "before").mkdir()
            old_dsn = server.new_database()
            old_control = PostgresControlPlane(old_dsn)
            await old_control.start(version=7)  # the schema the code before this work knows
            before = Bench(root / "before", old_dsn, poll, ttl, src=args.before_src)
        try:
            pairs = [(bench, control)]
            if before is not None and old_control is not None:
                pairs.append((before, old_control))
            latencies = await wake_latency(pairs, n_wake)
            wake, idle = latencies[0]
            old_wake, old_idle = latencies[1] if len(latencies) > 1 else ([], [])
            if old_control is not None:
                await old_control.close()
                old_control = None
            direct = await direct_latency(root, n_wake)
            runs, old_runs = await _bursts(bench, server, n_tp, before)
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
            if before is not None:
                before.stop()
            if old_control is not None:
                await old_control.close()
            await control.close()
        obj_bytes = _du(root / "objects")
    finally:
        server.destroy()
        shutil.rmtree(root, ignore_errors=True)
    load_end = os.getloadavg()

    live_rows = rows["sessions"] + rows["session_leases"] + rows["parked"]
    print("workers: PostgreSQL control plane (loopback, fsync off) + file:// object store")
    print("numbers from a shared, loaded 2-core machine; compare the ratios")
    print(f"load averages: start {load_start}, end {load_end}")
    print(f"{'measure':<56}{'value':>14}")
    _row("wake latency send->step p50 (s)", _pct(wake, 0.5))
    _row("wake latency send->step p99 (s)", _pct(wake, 0.99))
    _row("idle wake send->settled p50 (s)", _pct(idle, 0.5))
    _row("idle wake send->settled p99 (s)", _pct(idle, 0.99))
    if old_wake:
        _row("before: wake latency send->step p50 (s)", _pct(old_wake, 0.5))
        _row("before: idle wake send->settled p50 (s)", _pct(old_idle, 0.5))
        _row("before: idle wake send->settled p99 (s)", _pct(old_idle, 0.99))
    _row("baseline: direct Sessions.run->step p50 (s)", statistics.median(direct))
    _report(runs, "", n_tp)
    if old_runs:
        _report(old_runs, "before: ", n_tp)
    now, old = _summary(runs), _summary(old_runs) if old_runs else None
    for key in ("scaling_2_vs_1", "scaling_4_vs_1", "concurrency_8_vs_1", "wakes_per_cpu_s"):
        _row(key, now[key], ".2f")
        if old is not None:
            _row(f"before: {key}", old[key], ".2f")
    if old is not None:
        _row(
            "wakes per CPU-second, now / before",
            now["wakes_per_cpu_s"] / old["wakes_per_cpu_s"],
            ".2f",
        )
    _row("lease handover after SIGKILL (s), ttl 2 s", hand, ".3f")
    _row("control rows per session (live: sessions+leases)", live_rows / stored, ".2f")
    _row("control rows per session (with finished wakes)",
         (live_rows + rows["wakes"] + rows["idempotency_keys"]) / stored, ".2f")  # fmt: skip
    _row("control table bytes per session (incl. indexes)", table_bytes / stored, ".0f")
    _row("object store bytes per session", obj_bytes / stored, ".0f")
    print(
        json.dumps(
            {
                "wake_p50_s": round(_pct(wake, 0.5), 4),
                "wake_p99_s": round(_pct(wake, 0.99), 4),
                "idle_wake_p50_s": round(_pct(idle, 0.5), 4),
                "idle_wake_p99_s": round(_pct(idle, 0.99), 4),
                "direct_p50_s": round(statistics.median(direct), 4),
                "before_wake_p50_s": round(_pct(old_wake, 0.5), 4) if old_wake else None,
                "before_idle_wake_p50_s": round(_pct(old_idle, 0.5), 4) if old_idle else None,
                "before_idle_wake_p99_s": round(_pct(old_idle, 0.99), 4) if old_idle else None,
                "wake_vs_direct": round(_pct(wake, 0.5) / statistics.median(direct), 2),
                "burst": n_tp,
                "throughput_per_s": {k: round(r["wakes_per_s"], 2) for k, r in runs.items()},
                **now,
                "before": old,
                "wakes_per_cpu_s_vs_before": (
                    round(now["wakes_per_cpu_s"] / old["wakes_per_cpu_s"], 2) if old else None
                ),
                "handover_s": round(hand, 3),
                "handover_vs_ttl": round(hand / ttl, 2),
                "rows_per_session": round(live_rows / stored, 2),
                "rows_per_session_with_wakes": round(
                    (live_rows + rows["wakes"] + rows["idempotency_keys"]) / stored, 2
                ),
                "control_bytes_per_session": round(table_bytes / stored),
                "object_bytes_per_session": round(obj_bytes / stored),
                "sessions": stored,
                "load_start": load_start,
                "load_end": load_end,
                "quick": args.quick,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())

"""Durable calls per second as concurrent sessions are added in one process.

N sessions (asyncio tasks, N in ``--sessions``, default 1, 4, 16, 64) run at once in one
process on one store handle, each one turn of K tool calls through the whole Agent path
(scripted model, a no-op async tool: step start, model output, T1, the tool, T2). The
store is a state directory (``--store sqlite``: ``SqliteLogStore``) or a local-directory
object store (``--store file``: ``Storage.from_url("file://DIR")``, every segment put
fsynced with its directory).

For each N: durable calls/s over the steady part of the run (from the first model request
of any session to the last one, so the writer leases taken before and the heads recorded
after the turn are left out), its ratio to N = 1 measured in the same run, p50 and p99 of
one call's latency (the time between two model requests of one session: the two commits
of a call and the step around it), and the ratio of that p99 to N = 1's. Also fsyncs per
call as seen by Python (``os.fsync`` wrapped with a counter in this process: the object
store's fsyncs of objects and directories; SQLite syncs in C and shows 0), store appends
per call, appends per SQLite group commit, the process's CPU and the event loop thread's
CPU per call (steadier than calls/s on a shared machine), the loop's CPU in the cycle collector
per call (all collections, and full ones: the heap of N sessions is N times larger, and
a full collection stalls every session at once), and the load average at the end of
each N (other work on the machine skews every figure: read the ratios, not the absolute
numbers).

    python bench/concurrent_sessions.py --store file [--quick] [--calls K] [--sessions 1,4,16]

``--collector owned`` runs every N with the cycle collector scheduled as in a process the
``lodger`` command owns (``lodger serve``, ``lodger worker``: see
``lodger._core.collector``); the default leaves CPython's schedule, as a program that
embeds the library has it.

Targets (issue 29): ``sqlite`` 64 sessions >= 6x the calls/s of one, p99 at 64 <= 3x the
p99 at 1; ``file`` 16 sessions >= 4x, p99 at 16 <= 3x. Runs in a temporary directory under
the current one (``/tmp`` may be memory). The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lodger import Agent, FunctionModel, tool
from lodger.engine.settings import Limits
from lodger.events import ProposedCall
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.storage.artifacts import MemoryArtifactStore

PAYLOAD = "x" * 180
ARGS = json.dumps({"data": PAYLOAD})


@tool
async def noop(data: str) -> str:
    """Do nothing."""
    return PAYLOAD


class CollectorClock:
    """CPU seconds this thread (the event loop's) spent in the cycle collector, and how
    many of them in full collections (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if phase == "start":
            self._started = time.thread_time()
            return
        spent = time.thread_time() - self._started
        self.seconds += spent
        if info["generation"] == 2:
            self.full += spent

    def __enter__(self) -> CollectorClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


class FsyncCounter:
    """``os.fsync`` of this process, counted (the object store syncs through it)."""

    def __init__(self) -> None:
        self.count = 0
        self._plain: Callable[[int], None] = os.fsync

    def __enter__(self) -> FsyncCounter:
        plain = self._plain

        def counted(fd: int) -> None:
            self.count += 1  # the GIL makes this exact enough across I/O threads
            plain(fd)

        os.fsync = counted
        return self

    def __exit__(self, *exc: object) -> None:
        os.fsync = self._plain


def _model(n: int, stamps: list[float]) -> FunctionModel:
    """``n`` steps that each call ``noop``, then an answer; ``stamps`` gets the time of
    every model request."""
    left = [n]

    def step(request: ModelRequest) -> ModelResponse:
        stamps.append(time.perf_counter())
        if left[0] == 0:
            return ModelResponse(text="done")
        left[0] -= 1
        return ModelResponse(calls=(ProposedCall(call_id="", name="noop", arguments=ARGS),))

    return FunctionModel(step)


def _storage(kind: str, directory: Path) -> Storage:
    if kind == "sqlite":
        return Storage(log=EventLog(SqliteLogStore(directory)), artifacts=MemoryArtifactStore())
    if kind == "file":
        return Storage.from_url(f"file://{directory.resolve()}")
    raise SystemExit(f"unknown --store {kind!r} (sqlite or file)")


def _count_appends(storage: Storage) -> list[int]:
    """Wrap the store's ``append_records`` with a counter (the store's own commits)."""
    store: Any = storage.log.store
    counter = [0]
    plain = store.append_records

    async def counted(**kwargs: Any) -> None:
        counter[0] += 1
        await plain(**kwargs)

    store.append_records = counted
    return counter


async def run_sessions(kind: str, directory: Path, sessions: int, calls: int) -> dict[str, Any]:
    storage = _storage(kind, directory)
    appends = _count_appends(storage)
    all_stamps: list[list[float]] = [[] for _ in range(sessions)]

    async def one(index: int) -> None:
        agent = Agent(
            model=_model(calls, all_stamps[index]),
            tools=[noop],
            storage=storage,
            limits=Limits(max_steps=calls + 1),
        )
        result = await agent.run("benchmark", session=f"s{index:03d}")
        assert result.status == "completed", result

    with FsyncCounter() as fsyncs, CollectorClock() as collector:
        cpu_started, loop_started = time.process_time(), time.thread_time()
        async with asyncio.TaskGroup() as group:
            for index in range(sessions):
                group.create_task(one(index))
        cpu, loop_cpu = time.process_time() - cpu_started, time.thread_time() - loop_started
    groups = getattr(storage.log.store, "group_stats", None)  # SQLite's group commit
    await storage.close()
    sync = getattr(storage.log.store, "local_sync", None)  # the object store's groups
    first = min(s[0] for s in all_stamps)
    last = max(s[-1] for s in all_stamps)
    latencies = [b - a for s in all_stamps for a, b in itertools.pairwise(s)]
    total = sessions * calls
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "sessions": sessions,
        "calls": total,
        "calls_per_s": len(latencies) / (last - first),
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": quantiles[98] * 1e3,
        "fsyncs_per_call": fsyncs.count / total,
        "appends_per_call": appends[0] / total,
        "puts_per_sync": sync.synced / sync.groups if sync is not None and sync.groups else 0.0,
        "appends_per_group": groups.appends / groups.groups if groups and groups.groups else 0.0,
        "cpu_us_per_call": cpu / total * 1e6,
        "loop_cpu_us_per_call": loop_cpu / total * 1e6,
        "gc_cpu_us_per_call": collector.seconds / total * 1e6,
        "gc_full_cpu_us_per_call": collector.full / total * 1e6,
        "loadavg_1m": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "file"), default="file")
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--calls", type=int, default=None, help="tool calls per session")
    parser.add_argument("--sessions", default="1,4,16,64", help="comma-separated N")
    parser.add_argument("--rounds", type=int, default=None, help="runs per N (median)")
    parser.add_argument(
        "--collector",
        choices=("library", "owned"),
        default="library",
        help="the cycle collector's schedule: as embedded (default) or as lodger's processes",
    )
    args = parser.parse_args()
    if args.collector == "owned":
        from lodger._core.collector import tune_owned_process

        tune_owned_process()
    counts = [int(n) for n in args.sessions.split(",")]
    calls = args.calls or (40 if args.quick else 200)
    rounds = args.rounds or (1 if args.quick else 3)
    base = Path(tempfile.mkdtemp(prefix="lodger-bench-", dir=Path.cwd()))
    rows: list[dict[str, Any]] = []
    try:
        for n in counts:
            runs = []
            for r in range(rounds):
                directory = base / f"n{n}-r{r}"
                directory.mkdir()
                runs.append(asyncio.run(run_sessions(args.store, directory, n, calls)))
                shutil.rmtree(directory, ignore_errors=True)
            runs.sort(key=lambda row: row["calls_per_s"])
            rows.append(runs[len(runs) // 2])  # the median run by throughput
    finally:
        shutil.rmtree(base, ignore_errors=True)
    one = next((row for row in rows if row["sessions"] == 1), rows[0])
    print(
        f"store {args.store}, {calls} calls per session, median of {rounds} run(s) per N, "
        f"collector as {args.collector} (young threshold {gc.get_threshold()[0]})"
    )
    print(
        f"{'N':>4} {'calls/s':>9} {'x N=1':>7} {'p50 ms':>8} {'p99 ms':>8} {'p99 x':>6} "
        f"{'fsync/call':>10} {'appends/call':>12} {'puts/sync':>9} {'group':>5} "
        f"{'cpu us':>7} {'loop us':>7} {'gc us':>6} {'full':>5} {'load':>5}"
    )
    for row in rows:
        row["ratio_calls_per_s"] = row["calls_per_s"] / one["calls_per_s"]
        row["ratio_p99"] = row["p99_ms"] / one["p99_ms"]
        print(
            f"{row['sessions']:>4} {row['calls_per_s']:9.1f} {row['ratio_calls_per_s']:7.2f} "
            f"{row['p50_ms']:8.2f} {row['p99_ms']:8.2f} {row['ratio_p99']:6.2f} "
            f"{row['fsyncs_per_call']:10.2f} {row['appends_per_call']:12.2f} "
            f"{row['puts_per_sync']:9.2f} {row['appends_per_group']:5.1f} "
            f"{row['cpu_us_per_call']:7.1f} {row['loop_cpu_us_per_call']:7.1f} "
            f"{row['gc_cpu_us_per_call']:6.1f} {row['gc_full_cpu_us_per_call']:5.1f} "
            f"{row['loadavg_1m']:5.2f}"
        )
    target = {"sqlite": (64, 6.0), "file": (16, 4.0)}[args.store]
    print(
        json.dumps(
            {
                "bench": "concurrent_sessions",
                "store": args.store,
                "collector": args.collector,
                "young_threshold": gc.get_threshold()[0],
                "calls_per_session": calls,
                "rounds": rounds,
                "rows": [
                    {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
                    for row in rows
                ],
                "target_sessions": target[0],
                "target_ratio": target[1],
                "target_p99_ratio": 3.0,
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()

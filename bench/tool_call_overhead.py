"""Per-call cost of lodger's whole durable tool path against the two commits it needs.

One step per call (step start + model output + T1 + a no-op tool + T2), ~200-byte
arguments and result, through the scripted model, the context projection, validation,
permission, T1, execution and T2. Baselines measured in the same process and run:

- two bare SQLite WAL commits (``synchronous=FULL``) of ~200 bytes: the floor of the
  two-commit contract on this disk;
- lean Python: the same two commits from asyncio through one I/O thread, nothing else;
- two bare ``write + fsync`` of 1 KiB (the older baseline).

Also: the in-memory store (CPU only), the same with a tool whose parameters nest (a list
of models and a dict, ~200 bytes of arguments: the schema walk and T1's copy of nested
arguments), and whether the per-call cost stays flat with history (after ``--history``
prior calls in the same session).

Three rows take the store out and keep the thread, to show what handing each commit to
a thread and back costs by itself on this machine: the lean reference with each commit a
no-op on its I/O thread; the in-memory store behind the same no-op hop per append; and the
in-memory store behind a hop whose job writes and fsyncs 1 KiB (an append's device sync
without SQLite). Set against the in-memory row and the bare fsyncs, they show what the
handoff adds: its system calls and wake-ups, and the loop's Python running slower after
every wake, once the threads have slept through a device sync.

    python bench/tool_call_overhead.py [--quick] [--calls N] [--history N]

Targets (issue 29): lodger <= 1.5x lean (``ratio_vs_lean``); in-memory <= 0.10 ms per
call; flat within 10% from 100 to 10,000 prior calls (``flatness_ratio`` in wall time,
``flatness_cpu_ratio`` in the loop thread's CPU, which a busy disk does not skew; issue
9's: <= 1.3x two WAL commits, ``target_ratio``). The last line is JSON.

``--breakdown`` also times where one SQLite call's wall time goes, per commit: the wait
for the I/O thread to wake and take the job, the store's own work on that thread, the
wait for the event loop to wake with the answer, the journal's await chain back to the
caller, and the event loop's own work between the commits (the tool, the model, sealing,
folding). The same hops are timed for the lean reference.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from lodger import Agent, FunctionModel, tool
from lodger.engine.settings import Limits
from lodger.events import ProposedCall
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.storage import (
    EventLog,
    MemoryLogStore,
    SqliteLogStore,
    Storage,
    _group_commit,
    _worker,
)
from lodger.storage._group_commit import AppendQueue
from lodger.storage._worker import IoThread
from lodger.storage.artifacts import MemoryArtifactStore

PAYLOAD = "x" * 180


@tool
async def noop(data: str) -> str:
    """Do nothing."""
    return PAYLOAD


class Point(BaseModel):
    x: int
    labels: list[str] = []


@tool(name="noop")
async def nested_noop(points: list[Point], style: dict[str, int]) -> str:
    """Do nothing with nested parameters."""
    return PAYLOAD


@tool(name="noop")
def sync_noop(data: str) -> str:
    """Do nothing (a sync tool: lodger runs it on a worker thread)."""
    return PAYLOAD


def bare_fsync_pairs(directory: Path, n: int) -> float:
    payload = b"x" * 1024
    fd = os.open(directory / "baseline.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(n):
            for _ in range(2):
                os.write(fd, payload)
                os.fsync(fd)
        return time.perf_counter() - start
    finally:
        os.close(fd)


def _wal(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS e (k INTEGER PRIMARY KEY, data BLOB)")
    return conn


def bare_wal_pairs(directory: Path, n: int) -> float:
    conn = _wal(directory / "bare.sqlite3")
    blob = PAYLOAD.encode() + b"y" * 20
    start = time.perf_counter()
    for i in range(n):
        for j in range(2):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO e VALUES (?, ?)", (2 * i + j, blob))
            conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


async def lean_pairs(directory: Path, n: int, *, store: bool = True) -> float:
    """The lean reference; without ``store`` each commit is a no-op on the I/O thread."""
    io = IoThread("lean")
    conn = await io.run(lambda: _wal(directory / "lean.sqlite3"))
    blob = PAYLOAD.encode() + b"y" * 20

    def commit(k: int) -> None:
        if not store:
            return
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO e VALUES (?, ?)", (k, blob))
        conn.execute("COMMIT")

    start = time.perf_counter()
    for i in range(n):
        await io.run(lambda i=i: commit(2 * i))
        await asyncio.sleep(0)  # the "tool"
        await io.run(lambda i=i: commit(2 * i + 1))
    elapsed = time.perf_counter() - start
    await io.run(conn.close)
    await io.close()
    return elapsed


ARGS = json.dumps({"data": PAYLOAD})
NESTED_ARGS = json.dumps(
    {
        "points": [{"x": i, "labels": ["label", "other"]} for i in range(4)],
        "style": {"width": 2, "height": 3, "depth": 4},
    }
)


def _model(
    n: int,
    stamps: list[float] | None = None,
    cpu: list[float] | None = None,
    *,
    arguments: str = ARGS,
) -> FunctionModel:
    """``n`` steps that each call ``noop`` with ``arguments``, then an answer (a
    counter, not the history); ``stamps`` collects the time of every request, ``cpu``
    the loop thread's CPU time at each."""
    left = [n]

    def step(request: ModelRequest) -> ModelResponse:
        if stamps is not None:
            stamps.append(time.perf_counter())
        if cpu is not None:
            cpu.append(time.thread_time())
        if left[0] == 0:
            return ModelResponse(text="done")
        left[0] -= 1
        return ModelResponse(calls=(ProposedCall(call_id="", name="noop", arguments=arguments),))

    return FunctionModel(step)


async def flatness(directory: Path, total: int, window: int) -> tuple[float, float, float, float]:
    """Per-call time over calls [100, 100 + window) and over the last ``window`` calls of
    one turn of ``total`` calls: does a call cost more when the session is long? Wall
    time, then the loop thread's CPU time over the same calls (the disk's waits are not
    in it: the steadier figure on a shared machine)."""
    stamps: list[float] = []
    cpu: list[float] = []
    log = EventLog(SqliteLogStore(directory))
    agent = Agent(
        model=_model(total, stamps, cpu),
        tools=[noop],
        storage=Storage(log=log, artifacts=MemoryArtifactStore()),
        limits=Limits(max_steps=total + 1),
    )
    result = await agent.run("long turn")
    await log.close()
    assert result.status == "completed", result
    early = (stamps[100 + window] - stamps[100]) / window
    late = (stamps[total] - stamps[total - window]) / window
    early_cpu = (cpu[100 + window] - cpu[100]) / window
    late_cpu = (cpu[total] - cpu[total - window]) / window
    return early * 1e6, late * 1e6, early_cpu * 1e6, late_cpu * 1e6


class HoppingMemoryStore(MemoryLogStore):
    """The in-memory store, but every append first makes a round trip through an I/O
    thread, as the SQLite store's appends do: a no-op, or (``sync_file``) writing 1 KiB to
    that file and fsyncing it, without SQLite's own work."""

    def __init__(self, sync_file: Path | None = None) -> None:
        super().__init__()
        self._io = IoThread("hop")
        self._fd = None if sync_file is None else os.open(sync_file, os.O_RDWR | os.O_CREAT)

    def _job(self) -> None:
        if self._fd is not None:
            os.pwrite(self._fd, b"x" * 1024, 0)
            os.fsync(self._fd)

    async def append_records(self, **kwargs):  # type: ignore[no-untyped-def]
        await self._io.run(self._job)
        await super().append_records(**kwargs)

    async def close(self) -> None:
        await self._io.close()
        if self._fd is not None:
            os.close(self._fd)
        await super().close()


async def lodger_calls(
    directory: Path | None,
    n: int,
    *,
    sync_tool: bool = False,
    history: int = 0,
    cpu: list[float] | None = None,
    hop: bool = False,
    sync_file: Path | None = None,
    nested: bool = False,
) -> float:
    """Seconds for ``n`` calls, after ``history`` earlier calls in the same session;
    ``cpu`` gets the CPU seconds the event loop's thread spent on them (``thread_time``:
    the loop's own work, not the I/O thread's, and robust to other load on the machine).
    Without ``directory`` the store is in memory; ``hop``: behind a thread hop per append
    (which fsyncs ``sync_file``, when given); ``nested``: the tool with nested parameters."""
    memory = HoppingMemoryStore(sync_file) if hop else MemoryLogStore()
    log = EventLog(memory if directory is None else SqliteLogStore(directory))
    tools = [nested_noop if nested else sync_noop if sync_tool else noop]
    if history:
        warm = Agent(
            model=_model(history),
            tools=tools,
            storage=Storage(log=log, artifacts=MemoryArtifactStore()),
            limits=Limits(max_steps=history + 1),
        )
        assert (await warm.run("history", session="bench")).status == "completed"
    agent = Agent(
        model=_model(n, arguments=NESTED_ARGS if nested else ARGS),
        tools=tools,
        storage=Storage(log=log, artifacts=MemoryArtifactStore()),
        limits=Limits(max_steps=n + 1),
    )
    start, start_cpu = time.perf_counter(), time.thread_time()
    result = await agent.run("benchmark", session="bench" if history else None)
    elapsed = time.perf_counter() - start
    if cpu is not None:
        cpu.append(time.thread_time() - start_cpu)
    await log.close()
    assert result.status == "completed", result
    return elapsed


@contextlib.contextmanager
def _timed_io_thread(rows: list[list[float]]):  # type: ignore[no-untyped-def]
    """Record ``[submitted, started, finished, answered, resumed]`` per I/O-thread job."""
    clock = time.perf_counter
    plain_main, plain_run = IoThread._main, IoThread.run

    def timed_main(self: IoThread) -> None:
        while (job := self._queue.get()) is not None:
            loop, future, fn = job
            if loop is None or future is None:  # a group commit's drain: timed below
                fn()
                continue
            started = clock()
            result: object = None
            error: BaseException | None = None
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                error = exc
            row = [started, clock()]
            rows.append(row)

            def answer(f=future, r=result, e=error, row=row) -> None:  # type: ignore[no-untyped-def]
                row.append(clock())
                _worker._resolve(f, r, e)

            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(answer)

    async def timed_run(self: IoThread, fn):  # type: ignore[no-untyped-def]
        submitted = clock()
        count = len(rows)
        result = await plain_run(self, fn)
        if len(rows) > count:
            rows[count][:0] = [submitted]
            rows[count].append(clock())
        return result

    IoThread._main, IoThread.run = timed_main, timed_run  # type: ignore[method-assign]
    try:
        with _timed_group_commits(rows):
            yield
    finally:
        IoThread._main, IoThread.run = plain_main, plain_run  # type: ignore[method-assign]


@contextlib.contextmanager
def _timed_group_commits(rows: list[list[float]]):  # type: ignore[no-untyped-def]
    """The same five times for each append through a store's group commit (the SQLite
    store's appends are posted to its I/O thread, which answers them itself)."""
    clock = time.perf_counter
    plain_init, plain_append = AppendQueue.__init__, AppendQueue.append
    plain_answer = _group_commit._answer_all
    waiting: list[list[float]] = []  # appends submitted and not resumed yet, in order

    def timed_init(self: AppendQueue, io: IoThread, commit):  # type: ignore[no-untyped-def]
        def timed_commit(group):  # type: ignore[no-untyped-def]
            started = clock()
            fresh = [row for row in waiting if len(row) == 1]
            commit(group)
            finished = clock()
            for row in fresh:
                row += [started, finished]

        plain_init(self, io, timed_commit)

    def timed_answer(entries):  # type: ignore[no-untyped-def]
        answered = clock()
        for row in waiting:
            if len(row) == 3:
                row.append(answered)
        plain_answer(entries)

    async def timed_append(self: AppendQueue, *args):  # type: ignore[no-untyped-def]
        row = [clock()]
        waiting.append(row)
        try:
            await plain_append(self, *args)
        finally:
            waiting.remove(row)
            if len(row) == 4:
                rows.append([*row, clock()])

    AppendQueue.__init__, AppendQueue.append = timed_init, timed_append  # type: ignore[method-assign]
    _group_commit._answer_all = timed_answer
    try:
        yield
    finally:
        AppendQueue.__init__, AppendQueue.append = plain_init, plain_append  # type: ignore[method-assign]
        _group_commit._answer_all = plain_answer


def _segments(rows: list[list[float]]) -> dict[str, float]:
    done = [r for r in rows if len(r) == 5]
    med = {
        name: statistics.median((r[j] - r[i]) * 1e6 for r in done)
        for name, (i, j) in {
            "thread_wake": (0, 1),
            "store_work": (1, 2),
            "loop_wake": (2, 3),
            "await_chain": (3, 4),
        }.items()
    }
    gaps = [(done[k + 1][0] - done[k][4]) * 1e6 for k in range(len(done) - 1)]
    med["loop_between"] = statistics.median(gaps) if gaps else 0.0
    return med


def breakdown(directory: Path, n: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, run in (
        ("lean", lambda: lean_pairs(directory / "lean", n)),
        ("lodger", lambda: lodger_calls(directory / "lodger", n)),
    ):
        (directory / name).mkdir()
        rows: list[list[float]] = []
        with _timed_io_thread(rows):
            asyncio.run(run())
        seg = _segments(rows)
        commits = len([r for r in rows if len(r) == 5]) / n
        # the loop's own time per call: the time between one commit's answer and the
        # next commit's submission, summed over the commits of a call
        seg["commits_per_call"] = commits
        seg["loop_per_call"] = (
            statistics.mean(
                (rows[k + 1][0] - rows[k][4]) * 1e6
                for k in range(len(rows) - 1)
                if len(rows[k]) == 5
            )
            * commits
        )
        out[name] = seg
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--calls", type=int, default=None, help="calls per round")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--history", type=int, default=None, help="prior calls for flatness")
    parser.add_argument(
        "--breakdown", action="store_true", help="time the parts of one call's wall time"
    )
    args = parser.parse_args()
    n = args.calls or (100 if args.quick else 500)
    rounds = args.rounds or (3 if args.quick else 5)
    history = args.history if args.history is not None else (1000 if args.quick else 10_000)

    base = Path(tempfile.mkdtemp(prefix="lodger-bench-", dir=Path.cwd()))
    try:
        rows: dict[str, list[float]] = {
            k: []
            for k in (
                "fsync",
                "wal",
                "lean",
                "lodger",
                "lodger_sync",
                "memory",
                "memory_nested",
                "lodger_cpu",
                "memory_cpu",
                "lean_hops",
                "memory_hop",
                "memory_hop_cpu",
                "memory_sync_hop",
            )
        }
        lodger_cpu, memory_cpu = rows["lodger_cpu"], rows["memory_cpu"]
        for r in range(rounds):
            d = base / f"r{r}"
            d.mkdir()
            rows["fsync"].append(bare_fsync_pairs(d, n) / n)
            rows["wal"].append(bare_wal_pairs(d, n) / n)
            rows["lean"].append(asyncio.run(lean_pairs(d, n)) / n)
            rows["lodger"].append(asyncio.run(lodger_calls(d / "a", n, cpu=lodger_cpu)) / n)
            rows["lodger_sync"].append(asyncio.run(lodger_calls(d / "s", n, sync_tool=True)) / n)
            rows["memory"].append(asyncio.run(lodger_calls(None, n, cpu=memory_cpu)) / n)
            rows["memory_nested"].append(asyncio.run(lodger_calls(None, n, nested=True)) / n)
            rows["lean_hops"].append(asyncio.run(lean_pairs(d, n, store=False)) / n)
            rows["memory_hop"].append(
                asyncio.run(lodger_calls(None, n, cpu=rows["memory_hop_cpu"], hop=True)) / n
            )
            synced = asyncio.run(lodger_calls(None, n, hop=True, sync_file=d / "hop.bin"))
            rows["memory_sync_hop"].append(synced / n)
        for key in ("lodger_cpu", "memory_cpu", "memory_hop_cpu"):
            rows[key][:] = [t / n for t in rows[key]]
        us = {k: statistics.median(v) * 1e6 for k, v in rows.items()}
        early, late, early_cpu, late_cpu = asyncio.run(
            flatness(base / "flat", history, min(500, history // 4))
        )
        wal = us["wal"]
        print(f"calls per round              {n} x {rounds} rounds (medians)")
        print(f"two bare SQLite WAL commits  {wal:9.1f} us per call   1.00x")
        for key, label in (("lean", "lean asyncio + I/O thread"), ("lodger", "lodger tool call")):
            print(f"{label:<28} {us[key]:9.1f} us per call   {us[key] / wal:.2f}x")
        print(
            f"lodger, sync tool            {us['lodger_sync']:9.1f} us per call   "
            f"{us['lodger_sync'] / wal:.2f}x"
        )
        print(f"lodger, in-memory store      {us['memory']:9.1f} us per call   (target <= 100)")
        print(f"  ... nested-parameter tool  {us['memory_nested']:9.1f} us per call")
        print(
            f"CPU of the loop's thread     {us['memory_cpu']:9.1f} us per call in memory, "
            f"{us['lodger_cpu']:.1f} with SQLite (thread_time)"
        )
        print(f"two bare fsyncs (1 KiB)      {us['fsync']:9.1f} us per call")
        hop_cost = us["memory_hop"] - us["memory"]
        wake = us["memory_sync_hop"] - us["memory"] - us["fsync"]
        print("the thread handoff without SQLite (per call: two appends, two hops):")
        print(f"  lean, no-op commits        {us['lean_hops']:9.1f} us per call")
        print(
            f"  lodger in memory + hop     {us['memory_hop']:9.1f} us per call "
            f"(+{hop_cost:.1f} over in memory; loop CPU {us['memory_hop_cpu']:.1f} us "
            f"against {us['memory_cpu']:.1f})"
        )
        print(
            f"  ... + an fsync per hop     {us['memory_sync_hop']:9.1f} us per call "
            f"(in memory + two bare fsyncs + {wake:.1f})"
        )
        print(
            f"lean's own margin: {us['lean'] / wal:.2f}x two WAL commits; issue 9's 1.3x of "
            f"them leaves lodger {(1.3 * wal - us['lean']):.1f} us per call above lean "
            f"(issue 29's target is <= 1.5x lean)"
        )
        print(
            f"calls 100+ / {history}- of one turn  {early:.1f} / {late:.1f} us per call "
            f"({late / early:.2f}x, target <= 1.10)"
        )
        print(
            f"  ... loop CPU per call          {early_cpu:.1f} / {late_cpu:.1f} us "
            f"({late_cpu / early_cpu:.2f}x)"
        )
        parts: dict[str, dict[str, float]] = {}
        if args.breakdown:
            (base / "parts").mkdir()
            parts = breakdown(base / "parts", n)
            print("where the time goes (medians, us per commit; loop = per call):")
            print(f"{'':<8}{'thread wake':>12}{'store work':>12}{'loop wake':>11}"
                  f"{'await chain':>12}{'loop/call':>11}")  # fmt: skip
            for name, seg in parts.items():
                print(
                    f"{name:<8}{seg['thread_wake']:12.1f}{seg['store_work']:12.1f}"
                    f"{seg['loop_wake']:11.1f}{seg['await_chain']:12.1f}"
                    f"{seg['loop_per_call']:11.1f}"
                )
        print(
            json.dumps(
                {
                    "bench": "tool_call_overhead",
                    "calls": n,
                    "rounds": rounds,
                    "two_wal_commits_us": round(wal, 1),
                    "lean_us": round(us["lean"], 1),
                    "lodger_call_us": round(us["lodger"], 1),
                    "lodger_sync_tool_call_us": round(us["lodger_sync"], 1),
                    "lodger_memory_call_us": round(us["memory"], 1),
                    "lodger_memory_nested_call_us": round(us["memory_nested"], 1),
                    "loop_cpu_memory_us": round(us["memory_cpu"], 1),
                    "loop_cpu_sqlite_us": round(us["lodger_cpu"], 1),
                    "two_bare_fsyncs_us": round(us["fsync"], 1),
                    "lean_no_store_us": round(us["lean_hops"], 1),
                    "lodger_memory_hop_call_us": round(us["memory_hop"], 1),
                    "loop_cpu_memory_hop_us": round(us["memory_hop_cpu"], 1),
                    "lodger_memory_fsync_hop_call_us": round(us["memory_sync_hop"], 1),
                    "handoff_wake_us": round(wake, 1),
                    "ratio_lean_vs_two_wal_commits": round(us["lean"] / wal, 3),
                    "ratio_vs_two_wal_commits": round(us["lodger"] / wal, 3),
                    "ratio_vs_lean": round(us["lodger"] / us["lean"], 3),
                    "history": history,
                    "per_call_after_100_us": round(early, 1),
                    "per_call_after_history_us": round(late, 1),
                    "flatness_ratio": round(late / early, 3),
                    "loop_cpu_after_100_us": round(early_cpu, 1),
                    "loop_cpu_after_history_us": round(late_cpu, 1),
                    "flatness_cpu_ratio": round(late_cpu / early_cpu, 3),
                    "target_ratio": 1.3,
                    "breakdown_us": {
                        k: {m: round(v, 1) for m, v in seg.items()} for k, seg in parts.items()
                    },
                    "python": sys.version.split()[0],
                }
            )
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

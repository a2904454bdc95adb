"""Approvals that park (``lodger worker --approval-park``) against approvals that wait
(``--approval-wait``), on a PostgreSQL control plane and a local-directory object store,
with real worker processes (``--poll 0.05``).

Measured in one run, on this machine (shared and loaded: read ratios, not absolutes):

- answer to run: from ``answer_approval`` returning to the approved tool's first line
  (its wall-clock stamp, same machine), p50/p99 over N sessions one after another, each
  answered at a random moment 0-0.5 s after its question appeared. A parked session
  must be woken (the worker's queue poll, lease, snapshot restore, resume, ask again); a
  waiting worker only polls the question (every 0.25 s). Baseline: the waiting mode;
- what a person's slowness costs: with ONE worker slot and N sessions asking at once,
  how many questions are pending together and how many session leases are held while
  they wait (parking: N questions, no lease; waiting: one question, one lease, the other
  sessions queued behind it);
- what parking costs the log and the control plane: events a turn with one approved
  call has in each mode, and the control-plane rows a parked session adds (its question,
  its wake and the wake's idempotency key).

    python bench/approval_park.py [--quick]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lodger.storage import Storage
from lodger.storage.control.postgres import PostgresControlPlane
from lodger.testing.postgres import PostgresServer

SRC = Path(__file__).resolve().parents[1] / "src"
LODGER = [sys.executable, "-c", "import sys; from lodger.cli import main; main()"]
TOOLS = '''
import os, time
from pathlib import Path
from lodger import tool
from lodger.tools.spec import ToolContext

@tool(approval=True)
async def ship(target: str, ctx: ToolContext) -> str:
    """Ship (needs approval); stamps when it ran."""
    (Path(os.environ["BENCH_DIR"]) / f"ran-{ctx.session_id}").write_text(repr(time.time()))
    return f"shipped {target}"
'''
SCRIPT = [{"calls": [{"name": "ship", "args": {"target": "prod"}}]}, {"text": "done"}]


class Bench:
    def __init__(self, root: Path, dsn: str) -> None:
        self.root, self.dsn = root, dsn
        self.store = f"file://{root / 'objects'}"
        (root / "script.json").write_text(json.dumps(SCRIPT))
        (root / "tools.py").write_text(TOOLS)
        self.procs: list[subprocess.Popen[bytes]] = []

    def worker(self, *mode: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [*LODGER, "worker", "--store", self.store, "--control", self.dsn,
             "--model", f"script:{self.root / 'script.json'}",
             "--tools", str(self.root / "tools.py"), "--poll", "0.05", "--lease-ttl", "5",
             "--workdir", str(self.root), *mode],
            env={**os.environ, "PYTHONPATH": str(SRC), "BENCH_DIR": str(self.root)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        self.procs.clear()


async def _until(what: str, check: Any) -> None:
    deadline = time.monotonic() + 120.0
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def _held_leases(control: PostgresControlPlane) -> int:
    async with control._tx() as tx:
        rows = await tx.rows("SELECT count(*) FROM session_leases WHERE expires_at > %s", (tx.now,))
        return int(rows[0][0])


async def _status(control: PostgresControlPlane, sid: str) -> str | None:
    row = await control.get_session(session_id=sid)
    return row.status if row else None


async def answer_to_run(
    bench: Bench, control: PostgresControlPlane, mode: str, n: int
) -> tuple[list[float], int]:
    """Latencies (s) from the answer to the tool's run; events of one such turn."""
    latencies: list[float] = []
    events = 0
    rng = random.Random(7)
    for i in range(n):
        sid = f"{mode}-{i}"
        await control.send(session_id=sid, message="ship it")

        async def asked(sid: str = sid) -> bool:
            if not await control.list_approvals(session_id=sid):
                return False
            # parking: the question is recorded once the run ended; wait for dormancy
            return mode == "wait" or await _status(control, sid) == "waiting"

        await _until("the question", asked)
        (pending,) = await control.list_approvals(session_id=sid)
        # a person answers at a random moment, not in step with a worker's poll
        await asyncio.sleep(rng.uniform(0.0, 0.5))
        start = time.time()
        await control.answer_approval(session_id=sid, call_id=pending.call_id, allow=True, by="b")
        ran = bench.root / f"ran-{sid}"

        async def has_run(ran: Path = ran) -> bool:
            return await asyncio.to_thread(lambda: ran.exists() and ran.read_text() != "")

        await _until("the approved call", has_run)
        latencies.append(float(ran.read_text()) - start)

        async def completed(sid: str = sid) -> bool:
            return await _status(control, sid) == "completed"

        await _until("the turn", completed)
        storage = Storage.from_url(bench.store)
        try:
            events = len(await storage.log.read_all(sid))
        finally:
            await storage.close()
    return latencies, events


async def one_slot(
    bench: Bench, control: PostgresControlPlane, mode: str, n: int, settle_s: float
) -> tuple[int, int]:
    """N sessions ask at once with one worker slot: (questions pending, leases held)."""
    for i in range(n):
        await control.send(session_id=f"slot-{mode}-{i}", message="ship it")

    async def first() -> bool:
        return bool(await control.list_approvals())

    await _until("a question", first)
    if mode == "park":

        async def all_parked() -> bool:
            return len(await control.list_approvals()) == n and await _held_leases(control) == 0

        await _until("every session parked", all_parked)
    else:
        await asyncio.sleep(settle_s)  # the others stay queued behind the held slot
    return len(await control.list_approvals()), await _held_leases(control)


async def _parked_rows(control: PostgresControlPlane) -> int:
    async with control._tx() as tx:
        rows = await tx.rows(
            "SELECT (SELECT count(*) FROM approvals) + (SELECT count(*) FROM wakes WHERE "
            "message IS NULL) + (SELECT count(*) FROM idempotency_keys WHERE key LIKE "
            "'approval:%%')"
        )
        return int(rows[0][0])


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sessions")
    args = parser.parse_args()
    n = 5 if args.quick else 20
    slots = 4 if args.quick else 10
    root = Path(tempfile.mkdtemp(prefix="lodger-bench-park-"))
    server = PostgresServer()
    server.init()
    results: dict[str, Any] = {}
    try:
        for mode, flags in (("wait", ("--approval-wait", "600")), ("park", ("--approval-park",))):
            dsn = server.new_database()
            control = PostgresControlPlane(dsn)
            await control.start()
            (root / mode).mkdir()
            bench = Bench(root / mode, dsn)
            try:
                bench.worker(*flags)
                latencies, events = await answer_to_run(bench, control, mode, n)
                rows_before = await _parked_rows(control)
                pending, held = await one_slot(bench, control, mode, slots, settle_s=2.0)
                rows = (await _parked_rows(control) - rows_before) if mode == "park" else 0
            finally:
                bench.stop()
                await control.close()
            results[mode] = {
                "p50": statistics.median(latencies),
                "p99": _pct(latencies, 0.99),
                "events": events,
                "pending": pending,
                "held": held,
                "rows": rows / slots if mode == "park" else None,
            }
    finally:
        server.destroy()
        shutil.rmtree(root, ignore_errors=True)
    wait, park = results["wait"], results["park"]
    table = [
        ("", "wait (--approval-wait)", "park (--approval-park)"),
        ("answer -> call runs, p50 (ms)", f"{wait['p50'] * 1e3:.0f}", f"{park['p50'] * 1e3:.0f}"),
        ("answer -> call runs, p99 (ms)", f"{wait['p99'] * 1e3:.0f}", f"{park['p99'] * 1e3:.0f}"),
        ("events of the turn", str(wait["events"]), str(park["events"])),
        (f"questions pending, 1 slot, {slots} asks", str(wait["pending"]), str(park["pending"])),
        ("leases held while they wait", str(wait["held"]), str(park["held"])),
        ("control rows per parked session", "-", f"{park['rows']:.1f}"),
    ]
    for label, left, right in table:
        print(f"{label:36} {left:>24} {right:>24}")
    print(
        json.dumps(
            {
                "bench": "approval_park",
                "sessions": n,
                "answer_to_run_p50_ms": {"wait": wait["p50"] * 1e3, "park": park["p50"] * 1e3},
                "answer_to_run_p99_ms": {"wait": wait["p99"] * 1e3, "park": park["p99"] * 1e3},
                "answer_to_run_p50_ratio_park_vs_wait": park["p50"] / wait["p50"],
                "events_ratio_park_vs_wait": park["events"] / wait["events"],
                "pending_with_one_slot": {"wait": wait["pending"], "park": park["pending"]},
                "leases_held_while_waiting": {"wait": wait["held"], "park": park["held"]},
                "control_rows_per_parked_session": park["rows"],
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())

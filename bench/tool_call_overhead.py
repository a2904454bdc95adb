"""Per-call cost of lodger's whole tool path against two bare fsyncs, in the same run.

N sequential no-op tool calls (one per step) go through the scripted model, the context
projection, validation, permission, T1, execution and T2 on the real SQLite log. The
baseline is two ``write + fsync`` of ~1 KiB to a file in the same directory per call
(the two durable commits a call cannot do without). Target: ratio <= 3.

    python bench/tool_call_overhead.py [--quick] [--calls N]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lodger import Agent, ScriptedModel, tool
from lodger.storage import EventLog, SqliteLogStore
from lodger.storage.artifacts import MemoryArtifactStore


@tool
async def noop() -> str:
    """Do nothing."""
    return "ok"


@tool(name="noop")
def sync_noop() -> str:
    """Do nothing (a sync tool: lodger runs it on a worker thread)."""
    return "ok"


def bare_fsync_pairs(directory: Path, n: int) -> float:
    """Seconds for ``n`` pairs of (write 1 KiB + fsync)."""
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


async def lodger_calls(directory: Path, n: int, *, sync_tool: bool = False) -> float:
    script: list[dict[str, object]] = [{"calls": [{"name": "noop", "args": {}}]}] * n
    script.append({"text": "done"})
    agent = Agent(
        model=ScriptedModel(script),
        tools=[sync_noop if sync_tool else noop],
        log=EventLog(SqliteLogStore(directory / "state")),
        artifacts=MemoryArtifactStore(),
        max_steps=n + 1,
    )
    start = time.perf_counter()
    result = await agent.run("benchmark")
    elapsed = time.perf_counter() - start
    await agent.close()
    assert result.status == "completed", result
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--calls", type=int, default=None, help="calls per round")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    n = args.calls or (100 if args.quick else 400)
    rounds = args.rounds or (3 if args.quick else 5)

    base = Path(tempfile.mkdtemp(prefix="lodger-bench-", dir=Path.cwd()))
    bare, ours, ours_sync = [], [], []
    for r in range(rounds):
        round_dir = base / f"r{r}"
        round_dir.mkdir()
        bare.append(bare_fsync_pairs(round_dir, n) / n)
        ours.append(asyncio.run(lodger_calls(round_dir / "a", n)) / n)
        ours_sync.append(asyncio.run(lodger_calls(round_dir / "s", n, sync_tool=True)) / n)
    bare_us = statistics.median(bare) * 1e6
    ours_us = statistics.median(ours) * 1e6
    sync_us = statistics.median(ours_sync) * 1e6
    ratio = ours_us / bare_us
    print(f"calls per round       {n} x {rounds} rounds (medians)")
    print(f"two bare fsyncs       {bare_us:9.1f} us per call")
    print(f"lodger tool call      {ours_us:9.1f} us per call  ({1e6 / ours_us:,.0f} calls/s)")
    print(f"  with a sync tool    {sync_us:9.1f} us per call  (+ a worker-thread hop)")
    print(f"ratio                 {ratio:9.2f} x   (target <= 3.0)")
    print(
        json.dumps(
            {
                "bench": "tool_call_overhead",
                "calls": n,
                "rounds": rounds,
                "two_bare_fsyncs_us": round(bare_us, 1),
                "lodger_call_us": round(ours_us, 1),
                "calls_per_s": round(1e6 / ours_us, 1),
                "lodger_sync_tool_call_us": round(sync_us, 1),
                "ratio_sync_tool_vs_two_fsyncs": round(sync_us / bare_us, 3),
                "ratio_vs_two_fsyncs": round(ratio, 3),
                "target_ratio": 3.0,
                "python": sys.version.split()[0],
            }
        )
    )
    shutil.rmtree(base)


if __name__ == "__main__":
    main()

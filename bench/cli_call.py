"""A durable tool call through the CLI against two bare SQLite WAL commits, same run.

``lodger run`` (a subprocess, as a user runs it) plays a scripted model that calls a no-op
tool from a ``--tools`` file K times (one call per step: step start, model output, T1, the
tool, T2), then answers. The per-call cost is the difference between a run with K calls
and a run with none, divided by K, so the interpreter's start, the imports and opening
the state directory drop out. Output goes to a pipe, as a script would read it.

Baseline measured in the same run, interleaved with the CLI runs: two bare SQLite WAL
commits (``synchronous=FULL``) of ~200 bytes each, the floor of the two-commit contract
on this disk, in this process. Issue 29's target: a CLI call <= 2.5x that floor.

Everything lives in a temporary directory under the current directory (not /tmp, which
may be a tmpfs where fsync costs nothing). The last line of output is one JSON object.

    python bench/cli_call.py [--quick] [--calls K] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 2.5
TOOLS = '''import lodger


@lodger.tool
def noop(text: str) -> str:
    """Return the text."""
    return text
'''


def script(calls: int) -> list[dict[str, object]]:
    step = {"calls": [{"name": "noop", "args": {"text": "x" * 150}}]}
    return [step] * calls + [{"text": "done"}]


def children_cpu() -> float:
    """CPU seconds (user + system) of every child process that ended so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


CPU: dict[str, list[float]] = {}  # run name -> CPU seconds of each of its runs


def cli_run(root: Path, name: str, calls: int, src: str | None = None) -> float:
    """Seconds for one ``lodger run`` of ``calls`` calls in a fresh state directory (of
    the lodger in ``src`` when given, else the one installed); its CPU seconds go to
    ``CPU[name]`` (the disk's waits are not in them: a steadier figure on a shared disk)."""
    work = root / name
    shutil.rmtree(work, ignore_errors=True)
    (work / "ws").mkdir(parents=True)
    (work / "script.json").write_text(json.dumps(script(calls)))
    command = [
        sys.executable,
        "-m",
        "lodger",
        "run",
        "go",
        "--model",
        f"script:{work / 'script.json'}",
        "--tools",
        str(root / "tools.py"),
        "--workspace",
        str(work / "ws"),
        "--state",
        str(work / "state"),
        "--max-steps",
        str(calls + 1),
    ]
    env = dict(os.environ, PYTHONPATH=src) if src else None
    cpu = children_cpu()
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    elapsed = time.perf_counter() - started
    CPU.setdefault(name, []).append(children_cpu() - cpu)
    if done.returncode != 0 or "turn completed" not in done.stdout:
        raise SystemExit(f"lodger run failed ({done.returncode}): {done.stdout}{done.stderr}")
    return elapsed


def bare_commits(root: Path, count: int) -> float:
    """Seconds per pair of bare WAL commits (synchronous=FULL, ~200 bytes each)."""
    path = root / "bare.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB)")
        payload = os.urandom(200)
        started = time.perf_counter()
        for _ in range(count):
            for _ in range(2):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO t (v) VALUES (?)", (payload,))
                conn.execute("COMMIT")
        return (time.perf_counter() - started) / count
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    parser.add_argument("--calls", type=int, default=400, help="calls in the long run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--before-src", help="also run the lodger in this src, interleaved")
    args = parser.parse_args()
    calls, rounds = (100, 3) if args.quick else (args.calls, args.rounds)
    root = Path(tempfile.mkdtemp(prefix="lodger-bench-cli-call-", dir="."))
    try:
        (root / "tools.py").write_text(TOOLS)
        cli_run(root, "warm", 1)  # page cache and bytecode, not measured
        empty: list[float] = []
        full: list[float] = []
        bare: list[float] = []
        before: list[float] = []
        for _ in range(rounds):
            empty.append(cli_run(root, "empty", 0))
            bare.append(bare_commits(root, calls // 2))
            full.append(cli_run(root, "full", calls))
            bare.append(bare_commits(root, calls // 2))
            if args.before_src:
                before.append(
                    cli_run(root, "before-full", calls, args.before_src)
                    - cli_run(root, "before-empty", 0, args.before_src)
                )
        per_call = [(f - e) / calls for f, e in zip(full, empty, strict=True)]
        cpu_ms = {
            prefix: statistics.median(
                (f - e) / calls * 1000
                for f, e in zip(CPU[f"{prefix}full"], CPU[f"{prefix}empty"], strict=True)
            )
            for prefix in ("", "before-")
            if f"{prefix}full" in CPU
        }
        call_ms = statistics.median(per_call) * 1000
        bare_ms = statistics.median(bare) * 1000
        load = os.getloadavg()
        print(f"lodger run, per call (median of {rounds} x {calls} calls): {call_ms:.3f} ms")
        print(f"  (a run with no call: {statistics.median(empty) * 1000:.0f} ms)")
        print(f"  CPU per call (user + system, median): {cpu_ms['']:.3f} ms")
        print(f"two bare SQLite WAL commits: {bare_ms:.3f} ms")
        ratio = call_ms / bare_ms
        print(f"ratio: {ratio:.2f}x (target <= {TARGET}x)   load average {load[0]:.2f}")
        result: dict[str, object] = {
            "bench": "cli_call",
            "calls": calls,
            "rounds": rounds,
            "cli_call_ms": round(call_ms, 4),
            "empty_run_ms": round(statistics.median(empty) * 1000, 1),
            "two_wal_commits_ms": round(bare_ms, 4),
            "ratio": round(ratio, 3),
            "target": TARGET,
            "load_average": [round(x, 2) for x in load],
            "cli_call_cpu_ms": round(cpu_ms[""], 4),
        }
        if before:
            before_ms = statistics.median(before) / calls * 1000
            print(f"before ({args.before_src}): {before_ms:.3f} ms per call")
            result["before_call_ms"] = round(before_ms, 4)
            result["before_ratio"] = round(before_ms / bare_ms, 3)
            result["before_call_cpu_ms"] = round(cpu_ms["before-"], 4)
            print(f"  before: CPU per call {cpu_ms['before-']:.3f} ms")
        print(json.dumps(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Durable append latency: lodger's SQLite log against a bare write + fsync of the same bytes.

Everything runs in one process, in one temporary directory under the current directory (not
/tmp, which may be a tmpfs where fsync costs nothing), interleaved in rounds so that drift
in the disk affects every series alike. The last line of output is one JSON object.

Example:
    .venv/bin/python bench/log_append.py --quick
    .venv/bin/python bench/log_append.py --samples 3000 --keep
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
from collections.abc import Awaitable, Callable
from pathlib import Path

from lodger.events import EventDraft, ToolResponded, seal
from lodger.storage import EventLog, SessionWriter, SqliteLogStore

SINGLE_TARGET = 1.5  # lodger single-event p50 / bare fsync p50
BATCH_TARGET = 2.0  # lodger 10-event p50 / single-event p50
BATCH = 10


def filesystem_of(path: Path) -> tuple[str, str]:
    """(fstype, mount point) of the mount holding ``path``, from /proc/self/mountinfo."""
    best = ("unknown", "")
    resolved = str(path.resolve())
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        mount_point = left.split()[4].replace("\\040", " ")
        fstype = right.split()[0]
        inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best[1]):
            best = (fstype, mount_point)
    return best


def make_draft(n: int, size: int) -> EventDraft:
    content = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
    return EventDraft(
        id=f"bench-{n:08d}",
        ts=1_700_000_000_000_000 + n,
        body=ToolResponded(operation_id=f"op-{n:08d}", status="ok", content=content),
        turn_id="turn-1",
        run_id="run-1",
        call_id=f"call-{n:08d}",
    )


def event_bytes(target: int) -> tuple[int, bytes]:
    """The content size whose sealed event is about ``target`` bytes, and those bytes."""
    overhead = len(seal(make_draft(0, 0), session_id="bench-x", offset=0, prev_digest="")[1])
    size = max(target - overhead, 0)
    _, data = seal(make_draft(0, size), session_id="bench-x", offset=0, prev_digest="")
    return size, data


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


class Series:
    def __init__(self, name: str, events_per_op: int) -> None:
        self.name = name
        self.events_per_op = events_per_op
        self.samples_us: list[float] = []

    def summary(self) -> dict[str, float]:
        total_s = sum(self.samples_us) / 1e6
        return {
            "p50_us": statistics.median(self.samples_us),
            "p99_us": percentile(self.samples_us, 99),
            "max_us": max(self.samples_us),
            "ops_per_s": len(self.samples_us) / total_s,
            "events_per_s": len(self.samples_us) * self.events_per_op / total_s,
        }


async def timed(series: Series, op: Callable[[], Awaitable[None]], count: int) -> None:
    for _ in range(count):
        t0 = time.perf_counter_ns()
        await op()
        series.samples_us.append((time.perf_counter_ns() - t0) / 1000)


async def run(args: argparse.Namespace, workdir: Path, size: int, data: bytes) -> dict[str, Series]:
    bare = Series("bare os.write + os.fsync", 1)
    single = Series("lodger append, 1 event", 1)
    batch = Series(f"lodger append, {BATCH} events", BATCH)

    fd = os.open(workdir / "bare.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    log = EventLog(SqliteLogStore(workdir / "state"))
    writers: dict[str, SessionWriter] = {
        "single": await log.open_writer("bench-single"),
        "batch": await log.open_writer("bench-batch"),
    }
    counter = 0

    async def bare_op() -> None:
        os.write(fd, data)
        os.fsync(fd)

    def drafts(count: int) -> list[EventDraft]:
        nonlocal counter
        made = [make_draft(counter + i, size) for i in range(count)]
        counter += count
        return made

    async def append(name: str, count: int) -> None:
        writer = writers[name]
        pending = drafts(count)  # building drafts is the caller's work, not the log's
        t0 = time.perf_counter_ns()
        await writer.append(pending, expected_offset=writer.head.high_water)
        (single if name == "single" else batch).samples_us.append(
            (time.perf_counter_ns() - t0) / 1000
        )

    try:
        # warm up every path (page cache, WAL creation, thread start-up, pydantic)
        for _ in range(args.warmup):
            await bare_op()
            await append("single", 1)
            await append("batch", BATCH)
        single.samples_us.clear()
        batch.samples_us.clear()
        per_round = max(1, args.samples // args.rounds)
        for _ in range(args.rounds):
            await timed(bare, bare_op, per_round)
            for _ in range(per_round):
                await append("single", 1)
            for _ in range(per_round):
                await append("batch", BATCH)
        return {"bare": bare, "single": single, "batch": batch}
    finally:
        os.close(fd)
        for writer in writers.values():
            await writer.close()
        await log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short run (200 samples)")
    parser.add_argument("--samples", type=int, default=2000, help="samples per series")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=20, help="untimed operations per series")
    parser.add_argument("--event-bytes", type=int, default=1024, help="size of one event")
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="parent of the temp dir")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir afterwards")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.rounds, args.warmup = 200, 2, 10

    workdir = Path(tempfile.mkdtemp(prefix=".bench-log-append-", dir=args.dir))
    fstype, mount_point = filesystem_of(workdir)
    try:
        size, data = event_bytes(args.event_bytes)
        series = asyncio.run(run(args, workdir, size, data))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    stats = {key: s.summary() for key, s in series.items()}
    single_ratio = stats["single"]["p50_us"] / stats["bare"]["p50_us"]
    batch_ratio = stats["batch"]["p50_us"] / stats["single"]["p50_us"]

    print(f"directory   {workdir}  ({'kept' if args.keep else 'removed'})")
    print(f"filesystem  {fstype} mounted on {mount_point}")
    if fstype in ("tmpfs", "ramfs", "overlay", "unknown"):
        print(f"warning     fsync on {fstype} may not reach a disk; the ratios mean little")
    print(f"event       {len(data)} bytes of canonical JSON; {len(series['bare'].samples_us)}")
    print(f"            samples per series in {args.rounds} interleaved rounds")
    print()
    header = (
        f"{'series':<28}{'p50 µs':>10}{'p99 µs':>10}{'max µs':>10}{'ops/s':>10}{'events/s':>10}"
    )
    print(header)
    print("-" * len(header))
    for key, s in series.items():
        st = stats[key]
        print(
            f"{s.name:<28}{st['p50_us']:>10.0f}{st['p99_us']:>10.0f}{st['max_us']:>10.0f}"
            f"{st['ops_per_s']:>10.0f}{st['events_per_s']:>10.0f}"
        )
    print()
    verdict = {True: "ok", False: "MISSED"}
    print(
        f"single p50 / bare fsync p50 = {single_ratio:.2f}  "
        f"(target <= {SINGLE_TARGET}: {verdict[single_ratio <= SINGLE_TARGET]})"
    )
    print(
        f"{BATCH}-event p50 / single p50  = {batch_ratio:.2f}  "
        f"(target < {BATCH_TARGET}: {verdict[batch_ratio < BATCH_TARGET]})"
    )

    result = {
        "filesystem": fstype,
        "mount_point": mount_point,
        "event_bytes": len(data),
        "samples_per_series": len(series["bare"].samples_us),
        "rounds": args.rounds,
        "bare_fsync_p50_us": round(stats["bare"]["p50_us"], 1),
        "bare_fsync_p99_us": round(stats["bare"]["p99_us"], 1),
        "bare_fsyncs_per_s": round(stats["bare"]["ops_per_s"], 1),
        "single_append_p50_us": round(stats["single"]["p50_us"], 1),
        "single_append_p99_us": round(stats["single"]["p99_us"], 1),
        "single_appends_per_s": round(stats["single"]["ops_per_s"], 1),
        "batch10_append_p50_us": round(stats["batch"]["p50_us"], 1),
        "batch10_append_p99_us": round(stats["batch"]["p99_us"], 1),
        "batch10_appends_per_s": round(stats["batch"]["ops_per_s"], 1),
        "batch10_events_per_s": round(stats["batch"]["events_per_s"], 1),
        "single_p50_over_bare_fsync_p50": round(single_ratio, 3),
        "single_p50_over_bare_fsync_p50_target_max": SINGLE_TARGET,
        "single_meets_target": single_ratio <= SINGLE_TARGET,
        "batch10_p50_over_single_p50": round(batch_ratio, 3),
        "batch10_p50_over_single_p50_target_below": BATCH_TARGET,
        "batch10_meets_target": batch_ratio < BATCH_TARGET,
    }
    print(json.dumps(result, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

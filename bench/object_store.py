"""Sessions on object storage: what a durable call, a wake and a fork cost.

Measured in one run, against baselines from the same run:

- puts per durable tool call on the object-store log (each call commits T1 and T2; each
  commit is one create-only segment put; the head is recorded at the writer's release),
  against the strict mode that also puts a head object after every append
  (``head_per_append``, the previous behaviour), puts per commit, and the same for a step
  of 8 parallel calls, whose concurrent T1s and T2s the journal group-commits;
- the HEAD that confirms each segment put was kept (a store that acknowledges a write
  and drops it is caught before anything names the segment): per-call latency against
  the same turns without it, file and S3;
- per-call latency through the whole Agent path on SQLite (the embedded default, the
  baseline), on a local-directory object store and on an S3-compatible server on
  loopback (moto, started by this script; its latency is a local Python server's, not
  S3's);
- wake cost of a dormant session with ``--events`` events (compacted): a fresh worker
  with an empty cache reads manifest + sealed segment + tail, restores the workspace
  snapshot; then the same worker wakes again after 10 new events (warm cache: only the
  tail is fetched). Requests and seconds, file and S3;
- bytes stored per dormant session after compaction and garbage collection, against
  the bytes of its events;
- fork time against copying the session's events into a new session;
- opening the session's fold (what a worker's resume does) on a worker that finds no
  fold checkpoint (it decodes every event), against the next worker, elsewhere with an
  empty cache, that opens it from the checkpoint the first one saved.

    python bench/object_store.py [--quick] [--events N] [--calls N]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lodger import Agent, FunctionModel, tool
from lodger.engine.checkpoint import open_fold
from lodger.engine.settings import Limits
from lodger.events import (
    EventDraft,
    ModelOutput,
    ProposedCall,
    RunEnded,
    RunStarted,
    SessionStarted,
    StepStarted,
    ToolDispatched,
    ToolRef,
    ToolResponded,
    TurnEnded,
    TurnStarted,
)
from lodger.ids import SystemClock, Uuid7Factory
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.storage.artifacts import MemoryArtifactStore
from lodger.storage.forks import fork_session
from lodger.storage.objectartifacts import ObjectArtifactStore
from lodger.storage.objectstore import ObjectLogStore, open_object_store
from lodger.storage.snapshots import restore_snapshot, snapshot_workspace

ARGS = json.dumps({"data": "x" * 150})


@tool
async def noop(data: str) -> str:
    """Return the data's length."""
    return str(len(data))


def _model(steps: int, width: int = 1) -> FunctionModel:
    left = [steps]

    def step(request: ModelRequest) -> ModelResponse:
        if left[0] == 0:
            return ModelResponse(text="done")
        left[0] -= 1
        call = ProposedCall(call_id="", name="noop", arguments=ARGS)
        return ModelResponse(calls=(call,) * width)

    return FunctionModel(step)


async def calls(log: EventLog, n: int, *, width: int = 1) -> tuple[float, int]:
    """Per-call seconds and the turn's commits for ``n`` calls, ``width`` per step."""
    agent = Agent(
        model=_model(n // width, width),
        tools=[noop],
        storage=Storage(log=log, artifacts=MemoryArtifactStore()),
        limits=Limits(max_steps=n // width + 1),
    )
    start = time.perf_counter()
    result = await agent.run("benchmark")
    elapsed = time.perf_counter() - start
    assert result.status == "completed", result
    await agent.close()
    return elapsed / n, result.commits


class _Unconfirmed(ObjectLogStore):
    """The log as it was before segment puts were confirmed (the baseline of that HEAD)."""

    async def _confirm(self, key: str, size: int) -> None:
        return None


def _drafts(first: int, count: int) -> list[EventDraft]:
    return [
        EventDraft(
            id=f"e{n:08d}",
            ts=1_700_000_000_000_000 + n,
            body=ToolResponded(operation_id=f"op{n}", status="ok", content="r" * 200),
        )
        for n in range(first, first + count)
    ]


async def _fill(log: EventLog, sid: str, events: int, batch: int) -> None:
    async with await log.open_writer(sid) as writer:
        at = 0
        while at < events:
            k = min(batch, events - at)
            await writer.append(_drafts(at, k), expected_offset=at)
            at += k


def _turn_drafts(turns: int) -> list[EventDraft]:
    """``turns`` turns of one step that calls a tool and one that answers (8 events)."""
    out: list[EventDraft] = []

    def add(body: Any, **env: str) -> None:
        out.append(EventDraft(id=f"e{len(out):08d}", ts=len(out) + 1, body=body, **env))

    tools = (ToolRef(name="noop", schema_digest="sha256-noop"),)
    add(SessionStarted(workspace="/ws"))
    for n in range(turns):
        t, r, s, c = f"t{n}", f"r{n}", f"s{n}", f"c{n}"
        add(TurnStarted(input=f"task {n}"), turn_id=t)
        add(RunStarted(model="function"), turn_id=t, run_id=r)
        add(StepStarted(index=0, model="function", tools=tools), turn_id=t, run_id=r, step_id=s)
        call = ProposedCall(call_id=c, name="noop", arguments=json.dumps({"data": "x" * 180}))
        add(ModelOutput(calls=(call,)), turn_id=t, run_id=r, step_id=s)
        dispatched = ToolDispatched(operation_id=f"op{n}", tool="noop", arguments={"data": "x"})
        add(dispatched, turn_id=t, run_id=r, step_id=s, call_id=c)
        responded = ToolResponded(operation_id=f"op{n}", status="ok", content="r" * 200)
        add(responded, turn_id=t, run_id=r, step_id=s, call_id=c)
        add(RunEnded(status="completed"), turn_id=t, run_id=r)
        add(TurnEnded(status="completed", answer="done"), turn_id=t)
    return out


async def _fill_drafts(log: EventLog, sid: str, drafts: list[EventDraft]) -> None:
    async with await log.open_writer(sid) as writer:
        for at in range(0, len(drafts), 500):
            await writer.append(drafts[at : at + 500], expected_offset=at)


def _workspace(root: Path, files: int) -> None:
    for n in range(files):
        path = root / f"d{n % 10}" / f"f{n}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(512) + f"{n}".encode())


async def wake(url: str, work: Path, events: int, batch: int) -> dict[str, float]:
    where = open_object_store(url)
    writer_store = ObjectLogStore(where.store, identity=where.identity + "#w")
    log = EventLog(writer_store)
    sid = "dormant"
    await _fill(log, sid, events, batch)
    blobs = ObjectArtifactStore(where.store)
    ws = work / f"ws-{uuid.uuid4().hex[:6]}"
    _workspace(ws, 200)
    snap = await snapshot_workspace(ws, blobs)
    await writer_store.write_manifest(sid, snapshots=((events, snap.ref),))
    await writer_store.compact(sid)
    writer_store._clock_us = lambda: time.time_ns() // 1000 + 10**12  # past the grace period
    await writer_store.collect_garbage(sid, grace_s=0)
    event_bytes = sum(
        len(r.data) for r in await writer_store.read_records(session_id=sid, start=0, end=None)
    )
    stored = await writer_store.session_bytes(sid)

    cache = work / f"cache-{uuid.uuid4().hex[:6]}"
    worker = ObjectLogStore(where.store, identity=where.identity + "#r", cache_dir=cache)
    reader = EventLog(worker)
    start = time.perf_counter()
    manifest = await worker.manifest(sid)
    assert manifest is not None
    verified = await reader.verify(sid)
    assert verified.high_water == events
    await restore_snapshot(manifest.snapshots[-1][1], blobs, work / f"restored-{uuid.uuid4().hex}")
    cold_s = time.perf_counter() - start
    cold_requests = worker.stats.gets + worker.stats.lists

    async with await log.open_writer(sid) as w:
        await w.append(_drafts(events, 10), expected_offset=events)
    before = (worker.stats.gets, worker.stats.lists, worker.stats.bytes_got)
    start = time.perf_counter()
    assert (await reader.verify(sid)).high_water == events + 10
    warm_s = time.perf_counter() - start
    warm_gets = worker.stats.gets - before[0]
    warm_bytes = worker.stats.bytes_got - before[2]

    # opening a session's fold (what a worker's resume does), on a session of turns
    # (``_turn_drafts``): a worker that finds no fold checkpoint decodes every event (and
    # saves one); the next one, elsewhere with an empty cache, decodes only what follows
    turns = _turn_drafts(events // 8)
    await _fill_drafts(log, "long", turns)
    fresh = EventLog(ObjectLogStore(where.store, identity=where.identity + "#f1"))
    start = time.perf_counter()
    full = await open_fold(fresh, "long")
    fold_full_s = time.perf_counter() - start
    again = EventLog(
        ObjectLogStore(
            where.store, identity=where.identity + "#f2", cache_dir=work / uuid.uuid4().hex
        )
    )
    start = time.perf_counter()
    cached = await open_fold(again, "long")
    fold_checkpoint_s = time.perf_counter() - start
    assert cached.events.undecoded_base == len(full.events) == len(turns)
    await fresh.close()
    await again.close()

    # fork against copying every event into a new session
    clock, ids = SystemClock(), Uuid7Factory()
    start = time.perf_counter()
    await fork_session(log, sid, fork_id="forked", clock=clock, ids=ids)
    fork_s = time.perf_counter() - start
    start = time.perf_counter()
    records = await writer_store.read_records(session_id=sid, start=0, end=None)
    copy = ObjectLogStore(where.store, identity=where.identity + "#copy")
    for i in range(0, len(records), batch):
        chunk = records[i : i + batch]
        await copy.append_records(session_id="copied", records=chunk, expected_offset=i)
    copy_s = time.perf_counter() - start
    await log.close()
    return {
        "cold_wake_s": cold_s,
        "cold_wake_requests": cold_requests,
        "warm_wake_s": warm_s,
        "warm_wake_gets": warm_gets,
        "warm_wake_bytes": warm_bytes,
        "stored_bytes": stored,
        "event_bytes": event_bytes,
        "fork_s": fork_s,
        "copy_s": copy_s,
        "open_fold_full_s": fold_full_s,
        "open_fold_checkpoint_s": fold_checkpoint_s,
    }


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.05)
        endpoint = f"http://127.0.0.1:{port}"
        os.environ.update(
            AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1"
        )
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="lodger-bench"
        )
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


async def run(args: argparse.Namespace, work: Path, endpoint: str) -> dict[str, object]:
    n = args.calls
    sqlite_log = EventLog(SqliteLogStore(work / "sqlite"))
    per_call_sqlite, _ = await calls(sqlite_log, n)
    await sqlite_log.close()

    def file_store(name: str, **kw: object) -> ObjectLogStore:
        where = open_object_store(f"file://{work / name}")
        return ObjectLogStore(
            where.store, identity=f"bench-{name}", local_root=where.local_root, **kw
        )

    store = file_store("objects")
    per_call_file, file_commits = await calls(EventLog(store), n)
    file_puts = store.stats.puts

    strict = file_store("objects-strict", head_per_append=True)
    per_call_strict, strict_commits = await calls(EventLog(strict), n)
    strict_puts = strict.stats.puts

    width = 8
    wide = file_store("objects-parallel")
    per_call_wide, wide_commits = await calls(EventLog(wide), n - n % width, width=width)
    wide_puts = wide.stats.puts
    wide_calls = n - n % width

    s3_where = open_object_store(f"s3://lodger-bench/calls?endpoint={endpoint}")
    s3_store = ObjectLogStore(s3_where.store, identity="bench-s3")
    per_call_s3, _ = await calls(EventLog(s3_store), n)
    heads_per_call = s3_store.stats.heads / n

    # what the HEAD confirming each segment put costs: the same turns without it,
    # alternated three times (best of each), so drift on a busy machine hits both alike
    per_call_file_unconfirmed = per_call_file_confirmed = float("inf")
    per_call_s3_unconfirmed = per_call_s3_confirmed = float("inf")
    for round_ in range(3):
        plain = open_object_store(f"file://{work / f'unconfirmed-{round_}'}")
        unconfirmed = _Unconfirmed(plain.store, identity="b-plain", local_root=plain.local_root)
        seconds, _ = await calls(EventLog(unconfirmed), n)
        per_call_file_unconfirmed = min(per_call_file_unconfirmed, seconds)
        seconds, _ = await calls(EventLog(file_store(f"confirmed-{round_}")), n)
        per_call_file_confirmed = min(per_call_file_confirmed, seconds)
        s3_url = f"s3://lodger-bench/confirm-{round_}?endpoint={endpoint}"
        plain_url = f"s3://lodger-bench/unconfirmed-{round_}?endpoint={endpoint}"
        s3_plain = _Unconfirmed(open_object_store(plain_url).store, identity="b-s3p")
        seconds, _ = await calls(EventLog(s3_plain), n)
        per_call_s3_unconfirmed = min(per_call_s3_unconfirmed, seconds)
        s3_confirmed = ObjectLogStore(open_object_store(s3_url).store, identity="b-s3c")
        seconds, _ = await calls(EventLog(s3_confirmed), n)
        per_call_s3_confirmed = min(per_call_s3_confirmed, seconds)

    file_wake = await wake(f"file://{work / 'wake'}", work, args.events, args.batch)
    s3_wake = await wake(f"s3://lodger-bench/wake?endpoint={endpoint}", work, args.events, 50)
    return {
        "calls": n,
        "events": args.events,
        "puts_per_call": file_puts / n,
        "puts_per_commit": file_puts / file_commits,
        "commits_per_call": file_commits / n,
        "puts_per_call_head_per_append": strict_puts / n,
        "puts_per_commit_head_per_append": strict_puts / strict_commits,
        "parallel_width": width,
        "puts_per_call_parallel": wide_puts / wide_calls,
        "commits_per_call_parallel": wide_commits / wide_calls,
        "puts_per_call_ratio_vs_head_per_append": (file_puts / n) / (strict_puts / n),
        "per_call_ms": {
            "sqlite": per_call_sqlite * 1e3,
            "objects_file": per_call_file * 1e3,
            "objects_file_head_per_append": per_call_strict * 1e3,
            "objects_file_parallel": per_call_wide * 1e3,
            "objects_s3_moto": per_call_s3 * 1e3,
        },
        "per_call_ratio_vs_sqlite": {
            "objects_file": per_call_file / per_call_sqlite,
            "objects_s3_moto": per_call_s3 / per_call_sqlite,
        },
        "confirmed_puts": {
            "heads_per_call": heads_per_call,
            "per_call_ms_confirmed_best_of_3": {
                "objects_file": per_call_file_confirmed * 1e3,
                "objects_s3_moto": per_call_s3_confirmed * 1e3,
            },
            "per_call_ms_unconfirmed_best_of_3": {
                "objects_file": per_call_file_unconfirmed * 1e3,
                "objects_s3_moto": per_call_s3_unconfirmed * 1e3,
            },
            "per_call_ratio_vs_unconfirmed": {
                "objects_file": per_call_file_confirmed / per_call_file_unconfirmed,
                "objects_s3_moto": per_call_s3_confirmed / per_call_s3_unconfirmed,
            },
        },
        "wake": {"file": file_wake, "s3_moto": s3_wake},
        "stored_over_event_bytes": {
            "file": file_wake["stored_bytes"] / file_wake["event_bytes"],
            "s3_moto": s3_wake["stored_bytes"] / s3_wake["event_bytes"],
        },
        "fork_over_copy": {
            "file": file_wake["fork_s"] / file_wake["copy_s"],
            "s3_moto": s3_wake["fork_s"] / s3_wake["copy_s"],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--calls", type=int, default=None)
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--batch", type=int, default=10, help="events per append when filling")
    args = parser.parse_args()
    args.calls = args.calls or (50 if args.quick else 200)
    args.events = args.events or (2_000 if args.quick else 10_000)
    work = Path(tempfile.mkdtemp(prefix="lodger-objbench-"))
    try:
        with moto_server() as endpoint:
            result = asyncio.run(run(args, work, endpoint))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    per = result["per_call_ms"]
    assert isinstance(per, dict)
    print(f"calls: {result['calls']}, dormant session: {result['events']} events")
    print(
        f"puts per durable call (objects, file): {result['puts_per_call']:.2f} "
        f"({result['puts_per_commit']:.2f} per commit, {result['commits_per_call']:.2f} "
        f"commits per call); with a head put per append: "
        f"{result['puts_per_call_head_per_append']:.2f}"
    )
    print(
        f"puts per call, {result['parallel_width']} parallel calls per step: "
        f"{result['puts_per_call_parallel']:.2f} "
        f"({result['commits_per_call_parallel']:.2f} commits per call, group commit)"
    )
    for name, ms in per.items():
        print(f"per-call latency {name:>16}: {ms:8.3f} ms")
    confirmed = result["confirmed_puts"]
    assert isinstance(confirmed, dict)
    ratios = confirmed["per_call_ratio_vs_unconfirmed"]
    with_ms, without_ms = (
        confirmed["per_call_ms_confirmed_best_of_3"],
        confirmed["per_call_ms_unconfirmed_best_of_3"],
    )
    print(
        f"a HEAD confirming each segment put ({confirmed['heads_per_call']:.2f} per call): "
        f"per-call latency {ratios['objects_file']:.2f}x on file "
        f"({with_ms['objects_file']:.3f} vs {without_ms['objects_file']:.3f} ms), "
        f"{ratios['objects_s3_moto']:.2f}x on S3 (moto) ({with_ms['objects_s3_moto']:.3f} vs "
        f"{without_ms['objects_s3_moto']:.3f} ms) against the same turns without it, best of 3"
    )
    wake_rows = result["wake"]
    assert isinstance(wake_rows, dict)
    for name, row in wake_rows.items():
        print(
            f"wake {name:>8}: cold {row['cold_wake_s'] * 1e3:8.1f} ms "
            f"({row['cold_wake_requests']} log requests; time incl. a 200-file snapshot restore); "
            f"warm {row['warm_wake_s'] * 1e3:7.1f} ms ({row['warm_wake_gets']} gets); "
            f"stored {row['stored_bytes']} B for {row['event_bytes']} B of events; "
            f"fork {row['fork_s'] * 1e3:.1f} ms vs copy {row['copy_s'] * 1e3:.1f} ms"
        )
        full, ckpt = row["open_fold_full_s"], row["open_fold_checkpoint_s"]
        print(
            f"open fold {name:>3}: no checkpoint {full * 1e3:8.1f} ms; another worker from "
            f"the checkpoint {ckpt * 1e3:8.1f} ms ({ckpt / full:.2f}x)"
        )
    folds = {n: r["open_fold_checkpoint_s"] / r["open_fold_full_s"] for n, r in wake_rows.items()}
    result["open_fold_checkpoint_over_full"] = folds
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()

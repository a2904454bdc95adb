"""Opening and resuming a long session: ``lodger resume`` at 100k events, a new turn at 40k.

Builds a real SQLite state directory holding one long session (100k events: turns of runs
and steps whose model outputs propose calls, T1/T2 pairs, rejections and permission
dialogues, the shapes of ``bench/cli_scale.py``) whose LAST turn is interrupted between
T1 and T2 of an idempotent ``read_file`` call, so resume does real work: it re-dispatches
the call under a linked T1, records T2, asks the scripted model for its next step and ends
the turn. Every resume runs on a fresh copy of the state directory (written back to disk
before the command starts), as a subprocess
(``python -m lodger resume SESSION --model script:FILE --workspace DIR --state STATE``).

Baselines measured in the same run:

- ``startup``: ``python -m lodger --version`` (the interpreter and the CLI's root);
- ``imports``: ``python -m lodger resume --help`` (plus every module resume imports);
- ``raw``: reading every record of the session from SQLite and chaining sha256 over its
  bytes, in this process (the least any verifying reader must do).

Fold checkpoints (``lodger.engine.checkpoint``): ``resume_ckpt`` and ``recover_ckpt`` run
on a copy that holds the checkpoint the last completed turn wrote (offset N = the start of
the interrupted turn), so the open checks the chain over every record, loads the fold of
[0, N) and decodes only the last turn's events; ``resume`` and ``recover`` run on a copy
without one (they decode everything, and write one for next time). The ``--before-src``
lodger runs on both copies too (one from before checkpoints ignores the file and decodes
everything); ``*_ckpt_over_before_ckpt`` compares the two on the copy with a checkpoint.

Also measured in-process, on a 40k-event session whose last turn ended: opening it with
``Sessions`` and running one turn (``cold``: the whole log is read, verified and folded,
and a checkpoint written: the first open of a log without one), then five more turns on
the same ``Sessions`` (``warm``, the median: only the new tail is read; the target is
<= 20 ms at 40k events, O(new events)); and the first turn on a fresh copy that holds the
checkpoint its last turn wrote, as a session lodger's own turns grew has one
(``cold_turn_ckpt``: the chain checked over every byte, the checkpoint's fold loaded;
the target is <= 150 ms at 40k events).

    python bench/resume_scale.py [--quick] [--before-src OTHER/src]

Numbers come from a shared, loaded 2-core machine: compare ratios within one run. Each
command's CPU seconds (user + system of the ``lodger`` process, median) are printed next
to its wall time: on a loaded machine they move far less than the wall time does. The
last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from collections.abc import Iterator
from pathlib import Path

from lodger.engine.checkpoint import decode_or_why, encode_checkpoint, open_fold
from lodger.engine.state import SessionState
from lodger.events import (
    EventDraft,
    ModelOutput,
    ProposedCall,
    RunStarted,
    SessionStarted,
    StepStarted,
    ToolDispatched,
    ToolRef,
    TurnEnded,
    TurnStarted,
    chain_digest,
)
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.builtin import workspace_tools
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import EventLog, SqliteLogStore
from lodger.tools.workspace import workspace_id

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_scale import session_drafts  # a sibling benchmark's session shapes

SESSION = "s-long"
RESUME_TARGET_S = 1.0
WARM_TURN_TARGET_S = 0.020
COLD_OPEN_TARGET_S = 0.150
BATCH = 4_000
SCRIPT = [
    {"calls": [{"name": "read_file", "args": {"path": "notes.txt"}}]},
    {"text": "done"},
]


def history(
    total: int, workspace: Path, *, interrupted: bool, model: str = "script:bench"
) -> Iterator[EventDraft]:
    """About ``total`` drafts: the cli_scale session (with a real workspace at offset 0)
    cut at the end of a turn, then, when ``interrupted``, a last turn left open between T1
    and T2 of an idempotent ``read_file`` call."""
    tail = 5 if interrupted else 0
    n = 0
    last: EventDraft | None = None
    for n, draft in enumerate(session_drafts(10**9, 8), start=1):
        if n == 1:
            body = SessionStarted(
                workspace=str(workspace),
                workspace_id=workspace_id(workspace),
                metadata={"bench": "resume_scale"},
            )
            draft = draft.model_copy(update={"body": body})
        yield draft
        last = draft
        if n >= total - tail and isinstance(draft.body, TurnEnded):
            break
    if not interrupted or last is None:
        return
    ts = last.ts
    tid, rid, sid = "t-last", "r-last", "r-last-s0"

    def draft_of(body: object, **env: str) -> EventDraft:
        nonlocal n, ts
        n += 1
        ts += 1_000
        return EventDraft(id=f"e{n:08d}", ts=ts, body=body, **env)  # type: ignore[arg-type]

    call = ProposedCall(call_id="call-0-1", name="read_file", arguments='{"path": "notes.txt"}')
    yield draft_of(TurnStarted(input="read the notes"), turn_id=tid)
    yield draft_of(RunStarted(model=model), turn_id=tid, run_id=rid)
    yield draft_of(
        StepStarted(
            index=0,
            model="script:bench",
            tools=(ToolRef(name="read_file", schema_digest="sha256-read_file"),),
        ),
        turn_id=tid,
        run_id=rid,
        step_id=sid,
    )
    yield draft_of(ModelOutput(calls=(call,)), turn_id=tid, run_id=rid, step_id=sid)
    yield draft_of(
        ToolDispatched(
            operation_id="op-last",
            tool="read_file",
            arguments={"path": "notes.txt"},
            recovery="idempotent",
        ),
        turn_id=tid,
        run_id=rid,
        step_id=sid,
        call_id=call.call_id,
    )


async def build(state: Path, session: str, drafts: Iterator[EventDraft]) -> int:
    log = EventLog(SqliteLogStore(state))
    try:
        async with await log.open_writer(session) as writer:
            batch: list[EventDraft] = []
            for d in drafts:
                batch.append(d)
                if len(batch) == BATCH:
                    await writer.append(batch, expected_offset=writer.head.high_water)
                    batch = []
            if batch:
                await writer.append(batch, expected_offset=writer.head.high_water)
            return writer.head.high_water
    finally:
        await log.close()


async def write_turn_checkpoint(state: Path, session: str = SESSION) -> int:
    """The checkpoint the last completed turn wrote: the fold of every event before the
    interrupted last turn (of every event, when the last turn ended). Returns its
    offset N."""
    log = EventLog(SqliteLogStore(state))
    try:
        verified = await log.read_verified(session)
        folded = SessionState(session, verified.decode())
        n = folded.open_turn_offset if folded.open_turn_offset is not None else len(verified)
        data = encode_checkpoint(SessionState(session, verified.decode(0, n)), verified.chain)
        await log.checkpoints.save_checkpoint(session_id=session, data=data)
        return n
    finally:
        await log.close()


async def checkpoint_phases(state: Path) -> dict[str, float]:
    """Opening the session from its checkpoint in this process (seconds): the verified
    read (every record, the chain over every byte), loading and binding the checkpoint
    (seal, JSON of the fold and the call states), decoding and folding the events after
    it, the first projection; and ``open_fold`` whole, with and without the checkpoint
    (without: a full decode and fold, and the checkpoint written)."""
    log = EventLog(SqliteLogStore(state))
    try:
        out: dict[str, float] = {}
        t0 = time.perf_counter()
        verified = await log.read_verified(SESSION)
        out["read_and_chain_bytes"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        data = await log.checkpoints.load_checkpoint(session_id=SESSION)
        assert data is not None
        folded = await asyncio.to_thread(decode_or_why, data, verified)
        assert not isinstance(folded, str), folded
        out["load_checkpoint"] = time.perf_counter() - t0
        n = len(folded.events)
        t0 = time.perf_counter()
        folded.feed(await asyncio.to_thread(verified.decode, n))
        out["decode_and_fold_tail"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        projection = folded.projector.project()
        list(projection.messages[-8:])  # what a request that reads the latest turn touches
        out["project_latest"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        assert len(list(projection.messages)) > 0  # a provider that sends everything
        out["materialize_all_messages"] = time.perf_counter() - t0
        del folded, projection
        t0 = time.perf_counter()
        await open_fold(log, SESSION)
        out["open_fold_with_checkpoint"] = time.perf_counter() - t0
        await log.checkpoints.discard_checkpoint(session_id=SESSION)
        t0 = time.perf_counter()
        await open_fold(log, SESSION)
        out["open_fold_without_(writes_one)"] = time.perf_counter() - t0
        out["checkpoint_bytes"] = float(len(data))
        out["checkpoint_offset"] = float(n)
        return out
    finally:
        await log.close()


def raw_read_and_chain(state: Path, session: str = SESSION) -> tuple[float, float, int]:
    with contextlib.closing(sqlite3.connect(state / "log.sqlite3")) as conn:
        t0 = time.perf_counter()
        rows = conn.execute(
            'SELECT "offset", data, digest FROM events WHERE session_id = ? ORDER BY "offset"',
            (session,),
        ).fetchall()
        t1 = time.perf_counter()
    prev = ""
    for _, data, digest in rows:
        prev = chain_digest(prev, data)
        assert prev == digest
    return t1 - t0, time.perf_counter() - t1, len(rows)


def children_cpu() -> float:
    """CPU seconds (user + system) of every child process that ended so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


#: CPU seconds of each `lodger` command run, by command key (steadier than wall time on a
#: loaded machine: time spent waiting for a CPU or the disk is not in them)
CPU: dict[str, list[float]] = {}


def run_cli(args: list[str], env: dict[str, str], key: str = "") -> tuple[float, int, str]:
    cpu = children_cpu()
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "lodger", *args], env=env, capture_output=True, check=False
    )
    elapsed = time.perf_counter() - t0
    CPU.setdefault(key, []).append(children_cpu() - cpu)
    return elapsed, done.returncode, done.stderr.decode(errors="replace")[-2000:]


def resumed_ok(state: Path) -> bool:
    """The copy's log now ends the interrupted turn: a T2 for the re-dispatch, then done."""
    with contextlib.closing(sqlite3.connect(state / "log.sqlite3")) as conn:
        rows = conn.execute(
            'SELECT data FROM events WHERE session_id = ? ORDER BY "offset" DESC LIMIT 12',
            (SESSION,),
        ).fetchall()
    kinds = [json.loads(r[0])["body"]["kind"] for r in rows]
    return kinds[0] == "turn_ended" and "tool_responded" in kinds


async def phases(state: Path) -> dict[str, float]:
    """Where opening the session goes, stage by stage, in this process (seconds): the
    stored records, the chain over their bytes, decoding every event (pydantic, chain
    checked again), folding them (``SessionState``: turns, calls, plan) and projecting
    the model's conversation (what the first resumed model request needs)."""
    log = EventLog(SqliteLogStore(state))
    try:
        out: dict[str, float] = {}
        t0 = time.perf_counter()
        records = await log.store.read_records(session_id=SESSION, start=0, end=None)
        out["read_records"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        verified = await log.read_verified(SESSION)
        out["read_and_chain_bytes"] = time.perf_counter() - t0
        del records
        t0 = time.perf_counter()
        events = await asyncio.to_thread(verified.decode)
        out["decode_all"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        folded = SessionState(SESSION, events)
        out["fold"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        projection = folded.projector.project()
        out["project"] = time.perf_counter() - t0
        assert len(projection.messages) > 0 and folded.open_turn == "t-last"
        t0 = time.perf_counter()
        await log.read_all(SESSION)
        out["read_all"] = time.perf_counter() - t0
        return out
    finally:
        await log.close()


async def turns_in_process(
    state: Path, session: str, workspace: Path, warm_turns: int
) -> tuple[float, float]:
    """Seconds of a first turn on a fresh ``Sessions`` (cold) and the median of the next
    ``warm_turns`` turns on the same ``Sessions`` (warm: only the new tail is read)."""
    binding = Binding(
        model=ScriptedModel([{"text": "ok"}]), tools=workspace_tools(), workspace=workspace
    )
    async with Sessions.local(state) as sessions:
        t0 = time.perf_counter()
        await sessions.run("first", binding=binding, session=session)
        cold = time.perf_counter() - t0
        warm: list[float] = []
        for n in range(warm_turns):
            t0 = time.perf_counter()
            await sessions.run(f"turn {n}", binding=binding, session=session)
            warm.append(time.perf_counter() - t0)
    return cold, statistics.median(warm)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--turn-events", type=int, default=40_000)
    parser.add_argument("--repeat", type=int, default=5, help="runs per command (median)")
    parser.add_argument("--quick", action="store_true", help="2 runs per command")
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="parent of the temp dir")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--before-src", type=Path, help="also run with this src on PYTHONPATH")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat = 2

    workdir = Path(tempfile.mkdtemp(prefix=".bench-resume-", dir=args.dir))
    golden = workdir / "golden"
    workspace = workdir / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("remember the milk\n")
    script = workdir / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    for name in ("LODGER_STATE", "LODGER_DEBUG", "LODGER_LOG_KEY", "LODGER_LOG_KEY_FILE"):
        env.pop(name, None)
    envs = {"": env}
    if args.before_src is not None:
        envs["before_"] = {**env, "PYTHONPATH": str(args.before_src.resolve())}
    try:
        t0 = time.perf_counter()
        asyncio.run(
            build(
                golden,
                SESSION,
                history(args.events, workspace, interrupted=True, model=f"script:{script}"),
            )
        )
        golden_ckpt = workdir / "golden-ckpt"
        shutil.copytree(golden, golden_ckpt)
        ckpt_offset = asyncio.run(write_turn_checkpoint(golden_ckpt))
        turn_state = workdir / "turns"
        turn_events = asyncio.run(
            build(turn_state, "s-turns", history(args.turn_events, workspace, interrupted=False))
        )
        # the same session as lodger's own turns leave it: with the checkpoint its last
        # turn wrote (a turn writes one when the log grew by a tenth since the last)
        turn_state_ckpt = workdir / "turns-ckpt"
        shutil.copytree(turn_state, turn_state_ckpt)
        asyncio.run(write_turn_checkpoint(turn_state_ckpt, "s-turns"))
        build_s = time.perf_counter() - t0
        resume_args = ["--model", f"script:{script}", "--workspace", str(workspace)]
        commands: dict[str, list[str]] = {
            "startup": ["--version"],
            "imports": ["resume", "--help"],  # the command's imports, no log read
            "resume": ["resume", SESSION, *resume_args],
            "resume_ckpt": ["resume", SESSION, *resume_args],
            "resume_defaults": ["resume", SESSION],
            "resume_defaults_ckpt": ["resume", SESSION],
            "recover": ["recover", SESSION],
            "recover_ckpt": ["recover", SESSION],
            "verify": ["log", "verify", SESSION],
        }
        runs: dict[str, list[float]] = {p + c: [] for p in envs for c in commands}
        raw_read: list[float] = []
        raw_chain: list[float] = []
        records = 0
        for _ in range(args.repeat):  # interleaved, so drift hits every series alike
            read_s, chain_s, records = raw_read_and_chain(golden)
            raw_read.append(read_s)
            raw_chain.append(chain_s)
            for name, cli_args in commands.items():
                for prefix, run_env in envs.items():
                    state = workdir / "run"
                    shutil.rmtree(state, ignore_errors=True)
                    shutil.copytree(golden_ckpt if name.endswith("_ckpt") else golden, state)
                    # the copy's 200 MB of dirty pages are written back now, not by the
                    # command's first fdatasync of the database (its WAL checkpoint at close
                    # paid ~75 ms for the copy): a real session's file is not a fresh copy
                    os.sync()
                    full = cli_args if name == "startup" else [*cli_args, "--state", str(state)]
                    elapsed, code, err = run_cli(full, run_env, prefix + name)
                    if code != 0 or (name.startswith("resume") and not resumed_ok(state)):
                        print(f"error: `lodger {' '.join(full)}` exited {code}\n{err}")
                        return 1
                    runs[prefix + name].append(elapsed)
        cold_s, warm_s = asyncio.run(
            turns_in_process(turn_state, "s-turns", workspace, warm_turns=5)
        )
        cold_ckpt_runs, raw_turn_runs = [], []
        for _ in range(args.repeat):  # a fresh copy each time: a turn moves the log on
            fresh = workdir / "turns-ckpt-run"
            shutil.rmtree(fresh, ignore_errors=True)
            shutil.copytree(turn_state_ckpt, fresh)
            os.sync()
            read_s, chain_s, _ = raw_read_and_chain(turn_state_ckpt, "s-turns")
            raw_turn_runs.append(read_s + chain_s)
            cold_ckpt_runs.append(
                asyncio.run(turns_in_process(fresh, "s-turns", workspace, warm_turns=1))[0]
            )
        cold_ckpt_s = statistics.median(cold_ckpt_runs)
        raw_turn_s = statistics.median(raw_turn_runs)
        stages = asyncio.run(phases(golden))
        ckpt_stages = asyncio.run(checkpoint_phases(golden_ckpt))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    med = {name: statistics.median(samples) for name, samples in runs.items()}
    raw = statistics.median(raw_read) + statistics.median(raw_chain)
    startup = med["startup"]
    print(f"session     {records} events (last turn interrupted); built in {build_s:.1f} s")
    print(f"runs        {args.repeat} per command, subprocess `python -m lodger ...`, median")
    print("machine     shared and loaded (2 cores): compare ratios within this run")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        # a tree without .pyc files compiles every module it imports on every start
        print("bytecode    PYTHONDONTWRITEBYTECODE is set: compare trees with the same .pyc state")
    print()
    print(f"{'baseline':<44}{'s':>9}")
    print(f"{'  python -m lodger --version':<44}{startup:>9.3f}")
    print(f"{'  raw SQLite read of every record':<44}{statistics.median(raw_read):>9.3f}")
    print(f"{'  sha256 chain over their bytes':<44}{statistics.median(raw_chain):>9.3f}")
    print()
    cpu = {key: statistics.median(samples) for key, samples in CPU.items()}
    header = f"{'command':<57}{'s':>9}{'(s - startup) / raw':>22}{'CPU s':>9}"
    print(header)
    print("-" * len(header))
    result: dict[str, object] = {
        "bench": "resume_scale",
        "events": records,
        "repeat": args.repeat,
        "startup_s": round(startup, 4),
        "startup_cpu_s": round(cpu["startup"], 4),
        "raw_s": round(raw, 4),
    }
    for prefix in envs:
        for name, cli_args in commands.items():
            key = prefix + name
            if (name == "startup" and not prefix) or key not in med:
                continue
            ratio = (med[key] - startup) / raw
            label = "lodger " + " ".join(
                "script:FILE" if a.startswith("script:") else "DIR" if a == str(workspace) else a
                for a in cli_args
            )
            label = f"{label} (before)" if prefix else label
            label = f"{label} [checkpoint]" if name.endswith("_ckpt") else label
            print(f"{label[:56]:<57}{med[key]:>9.3f}{ratio:>22.2f}{cpu[key]:>9.3f}")
            result[f"{key}_s"] = round(med[key], 4)
            result[f"{key}_cpu_s"] = round(cpu[key], 4)
            result[f"{key}_over_raw"] = round(ratio, 2)
            if prefix and name.endswith("_ckpt"):
                result[f"{name}_over_before_ckpt"] = round(med[name] / med[key], 3)
            elif prefix and name != "startup":
                result[f"{name}_speedup_over_before"] = round(med[key] / med[name], 2)
                if f"{name}_ckpt" in med:
                    result[f"{name}_ckpt_speedup_over_before"] = round(
                        med[key] / med[f"{name}_ckpt"], 2
                    )
    print()
    print(f"{'in-process stages of opening it':<44}{'s':>9}")
    for name, seconds in stages.items():
        print(f"{'  ' + name:<44}{seconds:>9.3f}")
    print()
    print(
        f"{'opening it from the checkpoint at offset ' + str(ckpt_offset):<44}{'s':>9}"
        f"   ({ckpt_stages['checkpoint_bytes'] / 1e6:.1f} MB)"
    )
    for name, seconds in ckpt_stages.items():
        if name not in ("checkpoint_bytes", "checkpoint_offset"):
            print(f"{'  ' + name:<44}{seconds:>9.3f}")
    print()
    print(
        f"in-process, {turn_events} events: first turn on a fresh Sessions {cold_s * 1e3:.1f} ms"
        " (no checkpoint: the first open ever)"
    )
    print(
        f"in-process, {turn_events} events: first turn on a fresh Sessions "
        f"{cold_ckpt_s * 1e3:.1f} ms (with the checkpoint its last turn wrote;"
        f" target <= {COLD_OPEN_TARGET_S * 1e3:.0f} ms: "
        f"{'ok' if cold_ckpt_s <= COLD_OPEN_TARGET_S else 'MISSED'});"
        f" {cold_ckpt_s / raw_turn_s:.2f}x the raw read and chain of its records"
        f" ({raw_turn_s * 1e3:.1f} ms)"
    )
    print(
        f"in-process, {turn_events} events: next turn on the open session  {warm_s * 1e3:.1f} ms"
        " (median of 5)"
        f" (target <= {WARM_TURN_TARGET_S * 1e3:.0f} ms)"
    )
    for name in ("resume", "resume_ckpt"):
        print(
            f"lodger resume{' after a turn that wrote a checkpoint' if 'ckpt' in name else ''}"
            f" {med[name]:.2f} s (target < {RESUME_TARGET_S} s at 100k events: "
            f"{'ok' if med[name] < RESUME_TARGET_S else 'MISSED'})"
        )
    result.update(
        stages_s={name: round(seconds, 4) for name, seconds in stages.items()},
        checkpoint_stages_s={
            name: round(seconds, 4)
            for name, seconds in ckpt_stages.items()
            if name not in ("checkpoint_bytes", "checkpoint_offset")
        },
        checkpoint_bytes=int(ckpt_stages["checkpoint_bytes"]),
        checkpoint_offset=ckpt_offset,
        resume_ckpt_over_resume=round(med["resume_ckpt"] / med["resume"], 3),
        resume_ckpt_meets_target=med["resume_ckpt"] < RESUME_TARGET_S,
        turn_events=turn_events,
        cold_turn_s=round(cold_s, 4),
        cold_turn_ckpt_s=round(cold_ckpt_s, 4),
        cold_turn_ckpt_meets_target=cold_ckpt_s <= COLD_OPEN_TARGET_S,
        turn_raw_s=round(raw_turn_s, 4),
        cold_turn_ckpt_over_raw=round(cold_ckpt_s / raw_turn_s, 2),
        cold_turn_over_raw=round(cold_s / raw_turn_s, 2),
        warm_turn_s=round(warm_s, 4),
        warm_over_cold=round(warm_s / cold_s, 4),
        resume_target_s=RESUME_TARGET_S,
        resume_meets_target=med["resume"] < RESUME_TARGET_S,
        warm_turn_meets_target=warm_s <= WARM_TURN_TARGET_S,
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Recovery planning time for sessions of 1k, 10k and 100k events.

Each session is realistic: turns of steps, each step a model output with two calls, their
T1/T2 pairs, a rejection now and then, and a last turn interrupted between T1 and T2.
Measured in the same run:

- ``plan``: ``plan_recovery(events)`` (classification of every call + the plan), the
  pure part resume runs on every start. Target: 100k events in under 1 s.
- ``read``: reading and verifying the whole log from SQLite (what opening a writer does).
- ``baseline``: one bare pass over the same events (an isinstance per event), the floor
  any classification must pay.

    python bench/recovery.py [--quick]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from lodger.events import (
    CallRejected,
    Event,
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
from lodger.recovery import plan_recovery
from lodger.storage import EventLog, SqliteLogStore


def drafts_for(n_events: int) -> list[EventDraft]:
    out: list[EventDraft] = []
    counter = 0

    def add(body: object, **env: object) -> None:
        nonlocal counter
        counter += 1
        out.append(EventDraft(id=f"e{counter}", ts=counter, body=body, **env))  # type: ignore[arg-type]

    add(SessionStarted(workspace="/ws", workspace_id="w"))
    turn = 0
    tools = (
        ToolRef(name="read_file", schema_digest="d1"),
        ToolRef(name="edit_file", schema_digest="d2"),
    )
    while len(out) < n_events - 12:
        turn += 1
        t, r = f"t{turn}", f"r{turn}"
        add(TurnStarted(input=f"task {turn}"), turn_id=t)
        add(RunStarted(model="script:x"), turn_id=t, run_id=r)
        for step in range(4):
            if len(out) >= n_events - 12:
                break
            s = f"{t}s{step}"
            calls = tuple(
                ProposedCall(call_id=f"{s}c{i}", name="read_file", arguments='{"path": "a.py"}')
                for i in range(2)
            )
            add(
                StepStarted(index=step, model="script:x", tools=tools),
                turn_id=t,
                run_id=r,
                step_id=s,
            )
            add(ModelOutput(text="reading", calls=calls), turn_id=t, run_id=r, step_id=s)
            for i, call in enumerate(calls):
                env = {"turn_id": t, "run_id": r, "step_id": s, "call_id": call.call_id}
                if (turn + step + i) % 17 == 0:
                    add(
                        CallRejected(tool="read_file", reason="invalid_arguments", message="x"),
                        **env,
                    )
                    continue
                op = f"{call.call_id}o"
                add(
                    ToolDispatched(
                        operation_id=op,
                        tool="read_file",
                        arguments={"path": "a.py"},
                        recovery="idempotent",
                    ),
                    **env,
                )
                add(ToolResponded(operation_id=op, status="ok", content="1 import os\n" * 8), **env)
        add(RunEnded(status="completed"), turn_id=t, run_id=r)
        add(TurnEnded(status="completed", answer="ok"), turn_id=t, run_id=r)
    # the last turn is interrupted between T1 and T2
    t, r = "tlast", "rlast"
    add(TurnStarted(input="last"), turn_id=t)
    add(RunStarted(model="script:x"), turn_id=t, run_id=r)
    add(StepStarted(index=0, model="script:x", tools=tools), turn_id=t, run_id=r, step_id="ls")
    call = ProposedCall(call_id="lastc", name="edit_file", arguments="{}")
    add(ModelOutput(calls=(call,)), turn_id=t, run_id=r, step_id="ls")
    add(
        ToolDispatched(operation_id="lasto", tool="edit_file", arguments={}),
        turn_id=t,
        run_id=r,
        call_id="lastc",
    )
    return out


async def build(directory: Path, n: int) -> list[Event]:
    log = EventLog(SqliteLogStore(directory))
    writer = await log.open_writer("bench")
    drafts = drafts_for(n)
    for i in range(0, len(drafts), 2000):
        await writer.append(drafts[i : i + 2000], expected_offset=i)
    await writer.close()
    start = time.perf_counter()
    events = await log.read_all("bench")
    read_s = time.perf_counter() - start
    await log.close()
    build.read_s = read_s  # type: ignore[attr-defined]
    return events


def best_of(fn: object, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times) if rounds < 3 else statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = [1_000, 10_000, 100_000]
    rounds = 3 if args.quick else 7
    base = Path(tempfile.mkdtemp(prefix="lodger-bench-", dir=Path.cwd()))
    rows = []
    try:
        for n in sizes:
            events = asyncio.run(build(base / str(n), n))
            read_s = build.read_s  # type: ignore[attr-defined]
            plan = plan_recovery(events)
            assert plan.turn_id == "tlast" and plan.calls[-1].action == "park"
            plan_s = best_of(lambda ev=events: plan_recovery(ev), rounds)
            floor_s = best_of(
                lambda ev=events: sum(isinstance(e.body, ToolDispatched) for e in ev), rounds
            )
            rows.append(
                {
                    "events": len(events),
                    "plan_ms": round(plan_s * 1e3, 2),
                    "plan_us_per_event": round(plan_s / len(events) * 1e6, 3),
                    "read_verify_ms": round(read_s * 1e3, 1),
                    "baseline_pass_ms": round(floor_s * 1e3, 2),
                    "plan_vs_baseline": round(plan_s / floor_s, 2),
                }
            )
    finally:
        shutil.rmtree(base)
    header = ("events", "plan ms", "us/event", "read+verify ms", "bare pass ms", "x bare")
    keys = (
        "events",
        "plan_ms",
        "plan_us_per_event",
        "read_verify_ms",
        "baseline_pass_ms",
        "plan_vs_baseline",
    )
    print(" ".join(f"{h:>14}" for h in header))
    for row in rows:
        print(" ".join(f"{row[k]:>14}" for k in keys))
    growth = rows[-1]["plan_ms"] / rows[-2]["plan_ms"]
    print(
        f"growth 10k -> 100k: {growth:.1f}x for 10x events (linear = 10x); target: 100k < 1000 ms"
    )
    print(
        json.dumps(
            {
                "bench": "recovery",
                "sizes": rows,
                "growth_10k_to_100k": round(growth, 2),
                "plan_100k_ms": rows[-1]["plan_ms"],
                "target_100k_ms": 1000,
            }
        )
    )


if __name__ == "__main__":
    main()

"""The read-only CLI on a long session: ``lodger log show``, ``log verify`` and ``sessions``.

Builds a real SQLite state directory holding one long session (100k events by default:
turns of runs and steps whose model outputs propose calls, each call a T1/T2 pair, some
rejected or asking permission, like a real session) and a few short ones, appended
through ``EventLog`` in batches of a few thousand. Then it runs each command as a
subprocess (``python -m lodger ...``, stdout to a pipe, as a script would), several times,
and compares the median against baselines measured in the same run:

- ``startup``: ``python -m lodger --version`` (interpreter and imports, no log);
- ``raw``: reading every record of the long session from SQLite and chaining sha256 over
  its bytes, in this process (the least any verifying reader must do).

Ratios are ``(command - startup) / raw``: how many times the floor the command's own work
costs. With ``--before-src DIR`` (the ``src`` of another checkout) every command also runs
from there, interleaved, so a change is compared under the same load. The last line of
output is one JSON object.

Example:
    .venv/bin/python bench/cli_scale.py --quick
    .venv/bin/python bench/cli_scale.py --events 100000 --keep
    git archive HEAD~3 src | tar -x -C /tmp/before
    .venv/bin/python bench/cli_scale.py --before-src /tmp/before/src
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
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from lodger.events import (
    Body,
    CallRejected,
    EventDraft,
    ModelOutput,
    PermissionDecided,
    PermissionRequested,
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
    Usage,
    chain_digest,
)
from lodger.storage import EventLog, SqliteLogStore

SESSION = "s-long"
SHOW_TARGET_S = 1.0  # `lodger log show SESSION` (the last turn) on 100k events
T0 = 1_700_000_000_000_000
BATCH = 4_000
TOOLS = tuple(
    ToolRef(name=name, schema_digest=f"sha256-{name}")
    for name in ("read_file", "write_file", "grep", "shell", "exec")
)
_LOREM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud "
    "exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat. "
)


def _text(n: int, size: int) -> str:
    return (f"[{n}] " + _LOREM * (size // len(_LOREM) + 1))[:size]


def session_drafts(total: int, steps_per_turn: int) -> Iterator[EventDraft]:
    """``total`` drafts: a session start, then turns of one run each; every step but the
    last proposes two calls (each a T1/T2 pair; every 7th is rejected, every 11th asks
    permission first), the last step answers. The last turn may be cut short."""
    n = 0
    ts = T0

    def draft(body: Body, **envelope: str | None) -> EventDraft:
        nonlocal n, ts
        n += 1
        ts += 1_000 + (n * 7919) % 50_000
        return EventDraft(id=f"e{n:08d}", ts=ts, body=body, **envelope)

    yield draft(SessionStarted(workspace="/projects/bench", metadata={"bench": "cli_scale"}))
    emitted = 1
    turn = 0
    while True:
        turn += 1
        tid = f"t{turn}"
        rid = f"r{turn}"
        events: list[EventDraft] = [
            draft(TurnStarted(input=_text(turn, 200)), turn_id=tid),
            draft(
                RunStarted(model="bench:model", tools=tuple(t.name for t in TOOLS)),
                turn_id=tid,
                run_id=rid,
            ),
        ]
        for index in range(steps_per_turn):
            sid = f"{rid}-s{index}"
            env = {"turn_id": tid, "run_id": rid, "step_id": sid}
            events.append(draft(StepStarted(index=index, model="bench:model", tools=TOOLS), **env))
            usage = Usage(input_tokens=1_000 + index, output_tokens=120)
            if index == steps_per_turn - 1:
                answer = _text(turn, 300)
                events.append(
                    draft(ModelOutput(text=answer, usage=usage, finish_reason="stop"), **env)
                )
                break
            calls = tuple(
                ProposedCall(
                    call_id=f"{sid}-c{k}",
                    name=("read_file", "grep", "shell")[(n + k) % 3],
                    arguments=json.dumps({"path": f"src/module_{n % 97}.py", "pattern": "def "}),
                )
                for k in range(2)
            )
            events.append(
                draft(
                    ModelOutput(
                        text=_text(n, 120), reasoning=_text(n, 240), calls=calls, usage=usage
                    ),
                    **env,
                )
            )
            for k, call in enumerate(calls):
                cenv = {**env, "call_id": call.call_id}
                if (n + k) % 7 == 0:
                    events.append(
                        draft(
                            CallRejected(
                                tool=call.name, reason="invalid_arguments", message="no such path"
                            ),
                            **cenv,
                        )
                    )
                    continue
                if (n + k) % 11 == 0:
                    events.append(
                        draft(PermissionRequested(tool=call.name, summary=call.arguments), **cenv)
                    )
                    events.append(
                        draft(
                            PermissionDecided(tool=call.name, decision="allow", by="policy"), **cenv
                        )
                    )
                op = f"op-{call.call_id}"
                events.append(
                    draft(
                        ToolDispatched(
                            operation_id=op, tool=call.name, arguments=json.loads(call.arguments)
                        ),
                        **cenv,
                    )
                )
                events.append(
                    draft(
                        ToolResponded(operation_id=op, status="ok", content=_text(n, 600)), **cenv
                    )
                )
        events.append(draft(RunEnded(status="completed"), turn_id=tid, run_id=rid))
        events.append(draft(TurnEnded(status="completed", answer=_text(turn, 300)), turn_id=tid))
        for event in events:
            if emitted == total:
                return
            yield event
            emitted += 1


async def build(state: Path, total: int, steps_per_turn: int, small: int) -> None:
    log = EventLog(SqliteLogStore(state))
    try:
        async with await log.open_writer(SESSION) as writer:
            batch: list[EventDraft] = []
            for d in session_drafts(total, steps_per_turn):
                batch.append(d)
                if len(batch) == BATCH:
                    await writer.append(batch, expected_offset=writer.head.high_water)
                    batch = []
            if batch:
                await writer.append(batch, expected_offset=writer.head.high_water)
        for i in range(small):
            async with await log.open_writer(f"s-short-{i}") as writer:
                drafts = list(session_drafts(40, 4))
                await writer.append(drafts, expected_offset=0)
    finally:
        await log.close()


def raw_read_and_chain(state: Path) -> tuple[float, float, int, int]:
    """Seconds to read every record of the long session, seconds to chain sha256 over its
    bytes, the number of records and their bytes."""
    with contextlib.closing(sqlite3.connect(state / "log.sqlite3")) as conn:
        t0 = time.perf_counter()
        rows = conn.execute(
            'SELECT "offset", data, digest FROM events WHERE session_id = ? ORDER BY "offset"',
            (SESSION,),
        ).fetchall()
        t1 = time.perf_counter()
    prev = ""
    for _, data, digest in rows:
        prev = chain_digest(prev, data)
        assert prev == digest
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, len(rows), sum(len(row[1]) for row in rows)


def run_cli(args: list[str], env: dict[str, str]) -> tuple[float, int, int]:
    """Seconds, exit code and stdout bytes of ``python -m lodger ARGS``."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "lodger", *args], env=env, capture_output=True, check=False
    )
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        sys.stderr.write(done.stderr.decode(errors="replace"))
    return elapsed, done.returncode, len(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000, help="events in the long session")
    parser.add_argument("--steps", type=int, default=8, help="steps per turn")
    parser.add_argument("--small", type=int, default=3, help="short sessions besides it")
    parser.add_argument("--repeat", type=int, default=3, help="runs per command (median)")
    parser.add_argument("--quick", action="store_true", help="10k events, 1 run per command")
    parser.add_argument("--skip-all", action="store_true", help="do not time `log show --all`")
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="parent of the temp dir")
    parser.add_argument("--state", type=Path, help="reuse (or build once into) this state dir")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir afterwards")
    parser.add_argument(
        "--before-src", type=Path, help="also run every command with this src on PYTHONPATH"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.repeat = 10_000, 1

    workdir = Path(tempfile.mkdtemp(prefix=".bench-cli-scale-", dir=args.dir))
    state = args.state or workdir / "state"
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    for name in ("LODGER_STATE", "LODGER_DEBUG", "LODGER_LOG_KEY", "LODGER_LOG_KEY_FILE"):
        env.pop(name, None)
    try:
        t0 = time.perf_counter()
        if not (state / "log.sqlite3").exists():
            asyncio.run(build(state, args.events, args.steps, args.small))
        build_s = time.perf_counter() - t0
        commands: dict[str, list[str]] = {
            "startup": ["--version"],
            "show": ["log", "show", SESSION, "--state", str(state)],
            "show_json": ["log", "show", SESSION, "--state", str(state), "--json"],
            "verify": ["log", "verify", SESSION, "--state", str(state)],
            "sessions": ["sessions", "--state", str(state)],
        }
        if not args.skip_all:
            commands["show_all"] = ["log", "show", SESSION, "--state", str(state), "--all"]
        envs = {"": env}
        if args.before_src is not None:
            envs["before_"] = {**env, "PYTHONPATH": str(args.before_src.resolve())}
        runs: dict[str, list[float]] = {p + name: [] for p in envs for name in commands}
        output: dict[str, int] = {}
        raw_read: list[float] = []
        raw_chain: list[float] = []
        records = size = 0
        for _ in range(args.repeat):  # interleaved, so drift hits every series alike
            read_s, chain_s, records, size = raw_read_and_chain(state)
            raw_read.append(read_s)
            raw_chain.append(chain_s)
            for name, cli_args in commands.items():
                for prefix, run_env in envs.items():
                    elapsed, code, out = run_cli(cli_args, run_env)
                    if code != 0:
                        print(
                            f"error: `lodger {' '.join(cli_args)}` exited {code}", file=sys.stderr
                        )
                        return 1
                    runs[prefix + name].append(elapsed)
                    output[prefix + name] = out
    finally:
        if not args.keep and args.state is None:
            shutil.rmtree(workdir, ignore_errors=True)

    med = {name: statistics.median(samples) for name, samples in runs.items()}
    raw = statistics.median(raw_read) + statistics.median(raw_chain)
    startup = med["startup"]

    print(f"state       {state}  ({'kept' if args.keep or args.state else 'removed'})")
    print(
        f"session     {records} events, {size / 1e6:.1f} MB of canonical JSON; "
        f"built in {build_s:.1f} s"
    )
    print(f"runs        {args.repeat} per command, as subprocesses `python -m lodger ...`; median")
    print()
    print(f"{'baseline':<34}{'s':>9}")
    print(f"{'  python -m lodger --version':<34}{startup:>9.3f}")
    print(f"{'  raw SQLite read of every record':<34}{statistics.median(raw_read):>9.3f}")
    print(f"{'  sha256 chain over their bytes':<34}{statistics.median(raw_chain):>9.3f}")
    print()
    header = f"{'command':<44}{'s':>9}{'(s - startup) / raw':>22}{'stdout KB':>12}"
    print(header)
    print("-" * len(header))
    ratios: dict[str, float] = {}
    for prefix in envs:
        for name, cli_args in commands.items():
            key = prefix + name
            if name == "startup" and not prefix:
                continue
            ratios[key] = (med[key] - startup) / raw
            label = "lodger " + " ".join(a for a in cli_args if a not in (str(state), "--state"))
            label = f"{label} (before)" if prefix else label
            print(
                f"{label[:43]:<44}{med[key]:>9.3f}{ratios[key]:>22.1f}{output[key] / 1024:>12.0f}"
            )
    print()
    meets = med["show"] < SHOW_TARGET_S
    print(
        f"log show (default page) {med['show']:.2f} s "
        f"(target < {SHOW_TARGET_S} s at 100k events: {'ok' if meets else 'MISSED'})"
    )
    result: dict[str, object] = {
        "events": records,
        "bytes": size,
        "repeat": args.repeat,
        "mode": "subprocess",
        "startup_s": round(startup, 4),
        "raw_read_s": round(statistics.median(raw_read), 4),
        "raw_chain_s": round(statistics.median(raw_chain), 4),
    }
    for name in ratios:
        result[f"{name}_s"] = round(med[name], 4)
        result[f"{name}_over_raw"] = round(ratios[name], 2)
        result[f"{name}_stdout_bytes"] = output[name]
    for name in commands:
        if f"before_{name}" in med and name != "startup":
            result[f"{name}_speedup_over_before"] = round(med[f"before_{name}"] / med[name], 2)
    result["show_target_s"] = SHOW_TARGET_S
    result["show_meets_target"] = meets
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

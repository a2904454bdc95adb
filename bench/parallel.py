"""Parallel calls through the authorities, against the same calls run one step at a time.

Every scenario goes through the whole agent path: a scripted model, the context
projection, validation, permission, the file-lease authority, T1, execution and T2 on a
real SQLite log in a temporary directory under the current one.

- independent: one step of 8 calls that each wait 100 ms on I/O (``asyncio.sleep``) and
  claim their own file. Target: the batch takes <= 1.3x the slowest call, not the sum.
- conflicting: one step of 8 ``edit_file`` calls on one file (write leases on one key),
  which must serialize; the per-call cost is the batch time / 8.
- each is compared with the same 8 calls run sequentially, one call per step, in the
  same run.

"batch" is measured from the model's answer to the commit of the last T2; "turn" is the
whole ``agent.run`` (session and turn facts, both model steps, the final answer).

    python bench/parallel.py [--quick] [--rounds N]

Prints a table, then a last line of JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lodger import Agent, FunctionModel, ToolContext, tool
from lodger.authority import ResourceClaim
from lodger.engine.settings import Hooks, Limits
from lodger.events import Event, ProposedCall, ToolDispatched, ToolResponded
from lodger.providers.base import AssistantMessage, ModelRequest, ModelResponse
from lodger.runtime.builtin import edit_file
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.storage.artifacts import MemoryArtifactStore

CALLS = 8
WAIT_S = 0.100
TARGET = 1.3


def _claim(arguments: dict[str, Any], ctx: ToolContext) -> list[ResourceClaim]:
    return [ResourceClaim.file(ctx.require_workspace() / arguments["path"], mode="write")]


@tool(claims=_claim)
async def io_wait(path: str) -> str:
    """Wait 100 ms on I/O."""
    await asyncio.sleep(WAIT_S)
    return path


Batch = list[tuple[str, dict[str, Any]]]


@dataclass
class Measure:
    turn_s: float
    batch_s: float  # first model answer with calls -> last T2 committed
    overlapping: bool  # did any two T1 -> T2 intervals overlap?


def independent() -> list[Batch]:
    return [[("io_wait", {"path": f"f{i}.txt"}) for i in range(CALLS)]]


def conflicting() -> list[Batch]:
    return [
        [
            (
                "edit_file",
                {
                    "path": "shared.txt",
                    "old_string": f"line {i} old",
                    "new_string": f"line {i} new",
                },
            )
            for i in range(CALLS)
        ]
    ]


def one_per_step(batches: list[Batch]) -> list[Batch]:
    return [[call] for batch in batches for call in batch]


async def run_turn(directory: Path, batches: list[Batch]) -> Measure:
    workspace = directory / "ws"
    workspace.mkdir()
    lines = "".join(f"line {i} old\n" for i in range(CALLS))
    (workspace / "shared.txt").write_text(lines)
    marks: dict[str, float] = {}
    events: list[Event] = []

    def model(request: ModelRequest) -> ModelResponse:
        step = sum(1 for m in request.messages if isinstance(m, AssistantMessage))
        if step >= len(batches):
            return ModelResponse(text="done")
        marks.setdefault("batch_start", time.perf_counter())
        calls = tuple(
            ProposedCall(call_id=f"c{step}-{i}", name=name, arguments=json.dumps(args))
            for i, (name, args) in enumerate(batches[step])
        )
        return ModelResponse(calls=calls)

    def on_event(event: Event) -> None:
        events.append(event)
        if isinstance(event.body, ToolResponded):
            marks["batch_end"] = time.perf_counter()

    agent = Agent(
        model=FunctionModel(model),
        tools=[io_wait, edit_file],
        storage=Storage(
            log=EventLog(SqliteLogStore(directory / "state")), artifacts=MemoryArtifactStore()
        ),
        workspace=workspace,
        limits=Limits(max_steps=len(batches) + 1),
        hooks=Hooks(on_event=on_event),
    )
    start = time.perf_counter()
    result = await agent.run("benchmark")
    turn = time.perf_counter() - start
    await agent.close()
    assert result.status == "completed", result
    if any(name == "edit_file" for batch in batches for name, _ in batch):
        assert "old" not in (workspace / "shared.txt").read_text(), "an edit was lost"
    return Measure(turn, marks["batch_end"] - marks["batch_start"], _overlap(events))


def _overlap(events: list[Event]) -> bool:
    start = {e.call_id: e.ts for e in events if isinstance(e.body, ToolDispatched)}
    end = {e.call_id: e.ts for e in events if isinstance(e.body, ToolResponded)}
    spans = sorted((start[c], end[c]) for c in start if c in end)
    return any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))


def median(rounds: list[Measure], key: Callable[[Measure], float]) -> float:
    return statistics.median(key(m) for m in rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 7)

    scenarios = {
        "independent, 1 step": independent(),
        "independent, 8 steps": one_per_step(independent()),
        "conflicting, 1 step": conflicting(),
        "conflicting, 8 steps": one_per_step(conflicting()),
    }
    base = Path(tempfile.mkdtemp(prefix="lodger-bench-", dir=Path.cwd()))
    results: dict[str, list[Measure]] = {name: [] for name in scenarios}
    try:
        for r in range(rounds):
            for n, (name, batches) in enumerate(scenarios.items()):
                directory = base / f"r{r}-s{n}"
                directory.mkdir()
                results[name].append(asyncio.run(run_turn(directory, batches)))
    finally:
        for path in sorted(base.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
        base.rmdir()

    def ms(name: str, key: Callable[[Measure], float]) -> float:
        return median(results[name], key) * 1000

    par_batch = ms("independent, 1 step", lambda m: m.batch_s)
    par_turn = ms("independent, 1 step", lambda m: m.turn_s)
    seq_batch = ms("independent, 8 steps", lambda m: m.batch_s)
    edit_batch = ms("conflicting, 1 step", lambda m: m.batch_s)
    edit_seq = ms("conflicting, 8 steps", lambda m: m.batch_s)
    ratio = par_batch / (WAIT_S * 1000)
    print(f"{CALLS} calls per batch, {rounds} rounds, medians; batch = model answer -> last T2")
    print(f"{'scenario':24} {'batch ms':>9} {'turn ms':>9} {'batch/call ms':>13} {'overlap':>8}")
    for name in scenarios:
        batch = ms(name, lambda m: m.batch_s)
        turn = ms(name, lambda m: m.turn_s)
        overlapped = all(m.overlapping for m in results[name])
        print(f"{name:24} {batch:9.1f} {turn:9.1f} {batch / CALLS:13.2f} {overlapped!s:>8}")
    print(
        f"independent batch / slowest call: {ratio:.2f}x (target <= {TARGET}); "
        f"sequential / parallel: {seq_batch / par_batch:.1f}x"
    )
    print(
        f"conflicting edits serialize: {edit_batch / CALLS:.2f} ms per call in one batch, "
        f"{edit_seq / CALLS:.2f} ms per call one step each"
    )
    print(
        json.dumps(
            {
                "bench": "parallel",
                "calls": CALLS,
                "rounds": rounds,
                "io_wait_ms": WAIT_S * 1000,
                "independent_batch_ms": round(par_batch, 1),
                "independent_turn_ms": round(par_turn, 1),
                "independent_sequential_ms": round(seq_batch, 1),
                "batch_over_slowest": round(ratio, 3),
                "target_batch_over_slowest": TARGET,
                "target_met": ratio <= TARGET,
                "sequential_over_parallel": round(seq_batch / par_batch, 2),
                "conflicting_batch_ms": round(edit_batch, 1),
                "conflicting_per_call_ms": round(edit_batch / CALLS, 2),
                "conflicting_sequential_per_call_ms": round(edit_seq / CALLS, 2),
                "conflicting_serialized": not any(
                    m.overlapping for m in results["conflicting, 1 step"]
                ),
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()

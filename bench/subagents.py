"""Subagents: what a delegation costs, what a forked child writes, how children overlap.

Every figure is printed against a baseline measured in the same run, on the SQLite store
in a temporary directory (real fsyncs):

- delegation overhead: a parent step that delegates to a child whose turn is one model
  step and an answer (the child's session start, turn, run, step, output, ends) against a
  parent step that calls a no-op tool; per step, median of the repeats;
- bytes per forked child: what forking a child from a parent of P events writes (the
  child's ``session_started`` record, and its whole one-step turn) against the bytes a
  copy of the parent's prefix would write;
- concurrency: one parent step with 4 delegations whose children each call a tool that
  works 100 ms (an async sleep) against the same step with one delegation;
- on workers: a turn with one delegation whose child answers at once, from ``send`` to
  the parent's completed turn through an in-process ``Worker`` (2 slots, a SQLite
  control plane; the parent parks dormant, the child runs, the parent is woken) against
  the same turn run inline; and the events the parent's log gains by parking.

    python bench/subagents.py [--quick]

Numbers are measured on whatever machine runs this (a shared, loaded one in CI). The last
line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lodger import Agent, FunctionModel, tool
from lodger.engine.settings import Limits
from lodger.providers.base import ModelRequest, ModelResponse, UserMessage
from lodger.providers.scripted import tool_call
from lodger.runtime.sessions import Binding
from lodger.runtime.subagents import SubagentPolicy
from lodger.runtime.worker import Worker, WorkerConfig
from lodger.storage import Storage
from lodger.storage.control.sqlite import SqliteControlPlane


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


@tool
async def work() -> str:
    """Work for 100 ms."""
    await asyncio.sleep(0.1)
    return "worked"


def _task(request: ModelRequest) -> str:
    for message in reversed(request.messages):
        if isinstance(message, UserMessage) and message.source == "input":
            return message.text
    return ""


def _outputs(request: ModelRequest) -> int:
    from lodger.providers.base import AssistantMessage

    count = 0
    for message in reversed(request.messages):
        if isinstance(message, UserMessage) and message.source == "input":
            break
        count += isinstance(message, AssistantMessage)
    return count


def model_for(steps: int, parent_calls: list[dict[str, Any]]) -> FunctionModel:
    """The parent makes ``steps`` steps of ``parent_calls`` and answers; a child whose
    task is ``work`` calls the work tool once; any other child answers at once."""

    def complete(request: ModelRequest) -> ModelResponse:
        task = _task(request)
        done = _outputs(request)
        if task.startswith("parent"):
            if done < steps:
                return ModelResponse(
                    calls=tuple(tool_call(c["name"], **c["args"]) for c in parent_calls)
                )
            return ModelResponse(text="parent done")
        if task.startswith("work") and done == 0:
            return ModelResponse(calls=(tool_call("work"),))
        return ModelResponse(text="child done")

    return FunctionModel(complete)


async def timed_turn(state: Path, steps: int, calls: list[dict[str, Any]], session: str) -> float:
    async with Agent(
        model=model_for(steps, calls),
        tools=[noop, work],
        storage=state,
        limits=Limits(max_steps=steps + 1),
        subagents=SubagentPolicy(tree_steps=100_000),
    ) as agent:
        started = time.perf_counter()
        result = await agent.run("parent", session=session)
        elapsed = time.perf_counter() - started
        assert result.status == "completed", result.error
    return elapsed


async def overhead(root: Path, steps: int, repeats: int) -> dict[str, float]:
    plain: list[float] = []
    delegated: list[float] = []
    for i in range(repeats):
        plain.append(
            await timed_turn(root / f"plain{i}", steps, [{"name": "noop", "args": {}}], "p") / steps
        )
        delegated.append(
            await timed_turn(
                root / f"deleg{i}", steps, [{"name": "delegate", "args": {"task": "x"}}], "p"
            )
            / steps
        )
    p, d = statistics.median(plain), statistics.median(delegated)
    return {"plain_step_ms": p * 1000, "delegation_step_ms": d * 1000, "ratio": d / p}


async def fork_bytes(root: Path, parent_steps: int) -> dict[str, float]:
    state = root / "fork"
    # a parent of many events: parent_steps steps of 4 no-op calls, then one fork child
    calls = [{"name": "noop", "args": {}}] * 4
    await timed_turn(state, parent_steps, calls, "big")
    async with Agent(
        model=model_for(1, [{"name": "delegate", "args": {"task": "x", "history": "fork"}}]),
        tools=[noop, work],
        storage=state,
        subagents=SubagentPolicy(),
    ) as agent:
        await agent.run("parent", session="big")
        store = agent.log.store
        child = next(s for s in await agent.log.list_sessions() if s != "big")
        child_records = await store.read_records(session_id=child, start=0, end=None)
        first = child_records[0]
        started = await agent.log.read(child, end=1)
        parent_at = started[0].body.parent.high_water  # type: ignore[union-attr]
        prefix = await store.read_records(session_id="big", start=0, end=parent_at)
    copy = sum(len(r.data) for r in prefix)
    start = len(first.data)
    whole = sum(len(r.data) for r in child_records)
    return {
        "parent_events": parent_at,
        "copy_bytes": copy,
        "fork_start_bytes": start,
        "child_total_bytes": whole,
        "start_ratio": start / copy,
        "child_ratio": whole / copy,
    }


async def concurrency(root: Path, repeats: int) -> dict[str, float]:
    one: list[float] = []
    four: list[float] = []
    for i in range(repeats):
        one.append(
            await timed_turn(
                root / f"one{i}", 1, [{"name": "delegate", "args": {"task": "work"}}], "p"
            )
        )
        four.append(
            await timed_turn(
                root / f"four{i}",
                1,
                [{"name": "delegate", "args": {"task": f"work {n}"}} for n in range(4)],
                "p",
            )
        )
    o, f = statistics.median(one), statistics.median(four)
    return {"one_child_ms": o * 1000, "four_children_ms": f * 1000, "ratio": f / o}


async def _events(state: Path, session: str) -> int:
    storage = Storage.local(state)
    try:
        return len(await storage.log.read_all(session))
    finally:
        await storage.close()


async def detached_turn(root: Path) -> tuple[float, int]:
    """Send -> the parent's turn completed, through an in-process worker; the parent's
    events."""
    control = SqliteControlPlane(root / "control.sqlite3")
    await control.start()
    storage = Storage.local(root / "state")
    model = model_for(1, [{"name": "delegate", "args": {"task": "x"}}])
    policy = SubagentPolicy(tree_steps=100_000)

    def bind(session: str, recorded: str | None, workspace: Path) -> Binding:
        return Binding(model=model, tools=[noop], workspace=workspace, subagents=policy)

    config = WorkerConfig(concurrency=2, poll_s=0.002, retry_delay_s=0.005)
    worker = Worker(control=control, storage=storage, bind=bind, config=config, workdir=root)
    stop = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(worker.run(stop))
            started = time.perf_counter()
            await control.send(session_id="p", message="parent")
            while True:
                row = await control.get_session(session_id="p")
                if row is not None and row.status == "completed":
                    break
                await asyncio.sleep(0.002)
            elapsed = time.perf_counter() - started
            stop.set()
    finally:
        await storage.close()
        await control.close()
    return elapsed, await _events(root / "state", "p")


async def workers(root: Path, repeats: int) -> dict[str, float]:
    inline: list[float] = []
    detached: list[float] = []
    events = {"inline": 0, "detached": 0}
    for i in range(repeats):
        state = root / f"inline{i}"
        inline.append(
            await timed_turn(state, 1, [{"name": "delegate", "args": {"task": "x"}}], "p")
        )
        events["inline"] = await _events(state, "p")
        (root / f"workers{i}").mkdir()
        elapsed, events["detached"] = await detached_turn(root / f"workers{i}")
        detached.append(elapsed)
    n, d = statistics.median(inline), statistics.median(detached)
    return {
        "inline_ms": n * 1000,
        "workers_ms": d * 1000,
        "ratio": d / n,
        "inline_events": events["inline"],
        "workers_events": events["detached"],
    }


async def main(quick: bool) -> None:
    steps, repeats, parent_steps = (10, 3, 25) if quick else (40, 5, 100)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cost = await overhead(root, steps, repeats)
        size = await fork_bytes(root, parent_steps)
        overlap = await concurrency(root, repeats)
        dormant = await workers(root, repeats)
    print(f"{'measure':<44} {'value':>12} {'baseline':>12} {'ratio':>8}")
    print(
        f"{'delegation step (empty child turn), ms':<44} {cost['delegation_step_ms']:>12.2f} "
        f"{cost['plain_step_ms']:>12.2f} {cost['ratio']:>8.2f}"
    )
    print(
        f"{'forked child start, bytes (vs copy)':<44} {size['fork_start_bytes']:>12.0f} "
        f"{size['copy_bytes']:>12.0f} {size['start_ratio']:>8.4f}"
    )
    print(
        f"{'forked child with its turn, bytes (vs copy)':<44} "
        f"{size['child_total_bytes']:>12.0f} {size['copy_bytes']:>12.0f} "
        f"{size['child_ratio']:>8.4f}"
    )
    print(
        f"{'4 children x 100 ms work, ms (vs 1 child)':<44} {overlap['four_children_ms']:>12.1f} "
        f"{overlap['one_child_ms']:>12.1f} {overlap['ratio']:>8.2f}"
    )
    print(
        f"{'1 delegation on workers, send->done, ms':<44} {dormant['workers_ms']:>12.1f} "
        f"{dormant['inline_ms']:>12.1f} {dormant['ratio']:>8.2f}"
    )
    print(
        f"{'  parent events when parking (vs inline)':<44} {dormant['workers_events']:>12.0f} "
        f"{dormant['inline_events']:>12.0f} "
        f"{dormant['workers_events'] / dormant['inline_events']:>8.2f}"
    )
    print(f"(parent of {size['parent_events']:.0f} events; SQLite with fsync; shared machine)")
    print(
        json.dumps(
            {
                "bench": "subagents",
                "quick": quick,
                "delegation_vs_plain_call": round(cost["ratio"], 3),
                "delegation_step_ms": round(cost["delegation_step_ms"], 3),
                "plain_step_ms": round(cost["plain_step_ms"], 3),
                "fork_start_vs_copy_bytes": round(size["start_ratio"], 5),
                "fork_child_vs_copy_bytes": round(size["child_ratio"], 5),
                "parent_events": size["parent_events"],
                "copy_bytes": size["copy_bytes"],
                "fork_start_bytes": size["fork_start_bytes"],
                "four_vs_one_child_wall": round(overlap["ratio"], 3),
                "one_child_ms": round(overlap["one_child_ms"], 2),
                "four_children_ms": round(overlap["four_children_ms"], 2),
                "workers_vs_inline_delegation_wall": round(dormant["ratio"], 3),
                "workers_delegation_ms": round(dormant["workers_ms"], 2),
                "inline_delegation_ms": round(dormant["inline_ms"], 2),
                "parent_events_parked": dormant["workers_events"],
                "parent_events_inline": dormant["inline_events"],
            }
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    asyncio.run(main(parser.parse_args().quick))

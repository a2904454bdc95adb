"""Code mode: cell cold start, nested-call overhead, and a scripted task done two ways.

Every figure is printed against a baseline measured in the same run:

- cell cold start (p50/p99), JavaScript and Python: ``run_cell`` of a trivial cell
  (fresh interpreter, prelude, host wiring, result) against the bare interpreter doing
  the same ``1`` (a new mini-racer context + eval; a Monty checkout + feed);
- nested-call overhead: the same no-op tool called K times from one cell, each call a
  durable nested call (T1/T2 on SQLite), against K top-level durable calls (one step
  each) in the same store; target nested / top-level <= 1.5;
- the package.json task: 20 ``package.json`` files, report the outdated dependencies
  against a table. (a) direct tool calls: list, read all 20 in one batch, answer;
  (b) one cell. Provider round trips and tokens sent to the model (about four
  characters a token, over system prompt, tool schemas and messages) for each, and the
  saving.

    python bench/code_mode.py [--quick]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic_monty as monty
from py_mini_racer import mini_racer

from lodger import Agent, FunctionModel, tool
from lodger.events import ProposedCall
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.runtime.builtin import workspace_tools
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.storage.artifacts import MemoryArtifactStore
from lodger.substrates.codemode import CellLimits, CodeMode
from lodger.substrates.codemode._host import CellHost
from lodger.substrates.codemode.javascript import JavaScriptSubstrate
from lodger.substrates.codemode.python import PythonSubstrate
from lodger.substrates.codemode.substrate import CellSubstrate
from lodger.substrates.codemode.tool import run_cell
from lodger.tools import Tool
from lodger.tools.spec import NestedResult


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class NoTools:
    def callable_tools(self) -> list[Tool]:
        return []

    def tool(self, name: str) -> Tool | None:
        return None

    def bound_names(self) -> list[str]:
        return []

    async def call(self, name: str, arguments: dict[str, Any]) -> NestedResult:
        raise AssertionError("no tools")


async def cold_start(
    substrate: CellSubstrate, source: str, bare: Callable[[], Any], n: int
) -> dict[str, float]:
    limits = CellLimits()
    cells: list[float] = []
    floors: list[float] = []
    for i in range(n + 3):
        start = time.perf_counter()
        outcome = await run_cell(substrate, source, CellHost(NoTools(), limits), limits)
        cell = time.perf_counter() - start
        assert outcome.value == 1, outcome
        start = time.perf_counter()
        await bare()
        floor = time.perf_counter() - start
        if i >= 3:  # warm-up: library load, worker spawn
            cells.append(cell * 1000)
            floors.append(floor * 1000)
    return {
        "p50_ms": round(pct(cells, 0.5), 3),
        "p99_ms": round(pct(cells, 0.99), 3),
        "bare_p50_ms": round(pct(floors, 0.5), 3),
        "ratio_p50": round(pct(cells, 0.5) / pct(floors, 0.5), 2),
    }


async def bare_v8() -> None:
    with mini_racer(asyncio.get_running_loop()) as mr:
        assert mr.eval("1") == 1


# ---------------------------------------------------------------- nested overhead


@tool(nestable=True)
async def noop(data: str) -> str:
    """Do nothing."""
    return "x" * 180


def agent_for(
    root: Path, model: Callable[[ModelRequest], ModelResponse], tools: list[Tool], **kw: Any
) -> Agent:
    root.mkdir(parents=True, exist_ok=True)
    return Agent(
        model=FunctionModel(model),
        tools=tools,
        storage=Storage(
            log=EventLog(SqliteLogStore(root / "state")), artifacts=MemoryArtifactStore()
        ),
        workspace=root,
        **kw,
    )


async def nested_overhead(root: Path, k: int) -> dict[str, float]:
    arg = json.dumps({"data": "y" * 180})

    def top_level(request: ModelRequest) -> ModelResponse:
        done = sum(1 for m in request.messages if type(m).__name__ == "AssistantMessage")
        if done >= k:
            return ModelResponse(text="done")
        return ModelResponse(calls=(ProposedCall(call_id=f"c{done}", name="noop", arguments=arg),))

    cell = f"for (let i = 0; i < {k}; i++) await tools.noop({{data: '{'y' * 180}'}}); return 1;"
    empty = "return 1;"

    def one_cell(code: str) -> Callable[[ModelRequest], ModelResponse]:
        def model(request: ModelRequest) -> ModelResponse:
            if any(type(m).__name__ == "AssistantMessage" for m in request.messages):
                return ModelResponse(text="done")
            return ModelResponse(
                calls=(
                    ProposedCall(call_id="cell", name="exec", arguments=json.dumps({"code": code})),
                )
            )

        return model

    async def timed(agent: Agent) -> float:
        start = time.perf_counter()
        result = await agent.run("go")
        assert result.status == "completed", result
        elapsed = time.perf_counter() - start
        await agent.close()
        return elapsed

    limits = CellLimits(nested_calls=k, wall_time=600)
    top = await timed(agent_for(root / "top", top_level, [noop]))
    nested = await timed(
        agent_for(
            root / "nested",
            one_cell(cell),
            [noop],
            code_mode=CodeMode(language="javascript", limits=limits),
        )
    )
    base = await timed(
        agent_for(
            root / "empty",
            one_cell(empty),
            [noop],
            code_mode=CodeMode(language="javascript", limits=limits),
        )
    )
    per_top = top / k
    per_nested = max(nested - base, 0.0) / k
    return {
        "calls": k,
        "top_level_ms_per_call": round(per_top * 1000, 3),
        "nested_ms_per_call": round(per_nested * 1000, 3),
        "ratio": round(per_nested / per_top, 2),
    }


# ---------------------------------------------------------------- the package.json task

LATEST = {f"lib{i}": f"{2 + i % 3}.0.0" for i in range(12)}


def make_packages(root: Path, count: int = 20) -> dict[str, list[str]]:
    """``count`` package.json files; returns the expected outdated deps per package."""
    expected: dict[str, list[str]] = {}
    for p in range(count):
        deps = {f"lib{(p + j) % 12}": f"{1 + (p + j) % 3}.{j}.0" for j in range(6)}
        folder = root / f"packages/pkg{p:02}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "package.json").write_text(
            json.dumps(
                {
                    "name": f"pkg{p:02}",
                    "version": "1.0.0",
                    "description": "x" * 120,
                    "scripts": {"build": "tsc -p .", "test": "vitest run"},
                    "dependencies": deps,
                },
                indent=2,
            )
        )
        expected[f"pkg{p:02}"] = sorted(
            d for d, v in deps.items() if int(v.split(".")[0]) < int(LATEST[d].split(".")[0])
        )
    return expected


def tokens(request: ModelRequest) -> int:
    body = json.dumps(
        {
            "system": request.system,
            "tools": [t.parameters | {"n": t.name, "d": t.description} for t in request.tools],
            "messages": [repr(m) for m in request.messages],
        }
    )
    return len(body) // 4


_LINE = re.compile(r"^\s*\d+\t", re.M)


def outdated_of(texts: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for text in texts:
        data = json.loads(_LINE.sub("", text))
        out[data["name"]] = sorted(
            d
            for d, v in data["dependencies"].items()
            if int(v.split(".")[0]) < int(LATEST[d].split(".")[0])
        )
    return out


CELL_TASK = """
const table = TABLE;
const listing = await tools.list_files({pattern: 'packages/*/package.json'});
const paths = listing.split('\\n').filter((p) => p.endsWith('package.json'));
const texts = await Promise.all(paths.map((path) => tools.read_file({path})));
const major = (v) => parseInt(v.split('.')[0], 10);
const report = {};
for (const text of texts) {
  const pkg = JSON.parse(text.replace(/^\\s*\\d+\\t/gm, ''));
  report[pkg.name] = Object.entries(pkg.dependencies)
    .filter(([d, v]) => major(v) < major(table[d])).map(([d]) => d).sort();
}
return report;
""".replace("TABLE", json.dumps(LATEST))


async def package_task(root: Path, mode: str) -> dict[str, Any]:
    expected = make_packages(root / "ws")
    requests: list[ModelRequest] = []
    answer: dict[str, Any] = {}

    def direct(request: ModelRequest) -> ModelResponse:
        requests.append(request)
        results = [m for m in request.messages if type(m).__name__ == "ToolResultMessage"]
        step = sum(1 for m in request.messages if type(m).__name__ == "AssistantMessage")
        if step == 0:
            args = json.dumps({"pattern": "packages/*/package.json"})
            return ModelResponse(
                calls=(ProposedCall(call_id="ls", name="list_files", arguments=args),)
            )
        if step == 1:
            paths = [p for p in results[-1].content.splitlines() if p.endswith("package.json")]
            return ModelResponse(
                calls=tuple(
                    ProposedCall(
                        call_id=f"r{i}", name="read_file", arguments=json.dumps({"path": p})
                    )
                    for i, p in enumerate(paths)
                )
            )
        answer.update(outdated_of([m.content for m in results[1:]]))
        return ModelResponse(text=json.dumps(answer))

    def cell(request: ModelRequest) -> ModelResponse:
        requests.append(request)
        results = [m for m in request.messages if type(m).__name__ == "ToolResultMessage"]
        if not results:
            code = json.dumps({"code": CELL_TASK})
            return ModelResponse(calls=(ProposedCall(call_id="cell", name="exec", arguments=code),))
        answer.update(json.loads(results[-1].content)["result"])
        return ModelResponse(text=json.dumps(answer))

    tools = [t for t in workspace_tools() if t.name in ("list_files", "read_file")]
    agent = Agent(
        model=FunctionModel(direct if mode == "direct" else cell),
        tools=tools,
        storage=Storage(
            log=EventLog(SqliteLogStore(root / "state")), artifacts=MemoryArtifactStore()
        ),
        workspace=root / "ws",
        code_mode="javascript" if mode == "cell" else None,
    )
    start = time.perf_counter()
    result = await agent.run("report the outdated dependencies of every package")
    elapsed = time.perf_counter() - start
    await agent.close()
    assert result.status == "completed", result
    assert answer == expected, (answer, expected)
    return {
        "round_trips": len(requests),
        "tokens_sent": sum(tokens(r) for r in requests),
        "seconds": round(elapsed, 3),
    }


async def main(quick: bool) -> dict[str, Any]:
    n = 30 if quick else 200
    k = 16 if quick else 32
    figures: dict[str, Any] = {}
    figures["v8_cold_start"] = await cold_start(JavaScriptSubstrate(), "return 1;", bare_v8, n)
    python = PythonSubstrate()
    async with monty.AsyncMonty(min_processes=1, max_processes=2) as pool:

        async def bare_monty() -> None:
            async with pool.checkout() as session:
                assert await session.feed_run("1") == 1

        figures["python_cold_start"] = await cold_start(python, "1", bare_monty, n)
    await python.aclose()
    with tempfile.TemporaryDirectory() as tmp:
        figures["nested_overhead"] = await nested_overhead(Path(tmp) / "o", k)
        direct = await package_task(Path(tmp) / "direct", "direct")
        cell = await package_task(Path(tmp) / "cell", "cell")
    figures["package_task"] = {
        "direct": direct,
        "cell": cell,
        "round_trips_saved": direct["round_trips"] - cell["round_trips"],
        "tokens_ratio": round(cell["tokens_sent"] / direct["tokens_sent"], 3),
    }
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    options = parser.parse_args()
    result = asyncio.run(main(options.quick))
    v8, py = result["v8_cold_start"], result["python_cold_start"]
    print(
        f"V8 cell cold start:     p50 {v8['p50_ms']} ms, p99 {v8['p99_ms']} ms "
        f"({v8['ratio_p50']}x a bare context + eval at {v8['bare_p50_ms']} ms; target p50 <= 5 ms)"
    )
    print(
        f"Python cell cold start: p50 {py['p50_ms']} ms, p99 {py['p99_ms']} ms "
        f"({py['ratio_p50']}x a bare Monty checkout + feed at {py['bare_p50_ms']} ms)"
    )
    o = result["nested_overhead"]
    print(
        f"nested call: {o['nested_ms_per_call']} ms vs top-level {o['top_level_ms_per_call']} ms "
        f"per durable call = {o['ratio']}x (target <= 1.5x)"
    )
    t = result["package_task"]
    print(
        f"package.json task: direct {t['direct']['round_trips']} round trips, "
        f"{t['direct']['tokens_sent']} tokens; one cell {t['cell']['round_trips']} round trips, "
        f"{t['cell']['tokens_sent']} tokens ({t['tokens_ratio']}x the tokens)"
    )
    print(json.dumps(result))
    sys.exit(0)

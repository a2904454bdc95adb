"""Compaction on a long session: tokens sent, the budget kept, a step-5 fact at step 200.

A scripted session of 200 steps: a ``FunctionModel`` that reads its request calls
``fetch_page(n)`` for pages 1..200, each ~2,000 tokens (~400k tokens of tool output in
all); page 5 holds the vault code. At step 200 the model must answer with it, reading it
from its request (a tool result, or a compaction's summary) or, when it is in neither,
calling ``recall``. The model decides every step from what its request holds (the highest
``page N of 200`` it can see), never from a counter of its own, so a compaction that loses
the progress shows up as repeated pages.

Runs, each on real SQLite storage:

- ``baseline``: no compaction, no context budget: every request holds everything so far
  (the baseline of the token ratio, measured in the same run);
- ``compaction``: ``CompactionPolicy(budget_tokens=32k)`` (the summarizer keeps the facts
  it sees); every request must fit the budget, the answer must be the baseline's;
- two policies on copy-free forks of one prefix (the first 12 steps, run once with no
  compaction; ``Sessions.fork`` shares its events): ``keep_facts`` (the summary carries the
  facts) and ``terse`` (the summary keeps only the sections; the fact comes back through
  ``recall``), each continued to step 200; and ``late_start``, a fork of a 60-step prefix
  (far over the budget when it is first compacted: the summarizer reads the context
  elided to the budget, so page 5 is not in what it summarizes and comes back by ``recall``);
- ``elision only``: ``Limits(context_budget=32k)`` and no compaction: the oldest results
  are left out, nothing is summarized;
- ``compact_100k``: one manual compaction of a 100k-event session (``bench/cli_scale.py``'s
  shapes) whose summary model answers at once: the time lodger spends besides the model
  call, against ``log.verify`` of the same session (the baseline: reading and checking every
  record); ``log.verify`` is run before and after.

Tokens are lodger's estimate (``lodger.context.estimate_tokens``: about four characters a
token) of each request's system prompt and messages, counted by the model function.

    python bench/compaction.py [--quick] [--rounds 3]

``--quick`` runs 60 steps with 120-token pages and a 10k-event session (a smoke run).
Numbers come from a shared, loaded 2-core machine: compare ratios within one run. The
last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lodger import (
    Agent,
    CompactionPolicy,
    FunctionModel,
    Limits,
    ModelRequest,
    ModelResponse,
    ToolResultMessage,
    tool,
    tool_call,
)
from lodger.context import estimate_tokens
from lodger.engine.compaction import DEFAULT_SECTIONS
from lodger.events import Compacted, Event
from lodger.providers.base import AssistantMessage, UserMessage
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks

BIG = "s-100k"
STEPS = 200
PAGE_TOKENS = 2_000
BUDGET = 32_000
FACT_PAGE = 5
CODE = "4417-ALPHA"
TOKEN_TARGET = 0.80  # at least 80% fewer tokens sent than without compaction
COMPACT_TARGET_S = 1.0  # lodger's time to compact a 100k-event session, model call aside
TASK = (
    "Read every page with fetch_page, from page 1 to the last, one call per step. "
    "Then answer: what is the vault code?"
)
_PAGE = re.compile(r"page (\d+) of (\d+)")
_CODE = re.compile(r"vault code is ([0-9]{4}-[A-Z]+)")
_FILLER = (
    "the ledger shows routine entries for the quarter with no exceptions noted and the "
    "reconciliation of accounts proceeds as planned across every region"
)
_WORDS = tuple(_FILLER.split())


@dataclass(frozen=True)
class Shape:
    steps: int
    page_tokens: int
    budget: int
    big_session: int


FULL = Shape(steps=STEPS, page_tokens=PAGE_TOKENS, budget=BUDGET, big_session=100_000)
QUICK = Shape(steps=60, page_tokens=120, budget=2_000, big_session=10_000)


def page_text(n: int, total: int, tokens: int) -> str:
    """Page ``n``: filler of about ``tokens`` tokens, its number, and on page 5 the fact."""
    words: list[str] = []
    size = 0
    i = n
    while size < tokens * 4:
        word = _WORDS[i % len(_WORDS)]
        words.append(word)
        size += len(word) + 1
        i += 7
    head = f"page {n} of {total}."
    fact = f" FACT: the vault code is {CODE}." if n == FACT_PAGE else ""
    return f"{head}{fact} {' '.join(words)}"


def pages_tool(shape: Shape) -> Any:
    @tool(recovery="idempotent")
    def fetch_page(n: int) -> str:
        """Fetch page n of the report."""
        return page_text(n, shape.steps, shape.page_tokens)

    return fetch_page


def request_text(request: ModelRequest) -> str:
    parts = [request.system]
    for m in request.messages:
        if isinstance(m, UserMessage):
            parts.append(m.text)
        elif isinstance(m, AssistantMessage):
            parts.append(m.text)
            parts += [c.arguments for c in m.calls]
        else:
            parts.append(m.content)
    return "\n".join(parts)


def request_tokens(request: ModelRequest) -> int:
    return estimate_tokens(request.messages) + len(request.system) // 4


@dataclass
class Meter:
    """What the model functions saw: tokens per request, by who asked."""

    worker: list[int] = field(default_factory=list)
    summaries: list[int] = field(default_factory=list)
    asked: set[int] = field(default_factory=set)
    recalls: int = 0
    repeated_pages: int = 0
    summary_s: float = 0.0

    def figures(self) -> dict[str, Any]:
        sent = sum(self.worker) + sum(self.summaries)
        return {
            "requests": len(self.worker),
            "max_request_tokens": max(self.worker, default=0),
            "worker_tokens": sum(self.worker),
            "summary_requests": len(self.summaries),
            "summary_tokens": sum(self.summaries),
            "total_tokens": sent,
            "recalls": self.recalls,
            "repeated_pages": self.repeated_pages,
        }


def is_summary_request(request: ModelRequest) -> bool:
    """A compaction asks with no tools and its own system prompt; the worker always has
    ``fetch_page``."""
    return not any(t.name == "fetch_page" for t in request.tools)


def worker_step(request: ModelRequest, shape: Shape, meter: Meter) -> ModelResponse:
    """The next call from what the request shows: the next page, or at the end the
    answer (from the text, or through ``recall`` once)."""
    meter.worker.append(request_tokens(request))
    text = request_text(request)
    seen = [int(m[1]) for m in _PAGE.finditer(text) if int(m[2]) == shape.steps]
    last = max(seen, default=0)
    results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
    if last < shape.steps:
        if last + 1 in meter.asked:  # the progress was lost: a page fetched again
            meter.repeated_pages += 1
        meter.asked.add(last + 1)
        return ModelResponse(calls=(tool_call("fetch_page", n=last + 1),))
    found = _CODE.search(text)
    if found is not None:
        return ModelResponse(text=f"the vault code is {found[1]}")
    can_recall = any(t.name == "recall" for t in request.tools)
    recalled = any(m.name == "recall" for m in results)
    if can_recall and not recalled:
        meter.recalls += 1
        return ModelResponse(calls=(tool_call("recall", query="vault code"),))
    return ModelResponse(text="the vault code is unknown")


def summarizer(request: ModelRequest, *, keep_facts: bool, shape: Shape) -> str:
    """A summary with every required section, naming the progress (the highest page
    seen) and, when ``keep_facts``, every ``FACT:`` line it was shown."""
    text = request_text(request)
    seen = [int(m[1]) for m in _PAGE.finditer(text) if int(m[2]) == shape.steps]
    last = max(seen, default=0)
    facts = sorted(set(re.findall(r"FACT: [^.]*\.", text))) if keep_facts else []
    decisions = "\n".join(f"- {f}" for f in facts) or "- none"
    return (
        "## Goal\nRead every page, then give the vault code.\n"
        f"## Progress\nRead up to page {last} of {shape.steps}.\n"
        f"## Decisions\n{decisions}\n"
        "## Files touched\n- none\n"
        "## Open questions\n- none\n"
        f"## Next step\nfetch_page(n={last + 1})\n"
    )


def make_model(shape: Shape, meter: Meter, *, keep_facts: bool = True) -> FunctionModel:
    def model(request: ModelRequest) -> ModelResponse | str:
        if is_summary_request(request):
            t0 = time.perf_counter()
            meter.summaries.append(request_tokens(request))
            out = summarizer(request, keep_facts=keep_facts, shape=shape)
            meter.summary_s += time.perf_counter() - t0
            return out
        return worker_step(request, shape, meter)

    return FunctionModel(model, name="pages")


def limits(shape: Shape, *, elide: bool = False, max_steps: int | None = None) -> Limits:
    steps = max_steps if max_steps is not None else shape.steps + 10
    return Limits(max_steps=steps, context_budget=shape.budget if elide else None)


def policy(shape: Shape) -> CompactionPolicy:
    """Compact at a step boundary when the next request would not fit the budget, and
    before a turn above three quarters of it; as often as a 200-step turn needs."""
    return CompactionPolicy(
        budget_tokens=shape.budget, threshold_tokens=shape.budget * 3 // 4, max_per_turn=100
    )


@dataclass(frozen=True, kw_only=True)
class Run:
    """One turn of the task: how it is compacted (or elided, or neither)."""

    compaction: CompactionPolicy | None = None
    keep_facts: bool = True
    elide: bool = False
    max_steps: int | None = None


async def run_turn(storage: Storage, session: str, shape: Shape, run: Run) -> dict[str, Any]:
    """One turn of the task on ``session``: the meter's figures, the answer, the
    compactions the turn made and the log verified after it."""
    meter = Meter()
    agent = Agent(
        model=make_model(shape, meter, keep_facts=run.keep_facts),
        tools=[pages_tool(shape)],
        storage=storage,
        limits=limits(shape, elide=run.elide, max_steps=run.max_steps),
        compaction=run.compaction,
    )
    t0 = time.perf_counter()
    async with agent:
        result = await agent.run(TASK, session=session)
    elapsed = time.perf_counter() - t0
    verified = await storage.log.verify(session)
    events = await storage.log.read_all(session)
    answer = result.output if isinstance(result.output, str) else str(result.output)
    return {
        **meter.figures(),
        "under_budget": max(meter.worker, default=0) <= shape.budget,
        "answer": answer,
        "status": result.status,
        "fact_survived": CODE in answer,
        # where the answer came from: the newest summary carried it, or recall fetched it
        "fact_in_summary": _in_newest_summary(events),
        "compactions": sum(1 for e in events if e.kind == "compacted"),
        "compaction_failures": sum(1 for e in events if e.kind == "compaction_failed"),
        "events": verified.high_water,
        "seconds": round(elapsed, 3),
        "lodger_seconds": round(elapsed - meter.summary_s, 3),
    }


def _in_newest_summary(events: Sequence[Event]) -> bool:
    summaries = [e.body.summary for e in events if isinstance(e.body, Compacted)]
    return bool(summaries) and CODE in summaries[-1]


async def run_session(state: Path, shape: Shape, run: Run) -> dict[str, Any]:
    """The task as one turn of a new session on a fresh state directory."""
    storage = Storage.local(state)
    try:
        return await run_turn(storage, "s", shape, run)
    finally:
        await storage.close()


async def compare_policies(state: Path, shape: Shape) -> dict[str, Any]:
    """A prefix of the task run once without compaction (12 steps: it fits the budget),
    forked twice (copy-free), and each fork continued to the end under its own policy:
    ``keep_facts`` (the summary carries what the pages said) and ``terse`` (it does not:
    the fact must come back through ``recall``). And ``late_start``: a fork of a longer
    prefix (30% of the steps, far over the budget before its first compaction), under
    ``keep_facts``: the summarizer reads the context elided to the budget, so what it
    can carry is only what still fits."""
    storage = Storage.local(state)
    try:
        short = shape.budget * 3 // 4 // shape.page_tokens
        long = shape.steps * 3 // 10
        sessions = Sessions(storage)
        out: dict[str, Any] = {"prefix_steps": short, "late_prefix_steps": long}
        for prefix, steps in (("prefix", short), ("late-prefix", long)):
            made = await run_turn(storage, prefix, shape, Run(max_steps=steps))
            out[f"{prefix.replace('-', '_')}_events"] = made["events"]
        forks = (("keep_facts", "prefix", True), ("terse", "prefix", False))
        for name, prefix, keep in (*forks, ("late_start", "late-prefix", True)):
            fork = await sessions.fork(prefix, session=f"fork-{name}")
            run = Run(compaction=policy(shape), keep_facts=keep)
            out[name] = await run_turn(storage, fork.session_id, shape, run)
            out[name]["shares_events"] = fork.parent.high_water
        return out
    finally:
        await storage.close()


async def build_big(state: Path, total: int) -> int:
    """A session of about ``total`` events in the shapes of ``bench/cli_scale.py``, cut
    at the end of a turn (``bench/resume_scale.py``'s history)."""
    from resume_scale import build, history

    workspace = state.parent / "big-workspace"
    workspace.mkdir(exist_ok=True)
    return await build(state, BIG, history(total, workspace, interrupted=False))


async def verify_seconds(state: Path, session: str) -> float:
    storage = Storage.local(state)
    try:
        t0 = time.perf_counter()
        await storage.log.verify(session)
        return time.perf_counter() - t0
    finally:
        await storage.close()


def _instant_summary(calls: list[float]) -> FunctionModel:
    """A summary model that answers at once (its own time is measured and left out)."""
    text = "\n".join(f"## {name}\n- the bench session" for name in DEFAULT_SECTIONS)

    def summarize(request: ModelRequest) -> str:
        t0 = time.perf_counter()
        calls.append(time.perf_counter() - t0)
        return text

    return FunctionModel(summarize, name="instant")


async def compact_big(state: Path) -> dict[str, float]:
    """One manual compaction of the big session, on a fresh copy: ``cold`` from a new
    ``Sessions`` (its open reads, verifies and folds the log), ``warm`` with the fold
    already open (the compaction alone: projecting, the summary request, the fact);
    the model's own time left out of both."""
    model_s: list[float] = []
    binding = Binding(model=_instant_summary(model_s))
    out: dict[str, float] = {}
    for phase in ("cold", "warm"):
        copy = state.parent / f"big-{phase}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(state, copy)
        async with Sessions(Storage.local(copy)) as sessions:
            if phase == "warm":
                t0 = time.perf_counter()
                await sessions.state(BIG)
                out["open_s"] = time.perf_counter() - t0
            model_s.clear()
            t0 = time.perf_counter()
            made = await sessions.compact(BIG, binding=binding)
            out[phase] = time.perf_counter() - t0 - sum(model_s)
            out[f"{phase}_tokens_before"] = made.tokens_before
        out[f"{phase}_verify_after_s"] = await verify_seconds(copy, BIG)
        shutil.rmtree(copy, ignore_errors=True)
    return out


def median_spread(values: Sequence[float]) -> list[float]:
    """The median and the spread (max - min), rounded."""
    return [round(statistics.median(values), 4), round(max(values) - min(values), 4)]


def _print_run(name: str, r: dict[str, Any]) -> None:
    print(
        f"{name:<18} requests {r['requests']:>4}  max {r['max_request_tokens']:>8,}  "
        f"total {r['total_tokens']:>12,}  compactions {r['compactions']:>3}  "
        f"recalls {r['recalls']}  fact {'kept' if r['fact_survived'] else 'LOST'}"
        f"{' (in the summary)' if r['fact_in_summary'] else ''}  "
        f"answer {r['answer']!r}"
    )


def sessions_part(root: Path, shape: Shape) -> dict[str, Any]:
    """The 200-step task: baseline, elision only, compaction, and the two policies."""
    base = asyncio.run(run_session(root / "baseline", shape, Run()))
    elided = asyncio.run(run_session(root / "elision", shape, Run(elide=True)))
    compacted = asyncio.run(run_session(root / "compaction", shape, Run(compaction=policy(shape))))
    forks = asyncio.run(compare_policies(root / "forks", shape))
    for name, r in (("baseline", base), ("elision only", elided), ("compaction", compacted)):
        _print_run(name, r)
    for name in ("keep_facts", "terse", "late_start"):
        _print_run(f"fork {name}", forks[name])
    fewer = 1 - compacted["total_tokens"] / base["total_tokens"]
    print(
        f"compaction sends {fewer:.1%} fewer tokens than the baseline (target >= "
        f"{TOKEN_TARGET:.0%}); every request under {shape.budget:,}: {compacted['under_budget']}; "
        f"same answer: {compacted['answer'] == base['answer']}"
    )
    return {
        "baseline": base,
        "elision_only": elided,
        "compaction": compacted,
        "policies_on_forks": forks,
        "tokens_fewer_ratio": round(fewer, 4),
        "same_answer": compacted["answer"] == base["answer"],
    }


def big_part(root: Path, shape: Shape, rounds: int) -> dict[str, Any]:
    """Compacting a long session: lodger's time against ``log.verify`` of the same log."""
    events = asyncio.run(build_big(root / "big", shape.big_session))
    verify = [asyncio.run(verify_seconds(root / "big", BIG)) for _ in range(rounds)]
    runs = [asyncio.run(compact_big(root / "big")) for _ in range(rounds)]
    cold = median_spread([r["cold"] for r in runs])
    warm = median_spread([r["warm"] for r in runs])
    opened = median_spread([r["open_s"] for r in runs])
    print(
        f"compact {events:,} events: cold {cold[0]:.3f} s (spread {cold[1]:.3f}), warm "
        f"{warm[0]:.3f} s (spread {warm[1]:.3f}), opening it {opened[0]:.3f} s; "
        f"log.verify {median_spread(verify)[0]:.3f} s "
        f"(target <= {COMPACT_TARGET_S} s besides the model call)"
    )
    return {
        "big_session_events": events,
        "verify_before_s": median_spread(verify),
        "verify_after_s": median_spread([r["cold_verify_after_s"] for r in runs]),
        "compact_cold_s": cold,
        "compact_warm_s": warm,
        "open_session_s": opened,
        "compact_cold_over_verify": round(cold[0] / statistics.median(verify), 3),
        "compact_warm_over_verify": round(warm[0] / statistics.median(verify), 3),
        "compact_tokens_before": runs[0]["cold_tokens_before"],
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--rounds", type=int, default=3, help="repeats of the timed parts")
    args = parser.parse_args(argv)
    shape = QUICK if args.quick else FULL
    figures: dict[str, Any] = {"bench": "compaction", "steps": shape.steps, "budget": shape.budget}
    with tempfile.TemporaryDirectory(prefix="lodger-bench-compaction-") as tmp:
        root = Path(tmp)
        figures.update(sessions_part(root, shape))
        figures.update(big_part(root, shape, args.rounds))
    figures["load_average"] = list(os.getloadavg())
    print(json.dumps(figures, sort_keys=True))
    return figures


if __name__ == "__main__":
    main()

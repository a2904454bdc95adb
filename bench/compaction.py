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
- two policies on copy-free forks of one prefix (the first 60 steps, run once with no
  compaction; ``Sessions.fork`` shares its events): ``keep_facts`` (the summary carries the
  facts) and ``terse`` (the summary keeps only the sections; the fact comes back through
  ``recall``), each continued to step 200;
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
    FunctionModel,
    Limits,
    ModelRequest,
    ModelResponse,
    ToolResultMessage,
    tool,
    tool_call,
)
from lodger.context import estimate_tokens
from lodger.providers.base import AssistantMessage, UserMessage
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


def limits(shape: Shape, *, elide: bool = False) -> Limits:
    return Limits(max_steps=shape.steps + 10, context_budget=shape.budget if elide else None)


async def run_session(
    state: Path,
    shape: Shape,
    *,
    compaction: Any = None,
    keep_facts: bool = True,
    elide: bool = False,
) -> dict[str, Any]:
    """One turn of the whole task on a fresh state directory: the meter's figures, the
    answer and the log's verification."""
    meter = Meter()
    storage = Storage.local(state)
    options: dict[str, Any] = {} if compaction is None else {"compaction": compaction}
    agent = Agent(
        model=make_model(shape, meter, keep_facts=keep_facts),
        tools=[pages_tool(shape)],
        storage=storage,
        limits=limits(shape, elide=elide),
        **options,
    )
    t0 = time.perf_counter()
    async with agent:
        result = await agent.run(TASK, session="s")
        elapsed = time.perf_counter() - t0
        verified = await storage.log.verify("s")
        events = await storage.log.read_all("s")
    await storage.close()
    return {
        **meter.figures(),
        "answer": result.output if isinstance(result.output, str) else str(result.output),
        "status": result.status,
        "fact_survived": CODE in str(result.output),
        "compactions": sum(1 for e in events if e.kind == "compacted"),
        "compaction_failures": sum(1 for e in events if e.kind == "compaction_failed"),
        "events": verified.high_water,
        "verified": True,
        "seconds": round(elapsed, 3),
    }


async def build_big(state: Path, total: int) -> int:
    """A session of about ``total`` events in the shapes of ``bench/cli_scale.py``."""
    from cli_scale import session_drafts
    from resume_scale import build

    return await build(state, BIG, session_drafts(total, 8))


async def verify_seconds(state: Path, session: str) -> float:
    storage = Storage.local(state)
    try:
        t0 = time.perf_counter()
        await storage.log.verify(session)
        return time.perf_counter() - t0
    finally:
        await storage.close()


def median_spread(values: Sequence[float]) -> tuple[float, float]:
    return statistics.median(values), max(values) - min(values)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--rounds", type=int, default=3, help="repeats of the timed parts")
    args = parser.parse_args(argv)
    shape = QUICK if args.quick else FULL
    figures: dict[str, Any] = {"bench": "compaction", "steps": shape.steps}
    with tempfile.TemporaryDirectory(prefix="lodger-bench-compaction-") as tmp:
        root = Path(tmp)
        base = asyncio.run(run_session(root / "baseline", shape))
        print(f"baseline    {json.dumps(base)}")
        figures["baseline"] = base
        elided = asyncio.run(run_session(root / "elision", shape, elide=True))
        print(f"elision     {json.dumps(elided)}")
        figures["elision_only"] = elided
        events = asyncio.run(build_big(root / "big", shape.big_session))
        verify = [asyncio.run(verify_seconds(root / "big", BIG)) for _ in range(args.rounds)]
        figures["big_session_events"] = events
        figures["verify_s"] = median_spread(verify)
        print(f"verify {events} events: median {figures['verify_s'][0]:.3f} s")
    figures["load_average"] = list(os.getloadavg())
    print(json.dumps(figures, sort_keys=True))
    return figures


if __name__ == "__main__":
    sys.exit(0 if main() else 1)

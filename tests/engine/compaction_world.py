"""The world of the compaction tests: a long scripted session and its summarizers.

A worker model reads pages (``fetch``, about ``PAGE_CHARS`` characters each) for
``steps`` steps; the page of step 5 holds a fact (``SECRET``) the final answer needs.
At the end it answers with the secret if its context holds it (in a summary or a
result), else it asks ``recall`` for it once and answers from that.

Summarizers (the same FunctionModel, told apart by the summary prompt):
``good`` writes every required section and carries each "secret code is ..." line it
reads (a chain of compactions keeps it); ``forgetful`` writes the sections and no
facts; ``bad`` leaves out a section; ``block`` (the crash test) writes a marker file
and sleeps until killed.

Run as a script (``python compaction_world.py STATE MODE``) it drives one turn in a
child process: ``MODE`` ``crash`` turns the summarizer into ``block`` once the log
holds one compaction, so the parent SIGKILLs the child during the second summary.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lodger import Agent, FunctionModel, tool
from lodger.context import estimate_tokens
from lodger.engine.compaction import DEFAULT_SECTIONS, CompactionPolicy, request_overhead
from lodger.engine.settings import Limits, Services
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage, UserMessage
from lodger.providers.scripted import tool_call
from lodger.storage import Storage

SECRET = "XYZ-4711"
PAGE_CHARS = 8000
_FACT = re.compile(r"secret code is [A-Z0-9-]+")


@tool(recovery="idempotent")
async def fetch(page: int) -> str:
    """Fetch one page of the corpus."""
    filler = (f"page {page} line. " * PAGE_CHARS)[:PAGE_CHARS]
    if page == 5:
        return (
            f"{filler[: PAGE_CHARS // 2]} the secret code is {SECRET}. {filler[: PAGE_CHARS // 2]}"
        )
    return filler[:PAGE_CHARS]


def _sections(facts: list[str], pages: int, *, skip: str | None = None) -> str:
    parts = []
    for name in DEFAULT_SECTIONS:
        if name == skip:
            continue
        if name == "Decisions" and facts:
            body = "- " + "\n- ".join(facts)
        elif name == "Progress":
            body = f"- pages read: {pages}"
        else:
            body = "- reading pages"
        parts.append(f"## {name}\n{body}")
    return "\n\n".join(parts)


def summary_of(request: ModelRequest, kind: str) -> str:
    """A summary of the transcript the summary request carries."""
    text = request.messages[-1].text if isinstance(request.messages[-1], UserMessage) else ""
    facts = sorted(set(_FACT.findall(text)))
    pages = max(
        [0]
        + [int(n) for n in re.findall(r'fetch\(\{"page": ?(\d+)\}\)', text)]
        + [int(n) for n in re.findall(r"pages read: (\d+)", text)]
    )
    if kind == "good":
        return _sections(facts, pages)
    if kind == "forgetful":
        return _sections([], pages)
    if kind == "bad":
        return _sections(facts, pages, skip="Next step")
    raise AssertionError(kind)


@dataclass
class World:
    """The model of one session: how it summarizes, and what every request held."""

    steps: int = 200
    summarizer: str = "good"
    #: (estimated tokens of the messages, of the whole request) of each worker request
    sizes: list[tuple[int, int]] = field(default_factory=list)
    #: the summary requests' transcripts
    transcripts: list[str] = field(default_factory=list)
    summaries: int = 0
    #: called with each summary request before it is answered (the crash test blocks)
    on_summary: Callable[[ModelRequest], None] | None = None
    #: raise a context-length error while a request's messages are estimated above this
    context_window: int | None = None

    def __call__(self, request: ModelRequest) -> ModelResponse | str:
        if request.system.startswith("You are compacting"):
            self.summaries += 1
            last = request.messages[-1]
            self.transcripts.append(last.text if isinstance(last, UserMessage) else "")
            if self.on_summary is not None:
                self.on_summary(request)
            return summary_of(request, self.summarizer)
        messages = estimate_tokens(request.messages)
        self.sizes.append((messages, messages + request_overhead(request.system, request.tools)))
        if self.context_window is not None and messages > self.context_window:
            from lodger.errors import ProviderError

            raise ProviderError(
                "HTTP 400: This model's maximum context length is 1000 tokens",
                retryable=False,
                status=400,
                code="context_length",
            )
        done = _pages_read(request)
        if done < self.steps:
            return ModelResponse(calls=(tool_call("fetch", page=done + 1),))
        return self._answer(request)

    def _answer(self, request: ModelRequest) -> ModelResponse | str:
        seen = "\n".join(_texts(request))
        if SECRET in seen:
            return f"the secret code is {SECRET}"
        recalled = [
            m for m in request.messages if isinstance(m, ToolResultMessage) and m.name == "recall"
        ]
        if recalled:
            return "the secret code is unknown"
        return ModelResponse(calls=(tool_call("recall", query="secret code"),))


def _texts(request: ModelRequest) -> list[str]:
    out: list[str] = []
    for m in request.messages:
        out.append(m.text if isinstance(m, UserMessage) else getattr(m, "content", "") or "")
        if not isinstance(m, UserMessage | ToolResultMessage):
            out.append(getattr(m, "text", ""))
    return out


def _pages_read(request: ModelRequest) -> int:
    """The highest page read so far, from the calls in the context or the summary."""
    best = 0
    for m in request.messages:
        for c in getattr(m, "calls", ()):
            if c.name == "fetch":
                best = max(best, json.loads(c.arguments)["page"])
        if isinstance(m, UserMessage) and m.source == "runtime":
            for found in re.findall(r"pages read: (\d+)", m.text):
                best = max(best, int(found))
    return best


def policy(**changes: object) -> CompactionPolicy:
    base: dict[str, object] = {
        "threshold_tokens": 24_000,
        "budget_tokens": 32_000,
        "max_per_turn": 100,
        "instructions": "say how many pages were read",
    }
    base.update(changes)
    return CompactionPolicy(**base)  # type: ignore[arg-type]


def agent(
    storage: Storage | Path, world: World, compaction: CompactionPolicy | None = None
) -> Agent:
    return Agent(
        model=FunctionModel(world, name="world"),
        tools=[fetch],
        storage=storage,
        limits=Limits(max_steps=world.steps + 10),
        services=Services(clock=ManualClock(), ids=SequentialIds()),
        compaction=compaction if compaction is not None else policy(),
    )


async def _main(state: Path, mode: str) -> None:
    world = World(steps=60)
    marker = state.parent / "summarizing"

    def block(request: ModelRequest) -> None:
        if mode == "crash" and world.summaries >= 2:
            marker.write_text("now")
            time.sleep(600)  # the parent kills the process here

    world.on_summary = block
    async with agent(state, world, policy(threshold_tokens=6000, budget_tokens=9000)) as a:
        await a.run("read the pages", session="s")


if __name__ == "__main__":
    asyncio.run(_main(Path(sys.argv[1]), sys.argv[2]))

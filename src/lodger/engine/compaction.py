"""Compaction: a summary of the log's prefix, recorded as a fact the projection reads.

A compaction never rewrites a fact. ``compact`` asks a model to summarize the current
projection of the log (``lodger.context``), checks that the summary carries the
policy's required sections (retrying up to ``max_attempts``) and returns the body of one
fact: ``compacted`` (what it covers, the summary, what it dropped and pinned, the model
and the sha256 of the prompt that made it, the token estimates before and after) or
``compaction_failed`` (the step falls back to eliding old tool results). Appending it is
one atomic commit (``record_compaction``): a crash during the model call leaves the log
as it was, and the projection keeps using the last committed compaction.

>>> agent = Agent(model=model, compaction=CompactionPolicy(threshold_tokens=24_000,
...               budget_tokens=32_000))
>>> await agent.compact(session_id)          # by hand; the engine compacts on its own too

After a ``compacted`` fact the model sees: the system prompt, the pinned items (the
open turn's input, open todo items, files edited with their last hashes, approvals
still waiting), the newest summary, then every fact after ``covers.high_water``
(``lodger.context.project_messages``). A circuit breaker (``refusal``) keeps the
engine from compacting again and again: once a compaction of a stretch of the log
failed in a turn, the engine's triggers leave that stretch alone for the rest of the
turn, and a turn compacts at most ``max_per_turn`` times.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lodger.context import estimate_tokens, render_head
from lodger.engine.envelope import Envelope
from lodger.errors import (
    ConfigError,
    NextStep,
    ProviderError,
    SessionNotFoundError,
    UsageError,
)
from lodger.events import (
    Compacted,
    CompactionFailed,
    CompactionTrigger,
    Event,
    Prefix,
    Usage,
)
from lodger.providers.base import (
    AssistantMessage,
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ToolResultMessage,
    UserMessage,
)

if TYPE_CHECKING:
    from lodger.engine.journal import Journal
    from lodger.engine.state import SessionState

#: how a summary request is sent (the engine's: with its retries, none of them logged)
Ask = Callable[[Model, ModelRequest], Awaitable[ModelResponse]]

__all__ = [
    "DEFAULT_SECTIONS",
    "SUMMARY_PROMPT",
    "SUMMARY_PROMPT_SHA256",
    "Ask",
    "CompactionOutcome",
    "CompactionPolicy",
    "compact",
    "compact_and_record",
    "compact_by_hand",
    "compact_if_over",
    "elision_budget",
    "missing_sections",
    "record_compaction",
    "refusal",
    "request_overhead",
    "summary_request",
    "trigger_limit",
]

DEFAULT_SECTIONS: tuple[str, ...] = (
    "Goal",
    "Progress",
    "Decisions",
    "Files touched",
    "Open questions",
    "Next step",
)

SUMMARY_PROMPT = """\
You are compacting the history of a software agent's session so that the agent can go \
on working from your summary alone: everything before it is removed from the agent's \
context (it stays in the session's log, and the agent can fetch a fact back with the \
`recall` tool by offset, call id or search).

Write the summary in Markdown with exactly these sections, each a level-2 heading \
(`## Name`) followed by its content:
{sections}

Rules:
- Keep every fact the task still needs: names, paths, identifiers, numbers, values \
learned from tool results, error messages, and what the user asked for, verbatim where \
it matters.
- Say what is done and what is not; never claim work that the history does not show.
- Under "Files touched", list each file changed or created, with what changed.
- Under "Next step", say precisely what the agent was about to do.
- Be dense. Do not address the user; do not add sections."""

#: the sha256 of ``SUMMARY_PROMPT`` (a ``compacted`` fact names the prompt that made it)
SUMMARY_PROMPT_SHA256 = hashlib.sha256(SUMMARY_PROMPT.encode("utf-8")).hexdigest()

#: the characters of one tool result the summarizer reads (the rest is in the log)
_RESULT_CHARS = 20_000


@dataclass(frozen=True, kw_only=True)
class CompactionPolicy:
    """How and when a session's context is compacted.

    ``model``: the model that writes summaries, or its spec (the agent makes it and
    closes it with itself); None: the agent's own.
    ``threshold_tokens``: before a turn, a context estimated above it is compacted.
    ``budget_tokens``: a request must fit it; at a step boundary a context that would not
    is compacted (and, if that fails, the oldest tool results are elided to fit).
    ``required_sections``: headings a summary must carry, or it is retried
    (``max_attempts`` in all) and then given up on. ``instructions``: extra text for
    the summarizer. ``max_per_turn``: compactions the engine may make in one turn.
    """

    model: str | Model | None = None
    threshold_tokens: int | None = None
    budget_tokens: int | None = None
    required_sections: tuple[str, ...] = DEFAULT_SECTIONS
    max_attempts: int = 2
    instructions: str = ""
    max_per_turn: int = 20

    def __post_init__(self) -> None:
        object.__setattr__(self, "required_sections", tuple(self.required_sections))
        for name in ("threshold_tokens", "budget_tokens"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ConfigError(
                    f"compaction {name} must be a positive number of tokens, not {value!r}",
                    hint="leave it out to turn that trigger off",
                    code="compaction_policy",
                )
        if type(self.max_attempts) is not int or self.max_attempts < 1:
            raise ConfigError(
                f"compaction max_attempts must be at least 1, not {self.max_attempts!r}",
                code="compaction_policy",
            )
        if type(self.max_per_turn) is not int or self.max_per_turn < 0:
            raise ConfigError(
                f"compaction max_per_turn must be 0 or more, not {self.max_per_turn!r}",
                code="compaction_policy",
            )
        if not all(isinstance(s, str) and s.strip() for s in self.required_sections):
            raise ConfigError(
                "compaction required_sections must be non-empty names",
                code="compaction_policy",
            )

    def summarizer(self, default: Model) -> Model:
        """The model that writes summaries: ``model``, else ``default``."""
        if self.model is None:
            return default
        if isinstance(self.model, str):
            raise UsageError(
                f"the summary model {self.model!r} is named by its spec and was never made",
                hint="give the policy to an Agent (it makes the model), or pass a Model",
                code="compaction_policy",
            )
        return self.model


CompactionOutcome = Compacted | CompactionFailed


def missing_sections(summary: str, required: Sequence[str]) -> list[str]:
    """The required sections ``summary`` lacks: a section is a line that names it as a
    heading (``## Goal``, ``**Goal**``, ``Goal:``), case and markup aside."""
    found: set[str] = set()
    for line in summary.splitlines():
        head = re.sub(r"^[\s#*_>\-\d.]+", "", line).strip().strip("*_").strip()
        head = head.rstrip(":").strip().strip("*_").strip().casefold()
        if head:
            found.add(head)
    return [s for s in required if s.strip().casefold() not in found]


def _render(message: Message) -> str:
    if isinstance(message, UserMessage):
        who = "user" if message.source == "input" else "runtime"
        return f"[{who}] {message.text}"
    if isinstance(message, AssistantMessage):
        lines = [f"[assistant] {message.text}"] if message.text else []
        lines += [f"[call {c.call_id}] {c.name}({c.arguments})" for c in message.calls]
        return "\n".join(lines) or "[assistant]"
    assert isinstance(message, ToolResultMessage)
    content = message.content
    if len(content) > _RESULT_CHARS:
        cut = len(content) - _RESULT_CHARS
        content = f"{content[:_RESULT_CHARS]} ... ({cut} more characters; recall can fetch them)"
    flag = " error" if message.is_error else ""
    return f"[result {message.call_id}{flag}] {content}"


def summary_request(
    messages: Sequence[Message], policy: CompactionPolicy, instructions: str | None = None
) -> ModelRequest:
    """The request that asks for a summary of ``messages`` (the current projection)."""
    sections = "\n".join(f"## {s}" for s in policy.required_sections)
    extra = "\n\n".join(t for t in (policy.instructions, instructions or "") if t.strip())
    transcript = "\n\n".join(_render(m) for m in messages)
    text = f"The session so far:\n\n{transcript}\n\nWrite the summary now."
    if extra:
        text += f"\n\nAlso: {extra}"
    return ModelRequest(
        system=SUMMARY_PROMPT.format(sections=sections),
        messages=(UserMessage(text=text, source="runtime"),),
        tools=(),
    )


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _dropped(messages: Sequence[Message]) -> tuple[tuple[str, ...], int]:
    """The call ids of the results in ``messages`` and the UTF-8 bytes of them all."""
    calls: list[str] = []
    size = 0
    for m in messages:
        if isinstance(m, ToolResultMessage):
            calls.append(m.call_id)
            size += _utf8_len(m.content)
        elif isinstance(m, UserMessage):
            size += _utf8_len(m.text)
        else:
            size += _utf8_len(m.text) + sum(_utf8_len(c.name + c.arguments) for c in m.calls)
    return tuple(calls), size


async def compact(
    state: SessionState,
    model: Model,
    policy: CompactionPolicy,
    *,
    trigger: CompactionTrigger,
    instructions: str | None = None,
    ask: Ask | None = None,
) -> CompactionOutcome:
    """Summarize ``state``'s current projection with ``model``: the body of the fact to
    append (``compacted``, or ``compaction_failed`` after ``max_attempts`` summaries that
    lacked a required section or a provider that failed). Writes nothing."""
    covers = state.head
    # what the summarizer reads: the context as the model would see it, old results
    # elided where it would not fit the policy's budget
    projector = state.projector
    request = summary_request(
        projector.project(budget_tokens=policy.budget_tokens).messages, policy, instructions
    )
    reason = ""
    attempts = 0
    summary = ""
    spent: Usage | None = None
    for attempts in range(1, policy.max_attempts + 1):  # noqa: B007 - read after the loop
        try:
            response = (
                await ask(model, request) if ask is not None else await model.complete(request)
            )
        except ProviderError as exc:
            reason = f"the summary model failed: {exc.message}"
            continue
        spent = add_usage(spent, response.usage)
        summary = response.text.strip()
        missing = missing_sections(summary, policy.required_sections)
        if not summary:
            reason = "the summary was empty"
        elif missing:
            reason = "the summary lacks the required section(s): " + ", ".join(missing)
        else:
            return _compacted(state, covers, summary, model, trigger, spent)
    return CompactionFailed(
        covers=covers,
        trigger=trigger,
        attempts=attempts,
        reason=reason,
        fallback="elision",
        model=model.spec,
        usage=spent,
    )


def add_usage(total: Usage | None, more: Usage | None) -> Usage | None:
    """``total`` plus ``more`` (None: nothing reported), field by field."""
    if more is None:
        return total
    if total is None:
        return more
    return Usage(
        input_tokens=total.input_tokens + more.input_tokens,
        output_tokens=total.output_tokens + more.output_tokens,
        cache_read_tokens=total.cache_read_tokens + more.cache_read_tokens,
        cache_write_tokens=total.cache_write_tokens + more.cache_write_tokens,
    )


def _compacted(
    state: SessionState,
    covers: Prefix,
    summary: str,
    model: Model,
    trigger: CompactionTrigger,
    usage: Usage | None,
) -> Compacted:
    """The fact of a summary of the whole context as it stands (not only of the part the
    summarizer was shown whole: the dropped calls and counts are the context's)."""
    full = state.projector.project()
    messages = full.messages
    newest, fold = state.projector.compaction_state()
    pinned = fold.pinned()
    head = render_head(pinned, summary)
    before = full.estimated_tokens
    after = estimate_tokens((UserMessage(text=head, source="runtime"),))
    dropped, size = _dropped(messages)
    return Compacted(
        covers=covers,
        summary=summary,
        dropped_call_ids=dropped,
        dropped_bytes=size,
        dropped_tokens=max(before - after, 0),
        pinned=pinned.labels(),
        model=model.spec,
        prompt_sha256=SUMMARY_PROMPT_SHA256,
        tokens_before=before,
        tokens_after=after,
        trigger=trigger,
        # a fork's inherited compaction is its parent's fact, not one of this log's
        previous=newest.offset if newest and newest.session_id == state.session_id else None,
        usage=usage,
    )


def refusal(
    state: SessionState, policy: CompactionPolicy, trigger: CompactionTrigger
) -> str | None:
    """Why the engine must not compact now (the circuit breaker), or None.

    A ``manual`` compaction is refused only when nothing was appended since a failed
    one (the same prefix would fail the same way). The engine's triggers are refused,
    in a turn (counting the compactions just before it started), once a compaction of
    the same stretch of the log (since the newest ``compacted`` fact) failed, and after
    ``max_per_turn`` compactions or failures; the next turn may try again.
    """
    events = state.events
    if events and isinstance(events[-1].body, CompactionFailed):
        return "a compaction of this same prefix failed; nothing was appended since"
    if trigger == "manual":
        return None
    _, fold = state.projector.compaction_state()  # counted since the last turn ended
    if fold.failed:
        return "a compaction of this stretch of the log failed in this turn"
    if fold.made >= policy.max_per_turn:
        return f"this turn has compacted {fold.made} time(s), its limit"
    return None


async def record_compaction(journal: Journal, env: Envelope, outcome: CompactionOutcome) -> Event:
    """Append ``outcome`` as one fact (with whatever the journal deferred before it)."""
    return (await journal.record(journal.draft(outcome, env)))[-1]


def request_overhead(system: str, tools: Sequence[object]) -> int:
    """Tokens a request spends besides its messages: the system prompt and the tools'
    schemas (the same estimate as the messages', about four characters a token)."""
    chars = len(system)
    for schema in tools:
        name = getattr(schema, "name", "")
        description = getattr(schema, "description", "")
        parameters = getattr(schema, "parameters", {})
        chars += len(name) + len(description) + len(json.dumps(parameters, default=str))
    return chars // 4


async def compact_and_record(
    journal: Journal,
    env: Envelope,
    model: Model,
    policy: CompactionPolicy,
    *,
    trigger: CompactionTrigger,
    instructions: str | None = None,
    ask: Ask | None = None,
) -> CompactionOutcome:
    """``compact``, then its fact appended (one atomic commit)."""
    outcome = await compact(
        journal.state, model, policy, trigger=trigger, instructions=instructions, ask=ask
    )
    await record_compaction(journal, env, outcome)
    return outcome


def elision_budget(context_budget: int | None, policy: CompactionPolicy | None) -> int | None:
    """The budget old tool results are elided to: ``limits.context_budget``, else the
    compaction policy's (what a step falls back to when a compaction failed)."""
    if context_budget is None and policy is not None:
        return policy.budget_tokens
    return context_budget


def trigger_limit(policy: CompactionPolicy, trigger: CompactionTrigger) -> int | None:
    """The estimate above which ``trigger`` compacts (None: the trigger is off)."""
    if trigger == "threshold":
        return policy.threshold_tokens
    if trigger == "overflow":
        return policy.budget_tokens
    return 0  # context_error (the provider said it does not fit) and manual


async def compact_if_over(
    journal: Journal,
    env: Envelope,
    model: Model,
    policy: CompactionPolicy | None,
    *,
    trigger: CompactionTrigger,
    overhead: int = 0,
    ask: Ask | None = None,
) -> CompactionOutcome | None:
    """Compact when the context (plus ``overhead``, the system prompt and tools) is
    estimated above ``trigger``'s limit and the breaker allows it; None when nothing
    was done."""
    limit = trigger_limit(policy, trigger) if policy is not None else None
    if policy is None or limit is None:
        return None
    state = journal.state
    if not state.events:
        return None
    estimate = state.projector.project().estimated_tokens + overhead
    if estimate <= limit or refusal(state, policy, trigger) is not None:
        return None
    return await compact_and_record(journal, env, model, policy, trigger=trigger, ask=ask)


async def compact_by_hand(
    journal: Journal,
    model: Model,
    policy: CompactionPolicy,
    *,
    instructions: str | None = None,
    ask: Ask | None = None,
) -> Compacted:
    """A manual compaction of the session ``journal`` writes (the library's, the CLI's
    and the host's): refused while a run is open, raised as ``ProviderError``
    (``compaction_failed``) when no usable summary came, its ``compaction_failed`` fact
    committed first."""
    state = journal.state
    session_id = state.session_id
    if not state.events:
        raise SessionNotFoundError(f"no log for session {session_id!r}", session_id=session_id)
    if state.run_open:
        raise UsageError(
            f"session {session_id!r} has a run in progress (or one that was interrupted)",
            hint="compact it once the run has ended; an interrupted run is resumed or "
            "abandoned first",
            code="session_running",
            session_id=session_id,
            next_steps=(
                NextStep(action="resume", session_id=session_id),
                NextStep(action="abandon", session_id=session_id),
            ),
        )
    refused = refusal(state, policy, "manual")
    if refused is not None:
        raise UsageError(
            f"session {session_id!r} cannot be compacted now: {refused}",
            hint="run a turn first, or compact with other instructions after it",
            code="compaction_refused",
            session_id=session_id,
        )
    env = Envelope(turn_id=state.open_turn)
    outcome = await compact_and_record(
        journal, env, model, policy, trigger="manual", instructions=instructions, ask=ask
    )
    if isinstance(outcome, CompactionFailed):
        raise ProviderError(
            f"session {session_id!r} was not compacted: {outcome.reason} "
            f"({outcome.attempts} attempt(s))",
            retryable=False,
            code="compaction_failed",
            hint="the failure is recorded in the log; try another summary model or "
            "instructions, or leave the context to elision",
        )
    return outcome

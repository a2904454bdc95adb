"""Projections of the log for the model (DESIGN section 10). Pure functions of a prefix.

``project_messages`` turns committed events into the provider-neutral conversation:
user inputs, model outputs with their calls, and each call's result right after the
output that proposed it, in the order the model emitted the calls (the log may hold them
in completion order). Hidden events (nested code-mode calls) never reach the model;
calls without a committed outcome (dangling) are stripped, as are their results.
To fit a token budget, the oldest tool results are elided (the log keeps them whole).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lodger.events import (
    CallRejected,
    Event,
    ModelOutput,
    OperatorDecision,
    ProposedCall,
    RecoveryObserved,
    ToolResponded,
    TurnStarted,
)
from lodger.providers.base import AssistantMessage, Message, ToolResultMessage, UserMessage

__all__ = ["Projection", "estimate_tokens", "project_messages"]

ELIDED = "[result elided to fit the context budget: {n} characters; the full text is in the log]"


@dataclass(frozen=True, kw_only=True)
class Projection:
    messages: tuple[Message, ...]
    elided_call_ids: tuple[str, ...]
    estimated_tokens: int


def estimate_tokens(messages: Sequence[Message]) -> int:
    """A provider-neutral estimate (about four characters a token)."""
    chars = 0
    for m in messages:
        if isinstance(m, UserMessage):
            chars += len(m.text)
        elif isinstance(m, AssistantMessage):
            chars += len(m.text) + sum(len(c.arguments) + len(c.name) for c in m.calls)
        else:
            chars += len(m.content)
    return chars // 4 + 4 * len(messages)


@dataclass
class _Output:
    text: str
    reasoning: str
    calls: tuple[ProposedCall, ...]


def _results_by_call(events: Sequence[Event]) -> dict[str, ToolResultMessage]:
    names: dict[str, str] = {}
    results: dict[str, ToolResultMessage] = {}
    for e in events:
        body = e.body
        if isinstance(body, ModelOutput):
            for c in body.calls:
                names[c.call_id] = c.name
        if e.visibility != "model" or e.call_id is None:
            continue
        name = names.get(e.call_id, "")
        if isinstance(body, CallRejected):
            results[e.call_id] = ToolResultMessage(
                call_id=e.call_id, name=body.tool, content=body.message, is_error=True
            )
        elif isinstance(body, ToolResponded):
            results[e.call_id] = ToolResultMessage(
                call_id=e.call_id,
                name=name,
                content=body.content,
                is_error=body.status != "ok",
            )
        elif isinstance(body, RecoveryObserved | OperatorDecision):
            outcome = _recovered_result(body)
            if outcome is not None:
                results[e.call_id] = ToolResultMessage(
                    call_id=e.call_id, name=name, content=outcome[0], is_error=outcome[1]
                )
    return results


def _recovered_result(body: RecoveryObserved | OperatorDecision) -> tuple[str, bool] | None:
    """What recovery learned about an interrupted call, as the result the model sees."""
    if isinstance(body, OperatorDecision):
        if body.decision == "completed":
            return body.result or "the operator confirmed this call completed", False
        if body.decision == "not_applied":
            return "this call was interrupted and the operator confirmed it was not applied", True
        return None
    if body.status == "completed":
        return body.observation or "recovery confirmed this call completed", False
    if body.status == "not_applied":
        return (
            "this call was interrupted before its effect; recovery confirmed it was not applied"
            + (f" ({body.observation})" if body.observation else ""),
            True,
        )
    if body.status == "interrupted":
        return body.observation or "this call was interrupted; its outcome is unknown", True
    return None


def project_messages(
    events: Sequence[Event], *, budget_tokens: int | None = None, keep_recent: int = 1
) -> Projection:
    """The conversation for the next request, from the committed ``events``.

    With ``budget_tokens``, results of all but the ``keep_recent`` latest model outputs
    are elided oldest first until the estimate fits (or nothing older is left).
    """
    results = _results_by_call(events)
    outputs: list[tuple[int, _Output]] = []
    messages: list[Message] = []
    for e in events:
        if e.visibility != "model":
            continue
        body = e.body
        if isinstance(body, TurnStarted):
            messages.append(UserMessage(text=body.input))
        elif isinstance(body, ModelOutput):
            kept = tuple(c for c in body.calls if c.call_id in results)
            outputs.append((len(messages), _Output(body.text, body.reasoning, kept)))
            messages.append(AssistantMessage(text=body.text, reasoning=body.reasoning, calls=kept))
            messages.extend(results[c.call_id] for c in kept)

    elided: list[str] = []
    estimate = estimate_tokens(messages)
    if budget_tokens is not None and estimate > budget_tokens:
        older = outputs[:-keep_recent] if keep_recent > 0 else outputs
        for index, output in older:
            for offset, call in enumerate(output.calls, start=1):
                original = messages[index + offset]
                assert isinstance(original, ToolResultMessage)
                if len(original.content) <= len(ELIDED) + 20:
                    continue
                messages[index + offset] = ToolResultMessage(
                    call_id=original.call_id,
                    name=original.name,
                    content=ELIDED.format(n=len(original.content)),
                    is_error=original.is_error,
                )
                elided.append(call.call_id)
                estimate = estimate_tokens(messages)
                if estimate <= budget_tokens:
                    break
            if estimate <= budget_tokens:
                break
    return Projection(
        messages=tuple(messages), elided_call_ids=tuple(elided), estimated_tokens=estimate
    )

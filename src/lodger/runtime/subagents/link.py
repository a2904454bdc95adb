"""The parent link of a child session, and what a child's log says about its outcome.

A child session is a session of its own. Its first event, ``session_started``, records in
``metadata`` who started it and from where: the parent session, the parent's call id, the
parent's prefix ``(high_water, digest)`` at the step that delegated, the child's depth in
the tree and its root, and whether it starts from the parent's history (a fork of that
prefix, so ``session_started.parent`` names it too) or from an empty one. The parent's
T1 of the ``delegate`` call names the child's session id among its resources
(``actor:subagent:<id>``): the id is a pure function of the parent session and the call
id, chosen before T1, so recovery finds the child from the parent's log alone.

A fork of a child inherits its metadata; ``subagent.session`` names the session the link
belongs to, so an inherited link is never mistaken for the fork's own.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lodger.events import Event, ModelOutput, RunEnded, SessionStarted, TurnEnded, Usage

__all__ = [
    "ChildOutcome",
    "History",
    "SubagentLink",
    "child_outcome",
    "child_session_id",
    "current_subagent",
    "link_of",
    "session_from_resources",
]

History = Literal["fork", "empty"]

_PREFIX = "subagent."
_RESOURCE = "subagent:"


def child_session_id(parent_session: str, call_id: str) -> str:
    """The child session of one delegation: a pure function of the parent session and the
    call id, so it is known before T1 and again by recovery."""
    digest = hashlib.sha256(f"{parent_session}\0{call_id}".encode()).hexdigest()[:32]
    return f"sub-{digest}"


def child_resource(child_id: str) -> str:
    """The actor key the delegate call claims (and T1 records as ``actor:subagent:<id>``)."""
    return f"{_RESOURCE}{child_id}"


def session_from_resources(resources: Sequence[str]) -> str | None:
    """The child session a ``delegate`` T1 names among its resources, if any."""
    marker = f"actor:{_RESOURCE}"
    for resource in resources:
        if resource.startswith(marker):
            return resource[len(marker) :]
    return None


@dataclass(frozen=True, kw_only=True)
class SubagentLink:
    """Where a child session comes from: recorded in its ``session_started`` metadata."""

    session_id: str
    parent_session: str
    parent_call: str
    parent_offset: int
    parent_digest: str
    depth: int
    root: str
    history: History

    def to_metadata(self) -> dict[str, str]:
        return {
            f"{_PREFIX}session": self.session_id,
            f"{_PREFIX}parent_session": self.parent_session,
            f"{_PREFIX}parent_call": self.parent_call,
            f"{_PREFIX}parent_offset": str(self.parent_offset),
            f"{_PREFIX}parent_digest": self.parent_digest,
            f"{_PREFIX}depth": str(self.depth),
            f"{_PREFIX}root": self.root,
            f"{_PREFIX}history": self.history,
        }

    @classmethod
    def from_metadata(cls, session_id: str, metadata: Mapping[str, str]) -> SubagentLink | None:
        if metadata.get(f"{_PREFIX}session") != session_id:
            return None  # not a child, or a fork that inherited its parent's link
        try:
            history = metadata[f"{_PREFIX}history"]
            return cls(
                session_id=session_id,
                parent_session=metadata[f"{_PREFIX}parent_session"],
                parent_call=metadata[f"{_PREFIX}parent_call"],
                parent_offset=int(metadata[f"{_PREFIX}parent_offset"]),
                parent_digest=metadata[f"{_PREFIX}parent_digest"],
                depth=int(metadata[f"{_PREFIX}depth"]),
                root=metadata[f"{_PREFIX}root"],
                history="fork" if history == "fork" else "empty",
            )
        except (KeyError, ValueError):
            return None


def link_of(first: Event | None) -> SubagentLink | None:
    """The parent link a session's first event records, or None."""
    if first is None or first.offset != 0 or not isinstance(first.body, SessionStarted):
        return None
    return SubagentLink.from_metadata(first.session_id, first.body.metadata)


@dataclass(frozen=True, kw_only=True)
class ChildOutcome:
    """How a child's (only) turn settled, read from its log; ``status`` None: still open
    (``started`` says whether its turn began at all)."""

    session_id: str
    status: str | None
    answer: str | None = None
    output: Any = None
    error: str | None = None
    steps: int = 0
    #: input + output tokens of the child's requests (cached input counts in input)
    tokens: int = 0
    #: of its input tokens, those read from and written to the provider's prompt cache
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    started: bool = False
    #: the child's wall time ran out (its turn was stopped, still open)
    timed_out: bool = False

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    def render(self) -> str:
        """The tool result the parent's model reads, as JSON text."""
        body: dict[str, Any] = {"session": self.session_id, "status": self.status or "open"}
        if self.output is not None and self.output != self.answer:
            body["output"] = self.output  # structured: the answer is its JSON text
        elif self.answer is not None:
            body["answer"] = self.answer
        if self.error is not None:
            body["error"] = self.error
        body["steps"] = self.steps
        body["tokens"] = self.tokens
        if self.cache_read_tokens or self.cache_write_tokens:
            body["cache_read_tokens"] = self.cache_read_tokens
            body["cache_write_tokens"] = self.cache_write_tokens
        return json.dumps(body, ensure_ascii=False)


def child_outcome(session_id: str, events: Sequence[Event]) -> ChildOutcome:
    """The outcome of the child's turn from its own events (its first turn only: a child
    runs one turn for its delegation)."""
    status: str | None = None
    answer: str | None = None
    output: Any = None
    error: str | None = None
    steps = tokens = cache_read = cache_write = 0
    started = False
    for e in events:
        body = e.body
        if e.session_id != session_id:
            continue  # a forked child's shared prefix belongs to its parent
        if isinstance(body, ModelOutput) and e.origin == "provider":
            steps += 1
            usage = body.usage or Usage()
            tokens += usage.input_tokens + usage.output_tokens
            cache_read += usage.cache_read_tokens
            cache_write += usage.cache_write_tokens
        elif body.kind == "turn_started":
            started = True
        elif isinstance(body, RunEnded) and body.error is not None:
            error = body.error
        elif isinstance(body, TurnEnded) and status is None:
            status, answer, output = body.status, body.answer, body.output
            if status == "completed":
                error = None
            elif body.reason:
                error = body.reason  # why it was abandoned (a wall time, an operator)
            break
    return ChildOutcome(
        session_id=session_id,
        status=status,
        answer=answer,
        output=output,
        error=error,
        steps=steps,
        tokens=tokens,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        started=started,
    )


# The child whose call is asking now: approvers read it to name the child (contextvars
# follow the child's tasks, so a question from a child's call carries its link).
_ASKING: contextvars.ContextVar[SubagentLink | None] = contextvars.ContextVar(
    "lodger_subagent", default=None
)


def current_subagent() -> SubagentLink | None:
    """The child session the current call belongs to (None in the parent's own calls).

    An ``Approver`` calls it to name the child that asks:

    >>> async def approve(tool, arguments):
    ...     child = current_subagent()
    ...     who = f"subagent {child.session_id}" if child else "the agent"
    ...     return input(f"{who} wants {tool.name}; allow? ") == "y"
    """
    return _ASKING.get()

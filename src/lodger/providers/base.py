"""The provider-neutral request and response every model adapter speaks.

The context projection (``lodger.context``) turns a log prefix into a ``ModelRequest``;
an adapter turns it into one provider's wire format, calls the provider through its
official SDK, and turns the answer back into a ``ModelResponse``. Calls keep the
model's own ``call_id`` and raw ``arguments`` text; results are paired by ``call_id``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from lodger.events import ProposedCall, Usage

__all__ = [
    "AssistantMessage",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "TextSink",
    "ToolResultMessage",
    "ToolSchema",
    "UserMessage",
]


@dataclass(frozen=True, kw_only=True)
class ToolSchema:
    """One visible tool: ``parameters`` is a JSON schema (draft 2020-12) for its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class UserMessage:
    """Text the model reads as the user's. ``source`` is ``"input"`` for a turn's input
    and ``"runtime"`` for what the runtime says back (an output that failed validation)."""

    text: str
    source: Literal["input", "runtime"] = "input"


@dataclass(frozen=True, kw_only=True)
class AssistantMessage:
    text: str = ""
    reasoning: str = ""
    calls: tuple[ProposedCall, ...] = ()
    #: opaque data the provider that produced this output needs back (see ModelResponse)
    provider_state: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class ToolResultMessage:
    call_id: str
    name: str
    content: str
    is_error: bool = False


Message = UserMessage | AssistantMessage | ToolResultMessage


@dataclass(frozen=True, kw_only=True)
class ModelRequest:
    system: str
    messages: Sequence[Message]
    tools: tuple[ToolSchema, ...] = ()
    max_output_tokens: int | None = None
    #: the JSON schema the final answer must match (``Agent(output_type=...)``), or None
    #: for free text; adapters may pass it to a provider's structured-output option
    output_schema: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class ModelResponse:
    text: str = ""
    reasoning: str = ""
    calls: tuple[ProposedCall, ...] = ()
    usage: Usage | None = None
    finish_reason: str | None = None
    #: what the provider needs back verbatim in later requests (e.g. Anthropic's signed
    #: thinking blocks), keyed by provider; logged with the output and replayed
    provider_state: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


TextSink = Callable[[str], None]
"""Receives streamed text deltas for the live display; the log keeps only the whole output."""


class Model(Protocol):
    """A model adapter. ``spec`` is what the user typed (``openai:gpt-5``, ``script:x.json``).

    ``complete`` raises ``lodger.errors.ProviderError``; ``retryable=True`` for rate limits,
    server errors and dropped connections, which the agent loop retries with backoff.
    """

    @property
    def spec(self) -> str: ...

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse: ...

    async def aclose(self) -> None:
        """Release connections; whoever made the model closes it when done."""
        ...

"""The provider-neutral request and response every model adapter speaks.

The context projection (``lodger.context``) turns a log prefix into a ``ModelRequest``;
an adapter turns it into one provider's wire format, calls the provider through its
official SDK, and turns the answer back into a ``ModelResponse``. Calls keep the
model's own ``call_id`` and raw ``arguments`` text; results are paired by ``call_id``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from lodger.events import ProposedCall, Usage

__all__ = [
    "OUTPUT_TOOL",
    "AssistantMessage",
    "MediaPart",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ModelSettings",
    "OutputMode",
    "TextSink",
    "ToolResultMessage",
    "ToolSchema",
    "UserMessage",
    "is_context_length_error",
    "names_context_length",
    "output_tool",
    "take_output_call",
]


@dataclass(frozen=True, kw_only=True)
class ToolSchema:
    """One visible tool: ``parameters`` is a JSON schema (draft 2020-12) for its arguments.
    ``writes`` says the tool changes something or needs approval (it is never sent to a
    provider; ``TestModel`` leaves such tools alone unless asked)."""

    name: str
    description: str
    parameters: dict[str, Any]
    writes: bool = False


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """What a request asks of the model beyond its messages; None (or empty) leaves the
    provider's default. ``extra`` is merged into the provider's request body as is (a
    provider-specific option lodger does not name). An adapter that cannot honour a
    setting it was given ignores it only where the provider has no such knob, and says so
    in its docstring.

    Settings are given per agent and per run; a run's override the agent's field by field
    (``merged``). ``record()`` is what ``step_started.settings`` keeps.
    """

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    parallel_tool_calls: bool | None = None
    #: ``"minimal"``, ``"low"``, ``"medium"`` or ``"high"`` (reasoning models)
    reasoning_effort: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def merged(self, other: ModelSettings | None) -> ModelSettings:
        """These settings with every field ``other`` sets taken from ``other``."""
        if other is None:
            return self
        changes: dict[str, Any] = {}
        for name in _SETTING_FIELDS:
            value = getattr(other, name)
            if value is not None and value != ():
                changes[name] = value
        if other.extra:
            changes["extra"] = {**self.extra, **other.extra}
        return replace(self, **changes)

    def record(self) -> dict[str, Any] | None:
        """The settings that are set, as JSON (None when nothing is)."""
        out: dict[str, Any] = {}
        for name in _SETTING_FIELDS:
            value = getattr(self, name)
            if value is not None and value != ():
                out[name] = list(value) if isinstance(value, tuple) else value
        if self.extra:
            out["extra"] = dict(self.extra)
        return out or None


_SETTING_FIELDS = (
    "temperature",
    "top_p",
    "max_tokens",
    "stop",
    "seed",
    "parallel_tool_calls",
    "reasoning_effort",
)


@dataclass(frozen=True, kw_only=True)
class MediaPart:
    """An image or document for the model: ``data`` (its bytes) or ``url`` (the provider
    fetches it). ``media_type`` says which (``image/png``, ``application/pdf``...)."""

    media_type: str
    data: bytes | None = None
    url: str | None = None
    name: str = ""

    @property
    def is_image(self) -> bool:
        return self.media_type.startswith("image/")


@dataclass(frozen=True, kw_only=True)
class UserMessage:
    """Text the model reads as the user's. ``source`` is ``"input"`` for a turn's input,
    ``"runtime"`` for what the runtime says back (an output that failed validation) and
    ``"steer"`` for a message a person sent the running turn (``lodger.engine.steering``);
    ``parts`` are images and documents given with the input."""

    text: str
    source: Literal["input", "runtime", "steer"] = "input"
    parts: tuple[MediaPart, ...] = ()


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
    #: images and documents the tool returned (stored as artifacts)
    parts: tuple[MediaPart, ...] = ()


Message = UserMessage | AssistantMessage | ToolResultMessage

OutputMode = Literal["native", "tool", "prompted"]
"""How a final answer's schema travels: ``native`` (the provider's structured-output
option), ``tool`` (a forced output tool whose arguments are the answer) or ``prompted``
(the schema in the system prompt only)."""


@dataclass(frozen=True, kw_only=True)
class ModelRequest:
    system: str
    messages: Sequence[Message]
    tools: tuple[ToolSchema, ...] = ()
    max_output_tokens: int | None = None
    #: the JSON schema the final answer must match (``Agent(output_type=...)``), or None
    #: for free text; ``output_mode`` says how the adapter passes it on
    output_schema: dict[str, Any] | None = None
    output_mode: OutputMode = "prompted"
    settings: ModelSettings = field(default_factory=ModelSettings)


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


#: the forced output tool of ``output_mode="tool"``: its arguments are the final answer
OUTPUT_TOOL = "final_result"


def output_tool(request: ModelRequest) -> ToolSchema | None:
    """The output tool a request in tool mode offers the model (None in other modes)."""
    if request.output_mode != "tool" or request.output_schema is None:
        return None
    return ToolSchema(
        name=OUTPUT_TOOL,
        description="Give your final answer: call this once, with the answer as its arguments.",
        parameters=request.output_schema,
    )


def take_output_call(
    calls: tuple[ProposedCall, ...], request: ModelRequest
) -> tuple[str | None, tuple[ProposedCall, ...]]:
    """In tool mode, the output tool's arguments (the answer as JSON text) and the other
    calls; an answer given alongside other calls is left for a later step (the other
    calls run first), so only a lone output call is taken."""
    if request.output_mode != "tool":
        return None, calls
    answers = [c for c in calls if c.name == OUTPUT_TOOL]
    if not answers:
        return None, calls
    rest = tuple(c for c in calls if c.name != OUTPUT_TOOL)
    if rest:
        return None, rest
    return answers[0].arguments, ()


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


#: what providers say when a request does not fit the model's context window: OpenAI
#: (``context_length_exceeded``, "maximum context length"), Anthropic ("prompt is too
#: long", "exceed context limit"), Gemini ("input token count ... exceeds the maximum
#: number of tokens"), vLLM and llama.cpp ("exceeds the available context size")
_CONTEXT_LENGTH = re.compile(
    r"context_length_exceeded|maximum context length|context length exceeded"
    r"|prompt is too long|exceeds? (?:the )?context (?:limit|window)|exceed context limit"
    r"|input token count.*exceeds the maximum|exceeds the maximum number of tokens"
    r"|exceeds the available context size|too many tokens in the prompt",
    re.IGNORECASE | re.DOTALL,
)


def names_context_length(detail: str) -> bool:
    """Whether a provider's error text says the request is longer than the context window."""
    return _CONTEXT_LENGTH.search(detail) is not None


def is_context_length_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a provider's refusal of a request too long for its context
    window (a ``ProviderError`` with code ``context_length``): the engine compacts the
    context once and asks again (``lodger.engine.compaction``)."""
    return getattr(exc, "code", None) == "context_length"

"""The Messages request an ``AnthropicModel`` sends, built from a ``ModelRequest``.

Everything here is plain data (the SDK's ``TypedDict`` params), so it is checked before a
byte goes out: a media type the API does not take, or a reasoning effort with no thinking
budget, is a ``ProviderError`` that is not retried, never a 400 a minute later.

Prompt-cache breakpoints (``cache_control: {"type": "ephemeral"}``) mark the prefix that
stays the same from one request to the next, at most four (the API's limit): the system
prompt, the last tool definition (tools come first in the cached prefix), the last block
before the newest user input (the history a new turn starts from), and the last block of
the request (so each step of a turn reads what the step before it wrote).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from lodger.errors import ProviderError
from lodger.events import ProposedCall
from lodger.providers._callids import wire_call_id
from lodger.providers.base import (
    OUTPUT_TOOL,
    AssistantMessage,
    MediaPart,
    ModelRequest,
    ModelSettings,
    ToolResultMessage,
    UserMessage,
    output_tool,
)

if TYPE_CHECKING:
    from anthropic.types import (
        ContentBlockParam,
        DocumentBlockParam,
        ImageBlockParam,
        MessageParam,
        OutputConfigParam,
        TextBlockParam,
        ThinkingConfigEnabledParam,
        ToolChoiceParam,
        ToolParam,
        ToolResultBlockParam,
        ToolUseBlockParam,
    )

__all__ = ["EFFORT_BUDGETS", "STATE_KEY", "WireRequest", "wire_request"]

#: the key of the Anthropic adapter's entry in provider_state
STATE_KEY = "anthropic"

#: the extended-thinking budget (tokens) a ``reasoning_effort`` asks for, when the model
#: was not given a ``thinking_budget`` of its own; ``"none"`` leaves thinking off
EFFORT_BUDGETS: dict[str, int | None] = {
    "none": None,
    "minimal": 1024,  # the API's smallest budget
    "low": 4096,
    "medium": 8192,
    "high": 16384,
}

_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_BREAKPOINT = {"type": "ephemeral"}
# Blocks the API refuses a cache_control on: a breakpoint goes on the block before them.
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})

Role = Literal["user", "assistant"]
Position = tuple[int, int]  # (message index, block index)


@dataclass(frozen=True)
class WireRequest:
    """The arguments of one ``messages.create`` call; None (or empty) is left out."""

    max_tokens: int
    messages: list[MessageParam]
    system: str | list[TextBlockParam] | None = None
    tools: list[ToolParam] = field(default_factory=list)
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingConfigEnabledParam | None = None
    stop_sequences: list[str] = field(default_factory=list)
    output_config: OutputConfigParam | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)


def wire_request(
    request: ModelRequest,
    *,
    spec: str,
    max_tokens: int,
    thinking_budget: int | None,
    cache: bool,
) -> WireRequest:
    """The request for ``request``; ``max_tokens`` and ``thinking_budget`` are the model's
    own defaults, ``cache`` turns the prompt-cache breakpoints on."""
    settings = request.settings
    budget = _thinking_budget(settings, thinking_budget, spec)
    if not _may_think(request):
        budget = None
    if settings.max_tokens is not None:
        max_tokens = settings.max_tokens
    elif request.max_output_tokens is not None:
        max_tokens = request.max_output_tokens
    if budget is not None:
        max_tokens = max(max_tokens, budget + 1024)  # the answer comes after the thinking
    tools = _tools(request, cache=cache)
    system: str | list[TextBlockParam] | None = request.system or None
    if cache and request.system:
        system = [{"type": "text", "text": request.system, "cache_control": {"type": "ephemeral"}}]
    extra = dict(settings.extra)
    output_config = _output_config(request, extra, spec=spec)  # may take a key of extra
    return WireRequest(
        max_tokens=max_tokens,
        messages=_messages(request, spec=spec, cache=cache),
        system=system,
        tools=tools,
        tool_choice=_tool_choice(request, tools, thinking=budget is not None),
        thinking=({"type": "enabled", "budget_tokens": budget} if budget is not None else None),
        stop_sequences=list(settings.stop),
        output_config=output_config,
        extra_body=_sampling(settings) | extra,
    )


def _thinking_budget(settings: ModelSettings, configured: int | None, spec: str) -> int | None:
    """The model's own budget, else the one ``reasoning_effort`` maps to."""
    effort = settings.reasoning_effort
    if configured is not None or effort is None:
        return configured
    if effort not in EFFORT_BUDGETS:
        raise ProviderError(
            f"{spec}: reasoning_effort={effort!r} has no Anthropic thinking budget",
            retryable=False,
            code="provider_rejected",
            hint=f"use one of {', '.join(EFFORT_BUDGETS)}, or give the model a thinking_budget",
        )
    return EFFORT_BUDGETS[effort]


def _sampling(settings: ModelSettings) -> dict[str, Any]:
    # The SDK names no sampling parameter any more; the API still takes them in the body.
    out: dict[str, Any] = {}
    if settings.temperature is not None:
        out["temperature"] = settings.temperature
    if settings.top_p is not None:
        out["top_p"] = settings.top_p
    return out


def _output_config(
    request: ModelRequest, extra: dict[str, Any], *, spec: str
) -> OutputConfigParam | None:
    """Native structured output; an ``output_config`` given in ``extra`` (an effort, say)
    is merged in rather than replacing it (``extra`` loses the key)."""
    config: dict[str, Any] = {}
    given = extra.get("output_config")
    if isinstance(given, dict):
        config.update(extra.pop("output_config"))
    if request.output_mode == "native" and request.output_schema is not None:
        from anthropic import transform_schema  # the adapter calling this holds the SDK

        try:
            schema = transform_schema(request.output_schema)
        except (ValueError, TypeError) as exc:
            raise ProviderError(
                f"{spec}: the output schema cannot be sent as Anthropic structured output: {exc}",
                retryable=False,
                code="provider_rejected",
                hint="give every field a type, or use output_mode 'tool' or 'prompted'",
            ) from exc
        config["format"] = {"type": "json_schema", "schema": schema}
    return cast("OutputConfigParam", config) if config else None


def _tools(request: ModelRequest, *, cache: bool) -> list[ToolParam]:
    schemas = list(request.tools)
    answer = output_tool(request)
    if answer is not None:
        schemas.append(answer)
    tools: list[ToolParam] = [
        {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
        for tool in schemas
    ]
    if cache and tools:
        tools[-1]["cache_control"] = {"type": "ephemeral"}
    return tools


def _tool_choice(
    request: ModelRequest, tools: list[ToolParam], *, thinking: bool
) -> ToolChoiceParam | None:
    """Force the output tool in tool mode: the only tool sent, or any tool when others
    are sent too (only calls, then the answer, may follow). Extended thinking refuses a
    forced choice, so with thinking on the model may also answer in text (``auto``)."""
    if not tools:
        return None
    forced = output_tool(request) is not None and not thinking
    choice: dict[str, Any]
    if forced and len(tools) == 1:
        choice = {"type": "tool", "name": OUTPUT_TOOL}
    elif forced:
        choice = {"type": "any"}
    elif request.settings.parallel_tool_calls is False:
        choice = {"type": "auto"}
    else:
        return None
    if request.settings.parallel_tool_calls is False:
        choice["disable_parallel_tool_use"] = True
    return cast("ToolChoiceParam", choice)


def _messages(request: ModelRequest, *, spec: str, cache: bool) -> list[MessageParam]:
    """The history as alternating messages; results of one step share one user message."""
    turns: list[tuple[Role, list[ContentBlockParam]]] = []
    newest_input: Position | None = None

    def add(role: Role, blocks: Sequence[ContentBlockParam]) -> None:
        if not blocks:
            return
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, list(blocks)))

    call_order: dict[str, int] = {}
    pending_results: list[ToolResultMessage] = []

    def flush_results() -> None:
        ordered = sorted(pending_results, key=lambda r: call_order.get(r.call_id, len(call_order)))
        add("user", [_result_block(result, spec) for result in ordered])
        pending_results.clear()

    for message in request.messages:
        if isinstance(message, ToolResultMessage):
            pending_results.append(message)
            continue
        flush_results()
        if isinstance(message, UserMessage):
            content = [*_media_blocks(message.parts, spec), *_text_blocks(message.text)]
            if message.source == "input" and content:
                newest_input = _next_position(turns, "user")
            add("user", content)
        elif isinstance(message, AssistantMessage):
            call_order = {call.call_id: n for n, call in enumerate(message.calls)}
            add(
                "assistant",
                [
                    *_thinking_blocks(message),
                    *_text_blocks(message.text),
                    *map(_tool_use_block, message.calls),
                ],
            )
    flush_results()
    if cache:
        _mark_history(turns, newest_input)
    out: list[MessageParam] = []
    for role, blocks in turns:
        if role == "user":
            out.append({"role": "user", "content": blocks})
        else:
            out.append({"role": "assistant", "content": blocks})
    return out


def _next_position(turns: list[tuple[Role, list[ContentBlockParam]]], role: Role) -> Position:
    """Where the next block of ``role`` will land (merged into the last message or not)."""
    if turns and turns[-1][0] == role:
        return len(turns) - 1, len(turns[-1][1])
    return len(turns), 0


def _mark_history(
    turns: list[tuple[Role, list[ContentBlockParam]]], newest_input: Position | None
) -> None:
    """Breakpoints on the last block before the newest input and on the last block."""
    blocks = [block for _, message in turns for block in message]
    starts = [0]
    for _, message in turns:
        starts.append(starts[-1] + len(message))
    ends = [len(blocks)]
    if newest_input is not None:
        at_message, at_block = newest_input
        ends.append(starts[at_message] + at_block)
    for end in ends:
        mark = _markable_before(blocks, end)
        if mark is not None:
            cast("dict[str, Any]", blocks[mark])["cache_control"] = dict(_BREAKPOINT)


def _markable_before(blocks: list[ContentBlockParam], end: int) -> int | None:
    """The last block before ``end`` that may carry a breakpoint."""
    for index in range(end - 1, -1, -1):
        if blocks[index]["type"] not in _UNMARKABLE:
            return index
    return None


def _may_think(request: ModelRequest) -> bool:
    """Whether thinking may be on for ``request``: the API refuses it in the middle of a
    tool loop whose last assistant turn holds no thinking block of ours (another model of
    a fallback chain made those calls), so that step's answer is asked without it."""
    if not request.messages or not isinstance(request.messages[-1], ToolResultMessage):
        return True
    last = next(
        (m for m in reversed(request.messages) if not isinstance(m, ToolResultMessage)), None
    )
    return not isinstance(last, AssistantMessage) or bool(_thinking_blocks(last))


def _call_id(call_id: str) -> str:
    """Anthropic takes ids of ``[A-Za-z0-9_-]`` only; another provider's (``functions.
    lookup:0``) goes as a stable digest."""
    return wire_call_id(call_id, max_len=64, plain=True, prefix="toolu_")


def _thinking_blocks(message: AssistantMessage) -> list[ContentBlockParam]:
    """The signed thinking blocks this adapter recorded with the output, replayed verbatim
    (the API checks their signatures; blocks of another provider are not ours to send)."""
    state = (message.provider_state or {}).get(STATE_KEY)
    blocks = state.get("thinking") if isinstance(state, dict) else None
    if not isinstance(blocks, list):
        return []
    # Copies: the history's own values are never changed by building a request.
    return [dict(block) for block in blocks if isinstance(block, dict)]  # type: ignore[misc]


def _text_blocks(text: str) -> list[TextBlockParam]:
    # The API rejects empty text blocks.
    block: TextBlockParam = {"type": "text", "text": text}
    return [block] if text else []


def _tool_use_block(call: ProposedCall) -> ToolUseBlockParam:
    try:
        arguments = json.loads(call.arguments)
    except json.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):
        # The API wants an object; keep the model's malformed text where it can see it.
        arguments = {"_raw_arguments": call.arguments}
    return {"type": "tool_use", "id": _call_id(call.call_id), "name": call.name, "input": arguments}


def _result_block(result: ToolResultMessage, spec: str) -> ToolResultBlockParam:
    if not result.parts:
        content: Any = result.content
    else:
        content = [*_text_blocks(result.content), *_media_blocks(result.parts, spec)]
    return {
        "type": "tool_result",
        "tool_use_id": _call_id(result.call_id),
        "content": content,
        "is_error": result.is_error,
    }


def _media_blocks(
    parts: Sequence[MediaPart], spec: str
) -> list[ImageBlockParam | DocumentBlockParam]:
    return [_media_block(part, spec) for part in parts]


def _media_block(part: MediaPart, spec: str) -> ImageBlockParam | DocumentBlockParam:
    """An image block (JPEG, PNG, GIF, WebP) or a document block (PDF, plain text), from
    the part's bytes (base64) or its URL, which Anthropic fetches itself."""
    media_type = part.media_type.partition(";")[0].strip().lower()
    source: dict[str, Any]
    if part.data is None and part.url is None:
        raise _unsendable(part, spec, "has neither bytes nor a URL")
    if media_type == "text/plain":
        if part.data is None:
            why = "is plain text by URL (Anthropic fetches only PDFs and images)"
            raise _unsendable(part, spec, why)
        try:
            text = part.data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _unsendable(part, spec, f"is not UTF-8 text ({exc.reason})") from exc
        source = {"type": "text", "media_type": "text/plain", "data": text}
    elif media_type in _IMAGE_TYPES or media_type == "application/pdf":
        if part.data is not None:
            data = base64.b64encode(part.data).decode("ascii")
            source = {"type": "base64", "media_type": media_type, "data": data}
        else:
            source = {"type": "url", "url": part.url}
    else:
        raise _unsendable(part, spec, "is of a media type Anthropic does not take")
    if media_type in _IMAGE_TYPES:
        return cast("ImageBlockParam", {"type": "image", "source": source})
    document: dict[str, Any] = {"type": "document", "source": source}
    if part.name:
        document["title"] = part.name
    return cast("DocumentBlockParam", document)


def _unsendable(part: MediaPart, spec: str, why: str) -> ProviderError:
    named = f" {part.name!r}" if part.name else ""
    return ProviderError(
        f"{spec}: the {part.media_type} part{named} {why}",
        retryable=False,
        code="provider_rejected",
        hint="Anthropic takes images (JPEG, PNG, GIF, WebP) and documents (PDF, plain text); "
        "convert the file or leave it out",
    )

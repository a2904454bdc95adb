"""Anthropic Messages API through the official ``anthropic`` SDK.

Calls are ``tool_use`` blocks in the assistant message; results are ``tool_result``
blocks in the next user message. All results of one step travel in ONE user message, in
the order the model made the calls (the API rejects results split over messages), with
``is_error`` set on failures. Roles must alternate, so consecutive user-side content
(results, then a new user text) is merged into one message.

    model = AnthropicModel(model="claude-sonnet-4-5")
    response = await model.complete(request, on_text=print)

Tool input streams as ``input_json_delta`` pieces per content block; the pieces are
joined verbatim into ``ProposedCall.arguments``. Thinking text, if the model sends any,
becomes ``reasoning``. SDK retries are off: the agent loop owns retries.
"""

from __future__ import annotations

import json
import os
import ssl
from dataclasses import dataclass, field
from typing import Literal

from lodger._core.extras import require
from lodger.errors import ConfigError, ProviderError
from lodger.events import ProposedCall, Usage
from lodger.providers._callids import wire_call_id
from lodger.providers._errors import (
    ANSWER_TIMEOUT,
    MALFORMED,
    SinkFailed,
    brief,
    error_for_status,
    finish_reason,
    guarded_sink,
    malformed,
    sized,
    stream_unfinished,
    timed_out,
    token_count,
    unreachable,
    unreadable,
    within,
)
from lodger.providers.base import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    TextSink,
    ToolResultMessage,
    UserMessage,
)

with require("anthropic", "the Anthropic provider"):
    import anthropic
    import httpx2
    from anthropic.types import (
        ContentBlockParam,
        InputJSONDelta,
        MessageParam,
        RawContentBlockDeltaEvent,
        RawContentBlockStartEvent,
        RawMessageDeltaEvent,
        RawMessageStartEvent,
        RawMessageStopEvent,
        RawMessageStreamEvent,
        RedactedThinkingBlock,
        SignatureDelta,
        TextBlock,
        TextBlockParam,
        TextDelta,
        ThinkingBlock,
        ThinkingDelta,
        ToolParam,
        ToolResultBlockParam,
        ToolUseBlock,
        ToolUseBlockParam,
    )

__all__ = ["AnthropicModel"]

# A proxy or gateway given by base_url may not need a key; the SDK still wants one.
_PLACEHOLDER_KEY = "lodger-placeholder-key"
# The key of this adapter's entry in provider_state.
_STATE_KEY = "anthropic"
# Error types a stream's error event may carry that are the server's trouble.
_TRANSIENT_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})

Role = Literal["user", "assistant"]


class AnthropicModel:
    """A ``Model`` over streaming Anthropic Messages; ``max_tokens`` caps each answer."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries_sdk: int = 0,
        timeout: float = 120,
        answer_timeout: float = ANSWER_TIMEOUT,
        max_tokens: int = 4096,
        thinking_budget: int | None = None,
    ) -> None:
        self._model = model
        self._answer_timeout = answer_timeout  # the whole answer (timeout: each read)
        self._max_tokens = max_tokens
        # Extended thinking: the signed thinking blocks come back as provider_state and are
        # replayed with the assistant turn, as the API requires when tools are used.
        self._thinking_budget = thinking_budget
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            if base_url is None:
                raise ConfigError(
                    "no Anthropic API key was given",
                    hint="set ANTHROPIC_API_KEY, or pass api_key=",
                    code="missing_api_key",
                )
            key = _PLACEHOLDER_KEY
        try:
            self._client = anthropic.AsyncAnthropic(
                api_key=key, base_url=base_url, max_retries=max_retries_sdk, timeout=timeout
            )
        except (anthropic.AnthropicError, ValueError) as exc:
            raise ConfigError(f"cannot configure the Anthropic client: {exc}") from exc

    @property
    def spec(self) -> str:
        return f"anthropic:{self._model}"

    async def aclose(self) -> None:
        """Close the HTTP connections the SDK client holds."""
        await self._client.close()

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        return await within(self.spec, self._answer_timeout, self._complete(request, on_text))

    async def _complete(self, request: ModelRequest, on_text: TextSink | None) -> ModelResponse:
        folded = _EventFolder(guarded_sink(on_text))
        try:
            max_tokens = (
                request.max_output_tokens
                if request.max_output_tokens is not None
                else self._max_tokens
            )
            budget = self._thinking_budget if _may_think(request) else None
            if budget is not None:
                max_tokens = max(max_tokens, budget + 1024)  # the answer comes after it
            stream = await self._client.messages.create(
                model=self._model,
                max_tokens=max_tokens,
                system=request.system or anthropic.omit,
                messages=_anthropic_messages(request),
                tools=_anthropic_tools(request) or anthropic.omit,
                thinking=(
                    {"type": "enabled", "budget_tokens": budget}
                    if budget is not None
                    else anthropic.omit
                ),
                stream=True,
            )
            async with stream:
                async for event in stream:
                    folded.feed(event)
            if not folded.stopped:
                raise stream_unfinished(self.spec, "the message stopped")
            return sized(folded.response())
        except anthropic.AnthropicError as exc:
            raise _provider_error(exc, spec=self.spec) from exc
        except (httpx2.RequestError, ssl.SSLError) as exc:
            # The SDK does not wrap transport failures that happen while reading a stream.
            raise ProviderError(
                f"{self.spec}: the connection broke mid-answer ({brief(exc)})",
                retryable=True,
                code="provider_connection",
                hint="the request is retried",
            ) from exc
        except SinkFailed as exc:
            raise exc.__cause__ or exc from None
        except MALFORMED as exc:
            raise malformed(self.spec, exc) from exc


def _anthropic_messages(request: ModelRequest) -> list[MessageParam]:
    """The history as alternating messages; results of one step share one user message."""
    turns: list[tuple[Role, list[ContentBlockParam]]] = []

    def add(role: Role, blocks: list[ContentBlockParam]) -> None:
        if not blocks:
            return
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))

    call_order: dict[str, int] = {}
    pending_results: list[ToolResultMessage] = []

    def flush_results() -> None:
        ordered = sorted(pending_results, key=lambda r: call_order.get(r.call_id, len(call_order)))
        add("user", [_result_block(result) for result in ordered])
        pending_results.clear()

    for message in request.messages:
        if isinstance(message, ToolResultMessage):
            pending_results.append(message)
            continue
        flush_results()
        if isinstance(message, UserMessage):
            add("user", _text_blocks(message.text))
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
    out: list[MessageParam] = []
    for role, blocks in turns:
        if role == "user":
            out.append({"role": "user", "content": blocks})
        else:
            out.append({"role": "assistant", "content": blocks})
    return out


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


def _thinking_blocks(message: AssistantMessage) -> list[ContentBlockParam]:
    """The signed thinking blocks this adapter recorded with the output, replayed verbatim
    (the API checks their signatures; blocks of another provider are not ours to send)."""
    state = (message.provider_state or {}).get(_STATE_KEY)
    blocks = state.get("thinking") if isinstance(state, dict) else None
    if not isinstance(blocks, list):
        return []
    return [block for block in blocks if isinstance(block, dict)]  # type: ignore[misc]


def _text_blocks(text: str) -> list[ContentBlockParam]:
    # The API rejects empty text blocks.
    block: TextBlockParam = {"type": "text", "text": text}
    return [block] if text else []


def _call_id(call_id: str) -> str:
    """Anthropic takes ids of ``[A-Za-z0-9_-]`` only; another provider's (``functions.
    lookup:0``) goes as a stable digest."""
    return wire_call_id(call_id, max_len=64, plain=True, prefix="toolu_")


def _tool_use_block(call: ProposedCall) -> ToolUseBlockParam:
    try:
        arguments = json.loads(call.arguments)
    except json.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):
        # The API wants an object; keep the model's malformed text where it can see it.
        arguments = {"_raw_arguments": call.arguments}
    return {"type": "tool_use", "id": _call_id(call.call_id), "name": call.name, "input": arguments}


def _result_block(result: ToolResultMessage) -> ToolResultBlockParam:
    return {
        "type": "tool_result",
        "tool_use_id": _call_id(result.call_id),
        "content": result.content,
        "is_error": result.is_error,
    }


def _anthropic_tools(request: ModelRequest) -> list[ToolParam]:
    return [
        {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
        for tool in request.tools
    ]


@dataclass
class _PendingCall:
    call_id: str
    name: str
    initial: dict[str, object]
    pieces: list[str] = field(default_factory=list)

    def arguments(self) -> str:
        if self.pieces:
            return "".join(self.pieces)
        return json.dumps(self.initial, separators=(",", ":"))


class _EventFolder:
    """Accumulates raw stream events into one answer; calls keep their block order."""

    def __init__(self, on_text: TextSink | None) -> None:
        self._on_text = on_text
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, _PendingCall] = {}  # by content block index
        self._thinking: dict[int, dict[str, str]] = {}  # signed blocks, by index
        self._input_tokens = 0
        self._output_tokens = 0
        self.finish_reason: str | None = None
        self.stopped = False

    def _say(self, text: str) -> None:
        if text:
            self._text.append(text)
            if self._on_text is not None:
                self._on_text(text)

    def feed(self, event: RawMessageStreamEvent) -> None:
        if isinstance(event, RawMessageStartEvent):
            usage = event.message.usage
            # Cached prompt tokens are counted apart from input_tokens; all were input.
            self._input_tokens = (
                token_count(usage.input_tokens, "input")
                + token_count(usage.cache_creation_input_tokens, "cache creation")
                + token_count(usage.cache_read_input_tokens, "cache read")
            )
            self._output_tokens = token_count(usage.output_tokens, "output")
        elif isinstance(event, RawContentBlockStartEvent):
            block = event.content_block
            if isinstance(block, ToolUseBlock):
                self._calls[event.index] = _PendingCall(block.id, block.name, dict(block.input))
            elif isinstance(block, TextBlock):
                self._say(block.text)
            elif isinstance(block, ThinkingBlock):
                self._reasoning.append(block.thinking)
                self._thinking[event.index] = {
                    "type": "thinking",
                    "thinking": block.thinking,
                    "signature": block.signature or "",
                }
            elif isinstance(block, RedactedThinkingBlock):
                self._thinking[event.index] = {"type": "redacted_thinking", "data": block.data}
        elif isinstance(event, RawContentBlockDeltaEvent):
            delta = event.delta
            if isinstance(delta, TextDelta):
                self._say(delta.text)
            elif isinstance(delta, InputJSONDelta) and event.index in self._calls:
                self._calls[event.index].pieces.append(delta.partial_json)
            elif isinstance(delta, ThinkingDelta):
                self._reasoning.append(delta.thinking)
                if event.index in self._thinking:
                    self._thinking[event.index]["thinking"] += delta.thinking
            elif isinstance(delta, SignatureDelta) and event.index in self._thinking:
                self._thinking[event.index]["signature"] += delta.signature
        elif isinstance(event, RawMessageDeltaEvent):
            if event.delta.stop_reason:
                self.finish_reason = finish_reason(event.delta.stop_reason)
            self._output_tokens = token_count(event.usage.output_tokens, "output")
        elif isinstance(event, RawMessageStopEvent):
            self.stopped = True

    def response(self) -> ModelResponse:
        calls = tuple(
            ProposedCall(call_id=pending.call_id, name=pending.name, arguments=pending.arguments())
            for _, pending in sorted(self._calls.items())
        )
        return ModelResponse(
            text="".join(self._text),
            reasoning="".join(self._reasoning),
            calls=calls,
            usage=Usage(input_tokens=self._input_tokens, output_tokens=self._output_tokens),
            finish_reason=self.finish_reason,
            provider_state=(
                {_STATE_KEY: {"thinking": [block for _, block in sorted(self._thinking.items())]}}
                if self._thinking
                else None
            ),
        )


def _provider_error(exc: anthropic.AnthropicError, *, spec: str) -> ProviderError:
    """Translate one SDK exception; retryable for 408/409/429/5xx and network failures."""
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        detail = exc.api_message or exc.message
        if status < 400:
            # An error event inside a stream that began with 200: judge it by its type.
            return ProviderError(
                f"{spec}: the stream failed ({exc.type}): {brief(detail)}",
                retryable=exc.type in _TRANSIENT_TYPES,
                code="provider_stream",
            )
        return error_for_status(
            spec, status, detail, key_env="ANTHROPIC_API_KEY", headers=exc.response.headers
        )
    if isinstance(exc, anthropic.APITimeoutError):
        return timed_out(spec)
    if isinstance(exc, anthropic.APIConnectionError):
        return unreachable(spec, exc.message)
    if isinstance(exc, anthropic.APIResponseValidationError):
        return unreadable(spec, exc.message, exc.status_code)
    return ProviderError(f"{spec}: {brief(exc)}", retryable=False, code="provider_client")

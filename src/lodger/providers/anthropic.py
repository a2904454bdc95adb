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

Structured output (``output_mode``, ``"native"`` by default): ``native`` sends the schema
as ``output_config.format`` (made strict by the SDK's ``transform_schema``: constraints
the API does not enforce move into descriptions, and lodger still validates the answer);
``tool`` adds the output tool and forces it, by name when it is the only tool and with
``tool_choice: any`` otherwise. Extended thinking refuses a forced tool choice, so with
thinking on the choice stays ``auto`` and the model may answer in text, which is
validated all the same. ``prompted`` sends nothing but the system prompt.

Model settings: ``temperature``, ``top_p`` (in the body: the SDK no longer names them),
``max_tokens`` (else the request's ``max_output_tokens``, else the model's own),
``stop`` as ``stop_sequences``, ``parallel_tool_calls=False`` as
``disable_parallel_tool_use``, ``reasoning_effort`` as an extended-thinking budget
(``EFFORT_BUDGETS``: minimal 1024, low 4096, medium 8192, high 16384 tokens, none off)
unless the model has a ``thinking_budget``, and ``extra`` into the body as is (an
``output_config`` there is merged with the structured output's). ``seed`` is ignored:
the API has no such knob.

Media: images (JPEG, PNG, GIF, WebP) and documents (PDF, plain text), as bytes or (not
plain text) a URL, in a turn's input and in tool results; another type fails the
request before it is sent. Prompt caching: the usage's cache reads and writes count as
input and are reported apart; ``cache_breakpoints`` (on by default) marks the stable
prefix for the cache (see ``lodger.providers._anthropic_request``).
"""

from __future__ import annotations

import json
import os
import ssl
from dataclasses import dataclass, field, replace

from lodger._core.extras import require
from lodger.errors import ConfigError, ProviderError
from lodger.events import ProposedCall, Usage
from lodger.providers._anthropic_request import STATE_KEY, WireRequest, wire_request
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
    ModelRequest,
    ModelResponse,
    OutputMode,
    TextSink,
    names_context_length,
    take_output_call,
)

with require("anthropic", "the Anthropic provider"):
    import anthropic
    import httpx2
    from anthropic.types import (
        InputJSONDelta,
        RawContentBlockDeltaEvent,
        RawContentBlockStartEvent,
        RawMessageDeltaEvent,
        RawMessageStartEvent,
        RawMessageStopEvent,
        RawMessageStreamEvent,
        RedactedThinkingBlock,
        SignatureDelta,
        TextBlock,
        TextDelta,
        ThinkingBlock,
        ThinkingDelta,
        ToolUseBlock,
    )

__all__ = ["AnthropicModel"]

# A proxy or gateway given by base_url may not need a key; the SDK still wants one.
_PLACEHOLDER_KEY = "lodger-placeholder-key"
# Error types a stream's error event may carry that are the server's trouble.
_TRANSIENT_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


class AnthropicModel:
    """A ``Model`` over streaming Anthropic Messages; ``max_tokens`` caps each answer
    unless the request's settings say otherwise, ``cache_breakpoints=False`` sends no
    prompt-cache breakpoints."""

    output_mode: OutputMode = "native"
    media_kinds: frozenset[str] = frozenset({"image", "document"})

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
        cache_breakpoints: bool = True,
    ) -> None:
        self._model = model
        self._answer_timeout = answer_timeout  # the whole answer (timeout: each read)
        self._max_tokens = max_tokens
        # Extended thinking: the signed thinking blocks come back as provider_state and are
        # replayed with the assistant turn, as the API requires when tools are used.
        self._thinking_budget = thinking_budget
        self._cache_breakpoints = cache_breakpoints
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
        wire = wire_request(
            request,
            spec=self.spec,
            max_tokens=self._max_tokens,
            thinking_budget=self._thinking_budget,
            cache=self._cache_breakpoints,
        )
        folded = _EventFolder(guarded_sink(on_text))
        try:
            async with await self._send(wire) as stream:
                async for event in stream:
                    folded.feed(event)
            if not folded.stopped:
                raise stream_unfinished(self.spec, "the message stopped")
            response = sized(folded.response())
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
        # Tool mode: the lone output call is the answer, as text the engine validates.
        answer, calls = take_output_call(response.calls, request)
        if answer is not None:
            return replace(response, text=answer, calls=())
        return replace(response, calls=calls) if calls != response.calls else response

    async def _send(self, wire: WireRequest) -> anthropic.AsyncStream[RawMessageStreamEvent]:
        omit = anthropic.omit
        return await self._client.messages.create(
            model=self._model,
            max_tokens=wire.max_tokens,
            system=wire.system if wire.system is not None else omit,
            messages=wire.messages,
            tools=wire.tools or omit,
            tool_choice=wire.tool_choice if wire.tool_choice is not None else omit,
            thinking=wire.thinking if wire.thinking is not None else omit,
            stop_sequences=wire.stop_sequences or omit,
            output_config=wire.output_config if wire.output_config is not None else omit,
            extra_body=wire.extra_body or None,
            stream=True,
        )


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
        self._input_tokens = 0  # not read from the cache nor written to it
        self._cache_read = 0
        self._cache_write = 0
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
            self._input_tokens = token_count(usage.input_tokens, "input")
            self._cache_write = token_count(usage.cache_creation_input_tokens, "cache creation")
            self._cache_read = token_count(usage.cache_read_input_tokens, "cache read")
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
            self._delta_usage(event)
        elif isinstance(event, RawMessageStopEvent):
            self.stopped = True

    def _delta_usage(self, event: RawMessageDeltaEvent) -> None:
        """The delta's counts are cumulative; the input ones are there only when known."""
        usage = event.usage
        self._output_tokens = token_count(usage.output_tokens, "output")
        if usage.input_tokens is not None:
            self._input_tokens = token_count(usage.input_tokens, "input")
        if usage.cache_creation_input_tokens is not None:
            self._cache_write = token_count(usage.cache_creation_input_tokens, "cache creation")
        if usage.cache_read_input_tokens is not None:
            self._cache_read = token_count(usage.cache_read_input_tokens, "cache read")

    def response(self) -> ModelResponse:
        calls = tuple(
            ProposedCall(call_id=pending.call_id, name=pending.name, arguments=pending.arguments())
            for _, pending in sorted(self._calls.items())
        )
        return ModelResponse(
            text="".join(self._text),
            reasoning="".join(self._reasoning),
            calls=calls,
            usage=Usage(
                input_tokens=self._input_tokens + self._cache_read + self._cache_write,
                output_tokens=self._output_tokens,
                cache_read_tokens=self._cache_read,
                cache_write_tokens=self._cache_write,
            ),
            finish_reason=self.finish_reason,
            provider_state=(
                {STATE_KEY: {"thinking": [block for _, block in sorted(self._thinking.items())]}}
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
            too_long = names_context_length(detail)
            return ProviderError(
                f"{spec}: the stream failed ({exc.type}): {brief(detail)}",
                retryable=exc.type in _TRANSIENT_TYPES and not too_long,
                code="context_length" if too_long else "provider_stream",
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

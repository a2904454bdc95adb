"""OpenAI Chat Completions, and every server that speaks it (Ollama, vLLM, llama.cpp).

The adapter streams one completion through the official ``openai`` SDK and folds the
chunks back into a ``ModelResponse``. Tool call arguments arrive in pieces keyed by the
call's ``index``; they are joined verbatim, never parsed, so the log keeps exactly what the
model wrote. SDK retries are off: the agent loop owns retries and logs each one.

    model = OpenAIChatModel(model="qwen3:8b", base_url="http://127.0.0.1:11434/v1")
    response = await model.complete(request, on_text=print)

This module also holds what the Responses adapter shares with it: building the client
(``openai_client``) and translating SDK errors (``provider_error_from_openai``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

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

with require("openai", "the OpenAI provider"):
    import openai
    from openai.types.chat import (
        ChatCompletionChunk,
        ChatCompletionMessageFunctionToolCallParam,
        ChatCompletionMessageParam,
        ChatCompletionToolParam,
    )
    from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCallFunction

__all__ = ["OpenAIChatModel", "openai_client", "provider_error_from_openai"]

# Compatible servers ignore the key, but the SDK refuses to start without one.
_PLACEHOLDER_KEY = "lodger-placeholder-key"
# Fields OpenAI-compatible servers use for streamed chain-of-thought text.
_REASONING_FIELDS = ("reasoning_content", "reasoning")


class OpenAIChatModel:
    """A ``Model`` over streaming Chat Completions; ``base_url`` selects a compatible server."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries_sdk: int = 0,
        timeout: float = 120,
        answer_timeout: float = ANSWER_TIMEOUT,
    ) -> None:
        self._model = model
        self._answer_timeout = answer_timeout  # the whole answer (timeout: each read)
        self._base_url = base_url
        self._client = openai_client(
            base_url=base_url, api_key=api_key, max_retries_sdk=max_retries_sdk, timeout=timeout
        )

    @property
    def spec(self) -> str:
        if self._base_url is None:
            return f"openai:{self._model}"
        return f"openai-compatible:{self._base_url}#{self._model}"

    async def aclose(self) -> None:
        """Close the HTTP connections the SDK client holds."""
        await self._client.close()

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        return await within(self.spec, self._answer_timeout, self._complete(request, on_text))

    async def _complete(self, request: ModelRequest, on_text: TextSink | None) -> ModelResponse:
        limit = request.max_output_tokens
        folded = _ChunkFolder(guarded_sink(on_text))
        try:
            stream = await self._client.chat.completions.create(
                model=self._model,
                messages=_chat_messages(request),
                tools=_chat_tools(request) or openai.omit,
                stream=True,
                stream_options={"include_usage": True},
                # OpenAI wants max_completion_tokens (reasoning models reject max_tokens);
                # compatible servers widely understand only max_tokens.
                max_completion_tokens=openai.omit if limit is None or self._base_url else limit,
                max_tokens=limit if limit is not None and self._base_url else openai.omit,
            )
            async with stream:
                async for chunk in stream:
                    folded.feed(chunk)
            if folded.finish_reason is None:
                raise stream_unfinished(self.spec, "the model finished its answer")
            return sized(folded.response())
        except openai.OpenAIError as exc:
            raise provider_error_from_openai(exc, spec=self.spec) from exc
        except SinkFailed as exc:
            raise exc.__cause__ or exc from None
        except MALFORMED as exc:
            raise malformed(self.spec, exc) from exc


def _call_id(call_id: str) -> str:
    """OpenAI refuses a call id longer than 40 characters (lodger's own are 41, another
    provider's may be longer): such an id goes as a stable digest."""
    return wire_call_id(call_id, max_len=40, plain=False, prefix="call_")


def _chat_messages(request: ModelRequest) -> list[ChatCompletionMessageParam]:
    """The request's system prompt and history as Chat Completions messages."""
    out: list[ChatCompletionMessageParam] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    for message in request.messages:
        if isinstance(message, UserMessage):
            out.append({"role": "user", "content": message.text})
        elif isinstance(message, AssistantMessage):
            calls: list[ChatCompletionMessageFunctionToolCallParam] = [
                {
                    "id": _call_id(call.call_id),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in message.calls
            ]
            if calls:
                out.append(
                    {"role": "assistant", "content": message.text or None, "tool_calls": calls}
                )
            else:
                out.append({"role": "assistant", "content": message.text})
        elif isinstance(message, ToolResultMessage):
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": _call_id(message.call_id),
                    "content": message.content,
                }
            )
    return out


def _chat_tools(request: ModelRequest) -> list[ChatCompletionToolParam]:
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
        for tool in request.tools
    ]


@dataclass
class _PendingCall:
    call_id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class _ChunkFolder:
    """Accumulates streamed chunks of the first choice into one answer."""

    def __init__(self, on_text: TextSink | None) -> None:
        self._on_text = on_text
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[_PendingCall] = []
        self._by_index: dict[int, _PendingCall] = {}
        self.usage: Usage | None = None
        self.finish_reason: str | None = None

    def feed(self, chunk: ChatCompletionChunk) -> None:
        if chunk.usage is not None:
            self.usage = Usage(
                input_tokens=token_count(chunk.usage.prompt_tokens, "prompt"),
                output_tokens=token_count(chunk.usage.completion_tokens, "completion"),
            )
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta.content:
                self._text.append(delta.content)
                if self._on_text is not None:
                    self._on_text(delta.content)
            for name in _REASONING_FIELDS:
                extra = (delta.model_extra or {}).get(name)
                if isinstance(extra, str):
                    self._reasoning.append(extra)
            for piece in delta.tool_calls or ():
                self._feed_call(piece.index, piece.id, piece.function)
            if choice.finish_reason is not None:
                self.finish_reason = finish_reason(choice.finish_reason)

    def _feed_call(
        self, index: int, call_id: str | None, function: ChoiceDeltaToolCallFunction | None
    ) -> None:
        pending = self._by_index.get(index)
        # Some compatible servers reuse index 0 for every call; a new id starts a new call.
        if pending is None or (call_id and pending.call_id and call_id != pending.call_id):
            pending = _PendingCall(call_id="", name="")
            self._calls.append(pending)
            self._by_index[index] = pending
        if call_id and not pending.call_id:
            pending.call_id = call_id
        if function is not None:
            if function.name and not pending.name:
                pending.name = function.name
            if function.arguments:
                pending.arguments.append(function.arguments)

    def response(self) -> ModelResponse:
        calls = tuple(
            ProposedCall(
                call_id=pending.call_id or f"call_{position}",
                name=pending.name,
                arguments="".join(pending.arguments) or "{}",
            )
            for position, pending in enumerate(self._calls)
        )
        return ModelResponse(
            text="".join(self._text),
            reasoning="".join(self._reasoning),
            calls=calls,
            usage=self.usage,
            finish_reason=self.finish_reason,
        )


def openai_client(
    *, base_url: str | None, api_key: str | None, max_retries_sdk: int, timeout: float
) -> openai.AsyncOpenAI:
    """An SDK client; a missing key is a ``ConfigError`` for OpenAI, a placeholder elsewhere."""
    key = api_key or os.environ.get("OPENAI_API_KEY")
    if not key:
        if base_url is None:
            raise ConfigError(
                "no OpenAI API key was given",
                hint="set OPENAI_API_KEY, or pass api_key=",
                code="missing_api_key",
            )
        key = _PLACEHOLDER_KEY
    try:
        return openai.AsyncOpenAI(
            api_key=key,
            base_url=base_url,
            max_retries=max_retries_sdk,
            timeout=timeout,
        )
    except openai.OpenAIError as exc:
        raise ConfigError(f"cannot configure the OpenAI client: {exc}") from exc


# Error kinds an error event inside a stream may name that blame the request, not the server.
_REQUEST_FAULTS = frozenset({"invalid_request_error", "invalid_prompt", "authentication_error"})


def provider_error_from_openai(exc: openai.OpenAIError, *, spec: str) -> ProviderError:
    """Translate one SDK exception; retryable for 408/409/429/5xx and network failures."""
    if isinstance(exc, openai.APIStatusError):
        return error_for_status(
            spec,
            exc.status_code,
            exc.message,
            key_env="OPENAI_API_KEY",
            headers=exc.response.headers,
        )
    if isinstance(exc, openai.APITimeoutError):
        return timed_out(spec)
    if isinstance(exc, openai.APIConnectionError):
        return unreachable(spec, exc.message)
    if isinstance(exc, openai.APIResponseValidationError):
        return unreadable(spec, exc.message, exc.status_code)
    if isinstance(exc, openai.APIError):
        # An error event inside a stream that started fine: the server failed mid-answer.
        kind = exc.type or exc.code or ""
        return ProviderError(
            f"{spec}: the stream failed: {brief(exc.message)}",
            retryable=kind not in _REQUEST_FAULTS,
            code="provider_stream",
        )
    return ProviderError(f"{spec}: {brief(exc)}", retryable=False, code="provider_client")

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
from dataclasses import dataclass, field, replace
from typing import Any, cast

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
from lodger.providers._openai_request import (
    chat_media_parts,
    chat_output,
    chat_settings,
    chat_tools,
)
from lodger.providers.base import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    OutputMode,
    TextSink,
    ToolResultMessage,
    UserMessage,
    names_context_length,
    take_output_call,
)

with require("openai", "the OpenAI provider"):
    import openai
    from openai.types.chat import (
        ChatCompletionChunk,
        ChatCompletionMessageFunctionToolCallParam,
        ChatCompletionMessageParam,
    )
    from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCallFunction

__all__ = ["OpenAIChatModel", "openai_client", "provider_error_from_openai"]

# Compatible servers ignore the key, but the SDK refuses to start without one.
_PLACEHOLDER_KEY = "lodger-placeholder-key"
# Fields OpenAI-compatible servers use for streamed chain-of-thought text.
_REASONING_FIELDS = ("reasoning_content", "reasoning")


class OpenAIChatModel:
    """A ``Model`` over streaming Chat Completions; ``base_url`` selects a compatible server.

    Structured output (``output_mode``, ``"native"`` by default): ``native`` sends the
    schema as ``response_format`` (``json_schema``; ``strict`` only when the schema fits
    OpenAI's strict subset, see ``_openai_schema``), ``tool`` offers the output tool and
    forces a tool call, ``prompted`` sends nothing extra.

    Settings: ``temperature``, ``top_p``, ``max_tokens`` (``max_completion_tokens`` on
    OpenAI, ``max_tokens`` on a compatible server), ``stop``, ``seed``,
    ``parallel_tool_calls`` (only when tools are sent), ``reasoning_effort``; ``extra``
    goes into the body as is. None is ignored.

    Media: images (``image_url``, bytes as a ``data:`` URL or the URL itself) and PDFs
    (``file`` parts, bytes only: Chat Completions takes no document URL, so one is a
    ``ProviderError`` before sending). Tool messages carry text only, so the images and
    documents of a step's tool results go in one user message right after that step's
    tool messages.
    """

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
        folded = _ChunkFolder(guarded_sink(on_text))
        messages = _chat_messages(request, self.spec)  # may refuse a part before sending
        tools = chat_tools(request)
        params: dict[str, Any] = chat_settings(
            request, tools, compatible=self._base_url is not None
        )
        response_format = chat_output(request)
        if response_format is not None:
            params["response_format"] = response_format
        try:
            stream = await self._client.chat.completions.create(
                model=self._model,
                messages=messages,
                tools=cast("Any", tools) if tools else openai.omit,
                stream=True,
                stream_options={"include_usage": True},
                **params,
            )
            async with stream:
                async for chunk in stream:
                    folded.feed(chunk)
            if folded.finish_reason is None:
                raise stream_unfinished(self.spec, "the model finished its answer")
            response = sized(folded.response())
        except openai.OpenAIError as exc:
            raise provider_error_from_openai(exc, spec=self.spec) from exc
        except SinkFailed as exc:
            raise exc.__cause__ or exc from None
        except MALFORMED as exc:
            raise malformed(self.spec, exc) from exc
        # Tool mode: the lone output call is the answer, as text the engine validates.
        answer, calls = take_output_call(response.calls, request)
        if answer is not None:
            return replace(response, text=answer, calls=())
        return replace(response, calls=calls) if calls != response.calls else response


def _call_id(call_id: str) -> str:
    """OpenAI refuses a call id longer than 40 characters (lodger's own are 41, another
    provider's may be longer): such an id goes as a stable digest."""
    return wire_call_id(call_id, max_len=40, plain=False, prefix="call_")


def _chat_messages(request: ModelRequest, spec: str) -> list[ChatCompletionMessageParam]:
    """The request's system prompt and history as Chat Completions messages; the media
    of a step's tool results follow its tool messages as one user message."""
    out: list[ChatCompletionMessageParam] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    result_media: list[dict[str, Any]] = []

    def flush_media() -> None:
        if result_media:
            out.append(
                cast("ChatCompletionMessageParam", {"role": "user", "content": list(result_media)})
            )
            result_media.clear()

    for message in request.messages:
        if isinstance(message, ToolResultMessage):
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": _call_id(message.call_id),
                    "content": message.content,
                }
            )
            if message.parts:
                call = _call_id(message.call_id)
                label = f"The images and documents the {message.name} call {call} returned:"
                result_media.append({"type": "text", "text": label})
                result_media.extend(chat_media_parts(message.parts, spec))
            continue
        flush_media()
        if isinstance(message, UserMessage):
            out.append(_user_message(message, spec))
        elif isinstance(message, AssistantMessage):
            out.append(_assistant_message(message))
    flush_media()
    return out


def _user_message(message: UserMessage, spec: str) -> ChatCompletionMessageParam:
    if not message.parts:
        return {"role": "user", "content": message.text}
    content = chat_media_parts(message.parts, spec)
    if message.text:
        content.append({"type": "text", "text": message.text})
    return cast("ChatCompletionMessageParam", {"role": "user", "content": content})


def _assistant_message(message: AssistantMessage) -> ChatCompletionMessageParam:
    calls: list[ChatCompletionMessageFunctionToolCallParam] = [
        {
            "id": _call_id(call.call_id),
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call in message.calls
    ]
    if calls:
        return {"role": "assistant", "content": message.text or None, "tool_calls": calls}
    return {"role": "assistant", "content": message.text}


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
            details = chunk.usage.prompt_tokens_details
            cached = details.cached_tokens if details is not None else None
            self.usage = Usage(
                input_tokens=token_count(chunk.usage.prompt_tokens, "prompt"),
                output_tokens=token_count(chunk.usage.completion_tokens, "completion"),
                # Part of input_tokens, which counts the whole prompt.
                cache_read_tokens=token_count(cached, "cached"),
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
        too_long = names_context_length(f"{exc.code or ''} {exc.message}")
        return ProviderError(
            f"{spec}: the stream failed: {brief(exc.message)}",
            retryable=kind not in _REQUEST_FAULTS and not too_long,
            code="context_length" if too_long else "provider_stream",
        )
    return ProviderError(f"{spec}: {brief(exc)}", retryable=False, code="provider_client")

"""OpenAI Responses API: typed input items in, a stream of typed events out.

The history goes in as input items: user and assistant messages, ``function_call`` items
for the calls the model made and ``function_call_output`` items for their results, paired
by ``call_id``. Each request carries the whole projection, so no server-side state
(``previous_response_id``) is needed and a resumed session replays exactly what its log
holds.

    model = OpenAIResponsesModel(model="gpt-5", reasoning_summary="auto")
    response = await model.complete(request, on_text=print)

Function call arguments stream as deltas per output item; the ``done`` events carry the
whole text, which wins over the joined deltas when both are present.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from lodger._core.extras import require
from lodger.errors import ProviderError
from lodger.events import ProposedCall, Usage
from lodger.providers._errors import (
    ANSWER_TIMEOUT,
    MALFORMED,
    SinkFailed,
    brief,
    finish_reason,
    guarded_sink,
    malformed,
    sized,
    stream_unfinished,
    token_count,
    within,
)
from lodger.providers._openai_request import (
    response_media_parts,
    response_output,
    response_settings,
    response_tools,
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
from lodger.providers.openai_chat import openai_client, provider_error_from_openai

with require("openai", "the OpenAI Responses provider"):
    import openai
    from openai.types.responses import (
        ResponseCompletedEvent,
        ResponseErrorEvent,
        ResponseFailedEvent,
        ResponseFunctionCallArgumentsDeltaEvent,
        ResponseFunctionCallArgumentsDoneEvent,
        ResponseFunctionToolCall,
        ResponseIncompleteEvent,
        ResponseInputParam,
        ResponseOutputItemAddedEvent,
        ResponseOutputItemDoneEvent,
        ResponseReasoningItem,
        ResponseReasoningSummaryTextDeltaEvent,
        ResponseReasoningTextDeltaEvent,
        ResponseStreamEvent,
        ResponseTextDeltaEvent,
    )
    from openai.types.responses.response import Response

__all__ = ["OpenAIResponsesModel"]

# Failure codes of a response that are the server's trouble, worth another attempt.
_TRANSIENT_CODES = frozenset({"server_error", "rate_limit_exceeded", "vector_store_timeout"})

ReasoningSummary = Literal["auto", "concise", "detailed"]


# The key of this adapter's entry in provider_state.
_STATE_KEY = "openai_responses"


class OpenAIResponsesModel:
    """A ``Model`` over the streaming Responses API (``client.responses.create``).

    ``reasoning_summary`` asks reasoning models for a summary of their thinking, which
    lands in ``ModelResponse.reasoning``; leave it ``None`` for models without reasoning.

    Structured output (``output_mode``, ``"native"`` by default): ``native`` sends the
    schema as ``text.format`` (``json_schema``; ``strict`` only when the schema fits
    OpenAI's strict subset, see ``_openai_schema``), ``tool`` offers the output tool and
    forces a tool call, ``prompted`` sends nothing extra.

    Settings: ``temperature``, ``top_p``, ``max_tokens`` (``max_output_tokens``),
    ``parallel_tool_calls`` (only when tools are sent), ``reasoning_effort``
    (``reasoning.effort``, next to the summary); ``extra`` goes into the body as is. The
    Responses API has no ``stop`` and no ``seed``: those two are ignored.

    Media: images (``input_image``) and PDFs (``input_file``), from bytes or a URL, in
    user messages and in tool results (a ``function_call_output`` takes them itself).
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
        reasoning_summary: ReasoningSummary | None = None,
        replay_reasoning: bool = False,
    ) -> None:
        self._model = model
        self._answer_timeout = answer_timeout  # the whole answer (timeout: each read)
        self._reasoning_summary = reasoning_summary
        # Stateless replay of reasoning models: ask for the encrypted reasoning items, keep
        # them as provider_state, and send them back before the calls they led to.
        self._replay_reasoning = replay_reasoning
        self._client = openai_client(
            base_url=base_url, api_key=api_key, max_retries_sdk=max_retries_sdk, timeout=timeout
        )

    @property
    def spec(self) -> str:
        # The spec grammar has no URL form for Responses; OPENAI_BASE_URL covers that case.
        return f"responses:{self._model}"

    async def aclose(self) -> None:
        """Close the HTTP connections the SDK client holds."""
        await self._client.close()

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        return await within(self.spec, self._answer_timeout, self._complete(request, on_text))

    async def _complete(self, request: ModelRequest, on_text: TextSink | None) -> ModelResponse:
        summary = {"summary": self._reasoning_summary} if self._reasoning_summary else {}
        folded = _EventFolder(guarded_sink(on_text))
        items = _response_input(request, self.spec)  # may refuse a part before sending
        tools = response_tools(request)
        params = response_settings(request, tools, reasoning=summary)
        text = response_output(request)
        if text is not None:
            params["text"] = text
        try:
            stream = await self._client.responses.create(
                model=self._model,
                input=items,
                instructions=request.system or openai.omit,
                tools=cast("Any", tools) if tools else openai.omit,
                include=(
                    ["reasoning.encrypted_content"] if self._replay_reasoning else openai.omit
                ),
                store=False if self._replay_reasoning else openai.omit,
                stream=True,
                **params,
            )
            async with stream:
                async for event in stream:
                    self._check_failure(event)
                    folded.feed(event)
            if folded.finish_reason is None:
                raise stream_unfinished(self.spec, "the response completed")
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

    def _check_failure(self, event: ResponseStreamEvent) -> None:
        """Turn the in-stream failure events into a ``ProviderError``."""
        if isinstance(event, ResponseErrorEvent):
            raise ProviderError(
                f"{self.spec}: the stream failed: {brief(event.message)}",
                retryable=(event.code or "server_error") in _TRANSIENT_CODES,
                code="provider_stream",
            )
        if isinstance(event, ResponseFailedEvent):
            error = event.response.error
            code = error.code if error is not None else "server_error"
            message = error.message if error is not None else "no reason given"
            too_long = names_context_length(f"{code} {message}")
            raise ProviderError(
                f"{self.spec}: the response failed ({code}): {brief(message)}",
                retryable=code in _TRANSIENT_CODES and not too_long,
                code="context_length" if too_long else "provider_failed",
            )


def _response_input(request: ModelRequest, spec: str) -> ResponseInputParam:
    """The history as Responses input items, calls and results paired by ``call_id``."""
    items: ResponseInputParam = []
    for message in request.messages:
        if isinstance(message, UserMessage):
            content: Any = message.text
            if message.parts:
                content = response_media_parts(message.parts, spec)
                if message.text:
                    content.append({"type": "input_text", "text": message.text})
            items.append({"type": "message", "role": "user", "content": content})
        elif isinstance(message, AssistantMessage):
            items.extend(_reasoning_items(message))
            if message.text:
                items.append({"type": "message", "role": "assistant", "content": message.text})
            for call in message.calls:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.call_id,
                        "name": call.name,
                        "arguments": call.arguments,
                    }
                )
        elif isinstance(message, ToolResultMessage):
            output: Any = message.content
            if message.parts:
                text = [{"type": "input_text", "text": message.content}] if message.content else []
                output = [*text, *response_media_parts(message.parts, spec)]
            items.append(
                {"type": "function_call_output", "call_id": message.call_id, "output": output}
            )
    return items


def _reasoning_items(message: AssistantMessage) -> list[Any]:
    """The reasoning items this adapter recorded with the output, sent back verbatim."""
    state = (message.provider_state or {}).get(_STATE_KEY)
    items = state.get("reasoning") if isinstance(state, dict) else None
    if not isinstance(items, list):
        return []
    return [item for item in items if isinstance(item, dict)]


@dataclass
class _PendingCall:
    call_id: str = ""
    name: str = ""
    deltas: list[str] = field(default_factory=list)
    arguments: str | None = None  # the whole text, once a done event gave it

    def take(self, item: ResponseFunctionToolCall) -> None:
        self.call_id, self.name = item.call_id or self.call_id, item.name or self.name
        if item.arguments:
            self.arguments = item.arguments


class _EventFolder:
    """Accumulates stream events into one answer; calls keep their output order."""

    def __init__(self, on_text: TextSink | None) -> None:
        self._on_text = on_text
        self._text: list[str] = []
        self._summary: list[str] = []
        self._summary_part: tuple[str, int] | None = None
        self._reasoning_text: list[str] = []
        self._calls: dict[int, _PendingCall] = {}  # by output index
        self._reasoning_items: dict[int, dict[str, Any]] = {}  # by output index
        self.usage: Usage | None = None
        self.finish_reason: str | None = None

    def _call(self, output_index: int) -> _PendingCall:
        return self._calls.setdefault(output_index, _PendingCall())

    def feed(self, event: ResponseStreamEvent) -> None:
        if isinstance(event, ResponseTextDeltaEvent):
            self._text.append(event.delta)
            if self._on_text is not None:
                self._on_text(event.delta)
        elif isinstance(event, ResponseReasoningSummaryTextDeltaEvent):
            part = (event.item_id, event.summary_index)
            if self._summary and part != self._summary_part:
                self._summary.append("\n\n")  # summaries come in parts; keep them apart
            self._summary_part = part
            self._summary.append(event.delta)
        elif isinstance(event, ResponseReasoningTextDeltaEvent):
            self._reasoning_text.append(event.delta)
        elif isinstance(event, ResponseOutputItemAddedEvent | ResponseOutputItemDoneEvent):
            if isinstance(event.item, ResponseFunctionToolCall):
                self._call(event.output_index).take(event.item)
            elif (
                isinstance(event, ResponseOutputItemDoneEvent)
                and isinstance(event.item, ResponseReasoningItem)
                and event.item.encrypted_content
            ):
                self._reasoning_items[event.output_index] = event.item.model_dump(
                    mode="json", exclude_none=True, exclude={"status"}
                )
        elif isinstance(event, ResponseFunctionCallArgumentsDeltaEvent):
            self._call(event.output_index).deltas.append(event.delta)
        elif isinstance(event, ResponseFunctionCallArgumentsDoneEvent):
            self._call(event.output_index).arguments = event.arguments
        elif isinstance(event, ResponseCompletedEvent):
            self._finish(event.response, "completed")
        elif isinstance(event, ResponseIncompleteEvent):
            details = event.response.incomplete_details
            self._finish(event.response, (details and details.reason) or "incomplete")

    def _finish(self, response: Response, reason: str) -> None:
        self.finish_reason = finish_reason(reason)
        if response.usage is not None:
            details = response.usage.input_tokens_details
            cached = details.cached_tokens if details is not None else None
            self.usage = Usage(
                input_tokens=token_count(response.usage.input_tokens, "input"),
                output_tokens=token_count(response.usage.output_tokens, "output"),
                # Part of input_tokens, which counts the whole prompt.
                cache_read_tokens=token_count(cached, "cached"),
            )

    def response(self) -> ModelResponse:
        calls = tuple(
            ProposedCall(
                call_id=pending.call_id or f"call_{index}",
                name=pending.name,
                arguments=(
                    pending.arguments if pending.arguments is not None else "".join(pending.deltas)
                )
                or "{}",
            )
            for index, pending in sorted(self._calls.items())
        )
        return ModelResponse(
            text="".join(self._text),
            reasoning="".join(self._summary) or "".join(self._reasoning_text),
            calls=calls,
            usage=self.usage,
            finish_reason=self.finish_reason,
            provider_state=(
                {_STATE_KEY: {"reasoning": [i for _, i in sorted(self._reasoning_items.items())]}}
                if self._reasoning_items
                else None
            ),
        )

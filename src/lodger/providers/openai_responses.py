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

from dataclasses import dataclass, field
from typing import Any, Literal

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
from lodger.providers.base import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    TextSink,
    ToolResultMessage,
    UserMessage,
)
from lodger.providers.openai_chat import openai_client, provider_error_from_openai

with require("openai", "the OpenAI Responses provider"):
    import openai
    from openai.types.responses import (
        FunctionToolParam,
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
    from openai.types.shared_params import Reasoning

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
    """

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
        reasoning: Reasoning | openai.Omit = openai.omit
        if self._reasoning_summary is not None:
            reasoning = {"summary": self._reasoning_summary}
        folded = _EventFolder(guarded_sink(on_text))
        try:
            stream = await self._client.responses.create(
                model=self._model,
                input=_response_input(request),
                instructions=request.system or openai.omit,
                tools=_response_tools(request) or openai.omit,
                max_output_tokens=(
                    request.max_output_tokens
                    if request.max_output_tokens is not None
                    else openai.omit
                ),
                reasoning=reasoning,
                include=(
                    ["reasoning.encrypted_content"] if self._replay_reasoning else openai.omit
                ),
                store=False if self._replay_reasoning else openai.omit,
                stream=True,
            )
            async with stream:
                async for event in stream:
                    self._check_failure(event)
                    folded.feed(event)
            if folded.finish_reason is None:
                raise stream_unfinished(self.spec, "the response completed")
            return sized(folded.response())
        except openai.OpenAIError as exc:
            raise provider_error_from_openai(exc, spec=self.spec) from exc
        except SinkFailed as exc:
            raise exc.__cause__ or exc from None
        except MALFORMED as exc:
            raise malformed(self.spec, exc) from exc

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
            raise ProviderError(
                f"{self.spec}: the response failed ({code}): {brief(message)}",
                retryable=code in _TRANSIENT_CODES,
                code="provider_failed",
            )


def _response_input(request: ModelRequest) -> ResponseInputParam:
    """The history as Responses input items, calls and results paired by ``call_id``."""
    items: ResponseInputParam = []
    for message in request.messages:
        if isinstance(message, UserMessage):
            items.append({"type": "message", "role": "user", "content": message.text})
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
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.call_id,
                    "output": message.content,
                }
            )
    return items


def _reasoning_items(message: AssistantMessage) -> list[Any]:
    """The reasoning items this adapter recorded with the output, sent back verbatim."""
    state = (message.provider_state or {}).get(_STATE_KEY)
    items = state.get("reasoning") if isinstance(state, dict) else None
    if not isinstance(items, list):
        return []
    return [item for item in items if isinstance(item, dict)]


def _response_tools(request: ModelRequest) -> list[FunctionToolParam]:
    # strict=False: our schemas are plain JSON schemas, not the strict-mode subset.
    return [
        {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "strict": False,
        }
        for tool in request.tools
    ]


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
            self.usage = Usage(
                input_tokens=token_count(response.usage.input_tokens, "input"),
                output_tokens=token_count(response.usage.output_tokens, "output"),
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

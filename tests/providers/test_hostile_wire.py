"""Audit: provider streams that break their own wire format, against the three adapters
over a real loopback server (``wire_server``). The SDKs build stream events without
validating them, so a null delta, text that is an object, a frame that is not JSON or a
token count that is not one used to escape the adapter as a raw ``AttributeError``,
``TypeError``, ``JSONDecodeError`` or pydantic error (a traceback out of the turn), and a
negative usage count was recorded as is, lowering the turn's usage. Each is now a
``ProviderError`` with code ``provider_protocol``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import pytest
from wire_server import Fail, Stream, WireServer, sse

from lodger.errors import ProviderError
from lodger.events import Usage
from lodger.providers.anthropic import AnthropicModel
from lodger.providers.base import Model, ModelRequest, UserMessage
from lodger.providers.openai_chat import OpenAIChatModel
from lodger.providers.openai_responses import OpenAIResponsesModel

HELLO = ModelRequest(system="", messages=(UserMessage(text="hi"),))
Frame = tuple[str | None, str]


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


def chunk(delta: Any = None, *, finish: Any = None, usage: Any = None) -> Frame:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    return sse(body)


def chat_usage(prompt: Any, completion: Any) -> list[Frame]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": 1}
    return [chunk({"content": "hi"}), chunk({}, finish="stop"), chunk(usage=usage), sse("[DONE]")]


async def complete(model: Model, **options: Any) -> Any:
    try:
        return await model.complete(HELLO, **options)
    finally:
        await model.aclose()  # type: ignore[attr-defined]


def chat(server: WireServer) -> OpenAIChatModel:
    return OpenAIChatModel(model="m", base_url=f"{server.base_url}/v1", api_key="k", timeout=10)


MALFORMED_CHAT = {
    "a frame that is not JSON": [sse("{not json"), chunk({}, finish="stop"), sse("[DONE]")],
    "a null delta": [
        sse({"id": "c", "choices": [{"index": 0, "delta": None, "finish_reason": None}]}),
        chunk({}, finish="stop"),
        sse("[DONE]"),
    ],
    "content that is an object": [chunk({"content": {"a": 1}}), chunk({}, finish="stop")],
    "a negative prompt count": chat_usage(-5, 1),
    "a count of 1e300": chat_usage(1e300, 1),
    "a count past 2**53": chat_usage(2**60, 1),
}


@pytest.mark.parametrize("case", list(MALFORMED_CHAT))
async def test_chat_stream_the_sdk_cannot_fold_is_a_protocol_error(
    server: WireServer, case: str
) -> None:
    server.push(Stream(MALFORMED_CHAT[case]))
    with pytest.raises(ProviderError) as caught:
        await complete(chat(server))
    assert caught.value.code == "provider_protocol"
    assert not caught.value.retryable
    assert "cannot read" in caught.value.message


async def test_chat_null_usage_counts_as_none_counted(server: WireServer) -> None:
    server.push(Stream(chat_usage(None, None)))
    response = await complete(chat(server))
    assert response.text == "hi" and response.usage == Usage(input_tokens=0, output_tokens=0)


async def test_the_callers_own_sink_error_is_raised_as_it_is(server: WireServer) -> None:
    server.push(Stream(chat_usage(1, 1)))

    def sink(text: str) -> None:
        raise TypeError("the caller's sink is broken")

    with pytest.raises(TypeError, match="the caller's sink is broken"):
        await complete(chat(server), on_text=sink)


def anthropic_frames(usage: dict[str, Any], output_tokens: Any = 2) -> list[Frame]:
    def event(kind: str, **fields: Any) -> Frame:
        return sse({"type": kind, **fields}, event=kind)

    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return [
        event("message_start", message=message),
        event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        event("content_block_delta", index=0, delta={"type": "text_delta", "text": "hi"}),
        event("content_block_stop", index=0),
        event(
            "message_delta",
            delta={"stop_reason": "end_turn", "stop_sequence": None},
            usage={"output_tokens": output_tokens},
        ),
        event("message_stop"),
    ]


@pytest.mark.parametrize(
    ("usage", "output_tokens"),
    [
        ({"input_tokens": -1000, "output_tokens": 1}, 2),
        ({"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": -3}, 2),
        ({"input_tokens": 5, "output_tokens": 1}, -2),
        ({"input_tokens": None, "output_tokens": 1}, 2),
    ],
)
async def test_anthropic_usage_that_is_no_count_is_a_protocol_error(
    server: WireServer, usage: dict[str, Any], output_tokens: Any
) -> None:
    server.push(Stream(anthropic_frames(usage, output_tokens)))
    model = AnthropicModel(model="claude-test", base_url=server.base_url, api_key="sk-ant-test")
    if usage["input_tokens"] is None:  # not counted: zero, as a missing count is
        response = await complete(model)
        assert response.usage == Usage(input_tokens=0, output_tokens=2)
        return
    with pytest.raises(ProviderError) as caught:
        await complete(model)
    assert caught.value.code == "provider_protocol"


def responses_completed(usage: dict[str, Any]) -> list[Frame]:
    body = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": "completed",
        "model": "m",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }
    return [sse({"type": "response.completed", "response": body, "sequence_number": 1})]


async def test_responses_negative_usage_is_a_protocol_error(server: WireServer) -> None:
    usage = {"input_tokens": 3, "output_tokens": -40, "total_tokens": -37}
    server.push(Stream(responses_completed(usage)))
    model = OpenAIResponsesModel(model="m", base_url=f"{server.base_url}/v1", api_key="k")
    with pytest.raises(ProviderError) as caught:
        await complete(model)
    assert caught.value.code == "provider_protocol"
    assert "-40" in caught.value.message


async def test_responses_usage_that_counts_is_kept(server: WireServer) -> None:
    usage = {"input_tokens": 3, "output_tokens": 40, "total_tokens": 43}
    server.push(Stream(responses_completed(usage)))
    model = OpenAIResponsesModel(model="m", base_url=f"{server.base_url}/v1", api_key="k")
    response = await complete(model)
    assert response.usage == Usage(input_tokens=3, output_tokens=40)


class _Drip(Sequence[Frame]):
    """Frames for ever, one every 50 ms: each read is quick, the answer never ends."""

    def __init__(self, frame: Frame) -> None:
        self._frame = frame

    def __len__(self) -> int:
        return 2**62

    @overload
    def __getitem__(self, index: int) -> Frame: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Frame]: ...
    def __getitem__(self, index: int | slice) -> Frame | Sequence[Frame]:
        if isinstance(index, slice):
            raise TypeError("no slices of an endless stream")
        time.sleep(0.05)  # the server's own thread
        return self._frame


DRIPS: dict[str, tuple[Callable[[WireServer], Model], Frame]] = {
    "chat": (
        lambda s: OpenAIChatModel(
            model="m", base_url=f"{s.base_url}/v1", api_key="k", timeout=5, answer_timeout=1
        ),
        chunk({"content": "."}),
    ),
    "responses": (
        lambda s: OpenAIResponsesModel(
            model="m", base_url=f"{s.base_url}/v1", api_key="k", timeout=5, answer_timeout=1
        ),
        sse(
            {
                "type": "response.output_text.delta",
                "item_id": "m",
                "output_index": 0,
                "content_index": 0,
                "delta": ".",
                "logprobs": [],
                "sequence_number": 1,
            },
            event="response.output_text.delta",
        ),
    ),
    "anthropic": (
        lambda s: AnthropicModel(
            model="c", base_url=s.base_url, api_key="k", timeout=5, answer_timeout=1
        ),
        sse({"type": "ping"}, event="ping"),
    ),
}


@pytest.mark.parametrize("adapter", list(DRIPS))
async def test_a_stream_that_never_ends_times_out_as_a_whole(
    server: WireServer, adapter: str
) -> None:
    # Each frame comes well within the per-read timeout (5 s); before the fix the
    # adapter read for ever. Now the whole answer has answer_timeout (1 s here).
    make, frame = DRIPS[adapter]
    server.push(Stream(_Drip(frame)))
    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        await asyncio.wait_for(complete(make(server)), 30)  # the test's own backstop
    assert caught.value.code == "provider_timeout" and caught.value.retryable
    assert "did not finish within 1 s" in caught.value.message
    assert time.monotonic() - started < 15


ADAPTERS: dict[str, Callable[[WireServer], Model]] = {
    "chat": lambda s: OpenAIChatModel(model="m", base_url=f"{s.base_url}/v1", api_key="k"),
    "responses": lambda s: OpenAIResponsesModel(
        model="m", base_url=f"{s.base_url}/v1", api_key="k"
    ),
    "anthropic": lambda s: AnthropicModel(model="c", base_url=s.base_url, api_key="k"),
}
PAGE = "<html><body>" + "Service Unavailable " * 100_000 + "</body></html>"  # 2 MB


@pytest.mark.parametrize("adapter", list(ADAPTERS))
async def test_a_huge_error_page_is_cut_in_the_error_message(
    server: WireServer, adapter: str
) -> None:
    # The whole 2 MB body used to become the message: copied into every retry's
    # provider_retried event and printed on the terminal.
    server.push(Fail(503, {"error": {"message": PAGE, "type": "overloaded_error"}}))
    with pytest.raises(ProviderError) as caught:
        await complete(ADAPTERS[adapter](server))
    assert caught.value.code == "provider_unavailable" and caught.value.retryable
    assert len(caught.value.message) < 2500
    assert "<html><body>Service Unavailable" in caught.value.message
    assert "more characters cut" in caught.value.message


async def test_a_huge_error_event_inside_a_chat_stream_is_cut(server: WireServer) -> None:
    server.push(Stream([chunk({"content": "hi"}), sse({"error": {"message": PAGE}})]))
    with pytest.raises(ProviderError) as caught:
        await complete(chat(server))
    assert caught.value.code == "provider_stream"
    assert len(caught.value.message) < 2500 and "more characters cut" in caught.value.message


@pytest.mark.parametrize("adapter", ["chat", "anthropic"])
async def test_an_answer_of_megabytes_is_refused_before_it_reaches_the_log(
    server: WireServer, adapter: str
) -> None:
    # 5 MB of text in one answer (real models stop far below): it used to be returned
    # whole, to be recorded as one event of that size.
    words = "many words " * 500_000
    if adapter == "chat":
        frames = [chunk({"content": words}), chunk({}, finish="stop"), sse("[DONE]")]
    else:
        frames = anthropic_frames({"input_tokens": 1, "output_tokens": 1})
        frames[2] = sse(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": words},
            },
            event="content_block_delta",
        )
    server.push(Stream(frames))
    with pytest.raises(ProviderError) as caught:
        await complete(ADAPTERS[adapter](server))
    assert caught.value.code == "provider_protocol"
    assert "the answer holds 5500000 characters, more than 4000000" in caught.value.message


@pytest.mark.parametrize("reason", [{"x": 1}, 12345, "z" * 1_000_000], ids=["dict", "int", "1MB"])
async def test_a_finish_reason_that_is_no_short_string_is_a_protocol_error(
    server: WireServer, reason: Any
) -> None:
    # It used to be returned as is: a dict or a number then failed the model_output
    # event's validation in the loop (a traceback), a megabyte was recorded.
    server.push(Stream([chunk({"content": "hi"}), chunk({}, finish=reason), sse("[DONE]")]))
    with pytest.raises(ProviderError) as caught:
        await complete(chat(server))
    assert caught.value.code == "provider_protocol"
    assert "finish reason" in caught.value.message


async def test_an_anthropic_stop_reason_that_is_an_object_is_a_protocol_error(
    server: WireServer,
) -> None:
    frames = anthropic_frames({"input_tokens": 1, "output_tokens": 1})
    frames[4] = sse(
        {
            "type": "message_delta",
            "delta": {"stop_reason": {"why": "no"}, "stop_sequence": None},
            "usage": {"output_tokens": 2},
        },
        event="message_delta",
    )
    server.push(Stream(frames))
    with pytest.raises(ProviderError) as caught:
        await complete(ADAPTERS["anthropic"](server))
    assert caught.value.code == "provider_protocol"


async def test_an_unknown_but_short_finish_reason_is_kept(server: WireServer) -> None:
    server.push(Stream([chunk({"content": "hi"}), chunk({}, finish="banana"), sse("[DONE]")]))
    response = await complete(chat(server))
    assert response.finish_reason == "banana" and response.text == "hi"


@pytest.mark.parametrize(
    "piece",
    [
        {"index": 0, "id": {"a": 1}, "function": {"name": "x", "arguments": "{}"}},
        {"index": 0, "id": "c", "function": {"name": 7, "arguments": "{}"}},
        {"index": 0, "id": "c", "function": {"name": "x", "arguments": {"a": 1}}},
    ],
    ids=["id-object", "name-number", "arguments-object"],
)
async def test_a_tool_call_of_the_wrong_types_is_a_one_line_protocol_error(
    server: WireServer, piece: dict[str, Any]
) -> None:
    server.push(
        Stream([chunk({"tool_calls": [piece]}), chunk({}, finish="tool_calls"), sse("[DONE]")])
    )
    with pytest.raises(ProviderError) as caught:
        await complete(chat(server))
    assert caught.value.code == "provider_protocol"
    assert "\n" not in caught.value.message

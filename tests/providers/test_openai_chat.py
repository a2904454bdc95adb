"""OpenAIChatModel against a real loopback server speaking Chat Completions over SSE."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from wire_server import (
    READ_SCHEMA,
    SEARCH_SCHEMA,
    Fail,
    Stream,
    WireServer,
    closed_port,
    history_request,
    sse,
)

from lodger.errors import ConfigError, ProviderError
from lodger.events import ProposedCall, Usage
from lodger.providers.base import ModelRequest, UserMessage
from lodger.providers.openai_chat import OpenAIChatModel

HELLO = ModelRequest(system="", messages=(UserMessage(text="hi"),))


def chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
) -> tuple[str | None, str]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-test",
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    return sse(body)


def usage_chunk(prompt: int, completion: int) -> tuple[str | None, str]:
    return chunk(
        usage={
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
    )


def call_piece(
    index: int, arguments: str, *, call_id: str | None = None, name: str | None = None
) -> tuple[str | None, str]:
    piece: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        piece |= {"id": call_id, "type": "function"}
        piece["function"]["name"] = name
    return chunk({"tool_calls": [piece]})


DONE = sse("[DONE]")


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


@pytest.fixture
async def model(server: WireServer) -> AsyncIterator[OpenAIChatModel]:
    chat = OpenAIChatModel(model="gpt-test", base_url=f"{server.base_url}/v1", api_key="sk-test")
    yield chat
    await chat.aclose()


async def test_text_streams_in_deltas(server: WireServer, model: OpenAIChatModel) -> None:
    server.push(
        Stream(
            [
                chunk({"role": "assistant", "content": ""}),
                chunk({"content": "Hel"}),
                chunk({"content": "lo, "}),
                chunk({"content": "world"}),
                chunk({}, finish="stop"),
                usage_chunk(11, 3),
                DONE,
            ]
        )
    )
    seen: list[str] = []

    response = await model.complete(HELLO, on_text=seen.append)

    assert seen == ["Hel", "lo, ", "world"]
    assert response.text == "Hello, world"
    assert response.calls == ()
    assert response.usage == Usage(input_tokens=11, output_tokens=3)
    assert response.finish_reason == "stop"


async def test_two_tool_calls_with_split_arguments(
    server: WireServer, model: OpenAIChatModel
) -> None:
    server.push(
        Stream(
            [
                chunk({"role": "assistant", "content": "Checking."}),
                call_piece(0, "", call_id="call_a", name="read_file"),
                call_piece(0, '{"pa'),
                call_piece(1, '{"pattern":', call_id="call_b", name="search"),
                call_piece(0, 'th": "a.txt"}'),
                call_piece(1, ' "TODO", '),
                call_piece(1, '"path": "."}'),
                chunk({}, finish="tool_calls"),
                usage_chunk(50, 20),
                DONE,
            ]
        )
    )

    response = await model.complete(HELLO)

    assert response.text == "Checking."
    assert response.calls == (
        ProposedCall(call_id="call_a", name="read_file", arguments='{"path": "a.txt"}'),
        ProposedCall(call_id="call_b", name="search", arguments='{"pattern": "TODO", "path": "."}'),
    )
    assert response.finish_reason == "tool_calls"
    assert response.usage == Usage(input_tokens=50, output_tokens=20)


async def test_request_wire_shape(server: WireServer, model: OpenAIChatModel) -> None:
    server.push(Stream([chunk({"content": "ok"}, finish="stop"), DONE]))

    await model.complete(history_request(max_output_tokens=256))

    [sent] = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test"
    body = sent.body
    assert body["model"] == "gpt-test"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 256  # a compatible server: the widely understood name
    assert "max_completion_tokens" not in body
    assert body["messages"] == [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "What is in a.txt, and where is TODO?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"pattern":"TODO","path":"."}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "hello"},
        {"role": "tool", "tool_call_id": "call_b", "content": "no match"},
        {"role": "user", "content": "Thanks, go on."},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a text file.",
                "parameters": READ_SCHEMA,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search files.",
                "parameters": SEARCH_SCHEMA,
            },
        },
    ]


async def test_no_tools_sends_no_tools_field(server: WireServer, model: OpenAIChatModel) -> None:
    server.push(Stream([chunk({"content": "ok"}, finish="stop"), DONE]))

    await model.complete(HELLO)

    body = server.requests[0].body
    assert "tools" not in body
    assert body["messages"] == [{"role": "user", "content": "hi"}]  # empty system is omitted


async def test_reasoning_from_compatible_server(server: WireServer, model: OpenAIChatModel) -> None:
    server.push(
        Stream(
            [
                chunk({"reasoning_content": "The user "}),
                chunk({"reasoning_content": "greets me."}),
                chunk({"content": "Hello!"}, finish="stop"),
                DONE,
            ]
        )
    )

    response = await model.complete(HELLO)

    assert response.reasoning == "The user greets me."
    assert response.text == "Hello!"


@pytest.mark.parametrize("status", [408, 409, 429, 500, 503])
async def test_transient_status_is_retryable(
    server: WireServer, model: OpenAIChatModel, status: int
) -> None:
    server.push(Fail(status, {"error": {"message": "try later", "type": "server_error"}}))

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is True
    assert caught.value.status == status
    assert isinstance(caught.value.__cause__, openai.APIStatusError)


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_client_error_is_not_retryable(
    server: WireServer, model: OpenAIChatModel, status: int
) -> None:
    server.push(Fail(status, {"error": {"message": "no", "type": "invalid_request_error"}}))

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is False
    assert caught.value.status == status
    assert "no" in caught.value.message


async def test_connection_refused_is_retryable() -> None:
    chat = OpenAIChatModel(
        model="gpt-test", base_url=f"http://127.0.0.1:{closed_port()}/v1", api_key="sk"
    )
    try:
        with pytest.raises(ProviderError) as caught:
            await chat.complete(HELLO)
    finally:
        await chat.aclose()

    assert caught.value.retryable is True
    assert caught.value.status is None
    assert caught.value.code == "provider_connection"


async def test_timeout_is_retryable(server: WireServer) -> None:
    chat = OpenAIChatModel(
        model="gpt-test", base_url=f"{server.base_url}/v1", api_key="sk", timeout=0.2
    )
    server.push(Stream([chunk({"content": "late"}, finish="stop"), DONE], delay=2))
    try:
        with pytest.raises(ProviderError) as caught:
            await chat.complete(HELLO)
    finally:
        await chat.aclose()

    assert caught.value.retryable is True
    assert caught.value.code == "provider_timeout"


async def test_dropped_stream_is_retryable(server: WireServer, model: OpenAIChatModel) -> None:
    server.push(Stream([chunk({"content": "Hel"})], cut=True))

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is True


async def test_stream_ending_without_finish_is_retryable(
    server: WireServer, model: OpenAIChatModel
) -> None:
    server.push(Stream([chunk({"content": "Hel"})]))

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is True
    assert caught.value.code == "provider_stream"


@pytest.mark.parametrize(
    ("kind", "retryable"), [("server_error", True), ("invalid_request_error", False)]
)
async def test_error_event_inside_stream(
    server: WireServer, model: OpenAIChatModel, kind: str, retryable: bool
) -> None:
    server.push(
        Stream([chunk({"content": "Hel"}), sse({"error": {"message": "boom", "type": kind}})])
    )

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is retryable
    assert "boom" in caught.value.message


def test_spec_names_the_server() -> None:
    assert OpenAIChatModel(model="gpt-5", api_key="sk").spec == "openai:gpt-5"
    compatible = OpenAIChatModel(model="qwen3", base_url="http://127.0.0.1:11434/v1")
    assert compatible.spec == "openai-compatible:http://127.0.0.1:11434/v1#qwen3"


def test_missing_key_for_openai_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    with pytest.raises(ConfigError) as caught:
        OpenAIChatModel(model="gpt-5")

    assert "OPENAI_API_KEY" in str(caught.value)


async def test_compatible_server_needs_no_key(
    server: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    chat = OpenAIChatModel(model="llama", base_url=f"{server.base_url}/v1")
    server.push(Stream([chunk({"content": "ok"}, finish="stop"), DONE]))
    try:
        response = await chat.complete(history_request(max_output_tokens=64))
    finally:
        await chat.aclose()

    assert response.text == "ok"
    assert server.requests[0].headers["authorization"].startswith("Bearer ")


async def test_openai_itself_gets_max_completion_tokens(
    server: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # OPENAI_BASE_URL points the plain "openai:" adapter at the loopback server.
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.base_url}/v1")
    chat = OpenAIChatModel(model="gpt-5", api_key="sk-test")
    server.push(Stream([chunk({"content": "ok"}, finish="stop"), DONE]))
    try:
        await chat.complete(history_request(max_output_tokens=64))
    finally:
        await chat.aclose()

    body = server.requests[0].body
    assert body["max_completion_tokens"] == 64
    assert "max_tokens" not in body

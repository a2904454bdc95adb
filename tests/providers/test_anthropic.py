"""AnthropicModel against a real loopback server speaking the Messages API over SSE."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
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
from lodger.providers.anthropic import AnthropicModel
from lodger.providers.base import (
    AssistantMessage,
    ModelRequest,
    ToolResultMessage,
    UserMessage,
)

HELLO = ModelRequest(system="", messages=(UserMessage(text="hi"),))
EPHEMERAL = {"type": "ephemeral"}


def event(kind: str, **fields: Any) -> tuple[str | None, str]:
    return sse({"type": kind, **fields}, event=kind)


def start(input_tokens: int = 1, **usage: int) -> tuple[str | None, str]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1, **usage},
    }
    return event("message_start", message=message)


def block_start(index: int, block: dict[str, Any]) -> tuple[str | None, str]:
    return event("content_block_start", index=index, content_block=block)


def text(index: int, piece: str) -> tuple[str | None, str]:
    return event("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})


def json_piece(index: int, piece: str) -> tuple[str | None, str]:
    delta = {"type": "input_json_delta", "partial_json": piece}
    return event("content_block_delta", index=index, delta=delta)


def tool_start(index: int, call_id: str, name: str) -> tuple[str | None, str]:
    return block_start(index, {"type": "tool_use", "id": call_id, "name": name, "input": {}})


def block_stop(index: int) -> tuple[str | None, str]:
    return event("content_block_stop", index=index)


def finish(stop_reason: str, output_tokens: int) -> list[tuple[str | None, str]]:
    return [
        event(
            "message_delta",
            delta={"stop_reason": stop_reason, "stop_sequence": None},
            usage={"output_tokens": output_tokens},
        ),
        event("message_stop"),
    ]


def say(words: str) -> list[tuple[str | None, str]]:
    return [
        start(),
        block_start(0, {"type": "text", "text": ""}),
        text(0, words),
        block_stop(0),
        *finish("end_turn", 2),
    ]


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


@pytest.fixture
async def model(server: WireServer) -> AsyncIterator[AnthropicModel]:
    claude = AnthropicModel(model="claude-test", base_url=server.base_url, api_key="sk-ant-test")
    yield claude
    await claude.aclose()


async def test_text_streams_in_deltas(server: WireServer, model: AnthropicModel) -> None:
    server.push(
        Stream(
            [
                start(10, cache_read_input_tokens=5),
                event("ping"),
                block_start(0, {"type": "text", "text": ""}),
                text(0, "Hel"),
                text(0, "lo, "),
                text(0, "world"),
                block_stop(0),
                *finish("end_turn", 7),
            ]
        )
    )
    seen: list[str] = []

    response = await model.complete(HELLO, on_text=seen.append)

    assert seen == ["Hel", "lo, ", "world"]
    assert response.text == "Hello, world"
    assert response.calls == ()
    # Cached prompt tokens count as input, as OpenAI's prompt_tokens do.
    assert response.usage == Usage(input_tokens=15, output_tokens=7, cache_read_tokens=5)
    assert response.finish_reason == "end_turn"


async def test_two_tool_calls_with_split_arguments(
    server: WireServer, model: AnthropicModel
) -> None:
    thinking = {"type": "thinking", "thinking": "", "signature": ""}
    server.push(
        Stream(
            [
                start(40),
                block_start(0, thinking),
                event(
                    "content_block_delta",
                    index=0,
                    delta={"type": "thinking_delta", "thinking": "Need the file."},
                ),
                block_stop(0),
                block_start(1, {"type": "text", "text": ""}),
                text(1, "Checking."),
                block_stop(1),
                tool_start(2, "toolu_a", "read_file"),
                json_piece(2, ""),
                json_piece(2, '{"pa'),
                json_piece(2, 'th": "a.txt"}'),
                block_stop(2),
                tool_start(3, "toolu_b", "search"),
                json_piece(3, '{"pattern":'),
                json_piece(3, ' "TODO", "path": "."}'),
                block_stop(3),
                *finish("tool_use", 25),
            ]
        )
    )

    response = await model.complete(HELLO)

    assert response.text == "Checking."
    assert response.reasoning == "Need the file."
    assert response.calls == (
        ProposedCall(call_id="toolu_a", name="read_file", arguments='{"path": "a.txt"}'),
        ProposedCall(
            call_id="toolu_b", name="search", arguments='{"pattern": "TODO", "path": "."}'
        ),
    )
    assert response.finish_reason == "tool_use"
    assert response.usage == Usage(input_tokens=40, output_tokens=25)


async def test_answer_with_text_and_calls_round_trips(
    server: WireServer, model: AnthropicModel
) -> None:
    server.push(
        Stream(
            [
                start(),
                block_start(0, {"type": "text", "text": ""}),
                text(0, "Reading."),
                block_stop(0),
                tool_start(1, "toolu_r", "read_file"),
                json_piece(1, '{"path": '),
                json_piece(1, '"b.txt"}'),
                block_stop(1),
                *finish("tool_use", 9),
            ]
        ),
        Stream(say("done")),
    )
    first = await model.complete(HELLO)
    [call] = first.calls
    follow_up = ModelRequest(
        system="",
        messages=(
            *HELLO.messages,
            AssistantMessage(text=first.text, calls=first.calls),
            ToolResultMessage(call_id=call.call_id, name=call.name, content="bee"),
        ),
    )

    await model.complete(follow_up)

    assert server.requests[1].body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading."},
                {
                    "type": "tool_use",
                    "id": "toolu_r",
                    "name": "read_file",
                    "input": {"path": "b.txt"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_r",
                    "content": "bee",
                    "is_error": False,
                    # the last block: the next step reads the cache up to here
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ]


async def test_call_without_arguments(server: WireServer, model: AnthropicModel) -> None:
    server.push(
        Stream([start(), tool_start(0, "toolu_n", "now"), block_stop(0), *finish("tool_use", 3)])
    )

    response = await model.complete(HELLO)

    assert response.calls == (ProposedCall(call_id="toolu_n", name="now", arguments="{}"),)


async def test_request_wire_shape(server: WireServer, model: AnthropicModel) -> None:
    server.push(Stream(say("ok")))

    await model.complete(history_request(max_output_tokens=256))

    [sent] = server.requests
    assert sent.path == "/v1/messages"
    # The SDK picks the header (x-api-key, or a bearer token in newer versions).
    credentials = (sent.headers.get("x-api-key"), sent.headers.get("authorization"))
    assert credentials in {("sk-ant-test", None), (None, "Bearer sk-ant-test")}
    body = sent.body
    assert body["model"] == "claude-test"
    assert body["stream"] is True
    assert body["max_tokens"] == 256
    # Breakpoints: the system prompt, the last tool, the last block before the newest
    # input (the tool results of the step before share its message) and the last block.
    assert body["system"] == [
        {"type": "text", "text": "You are a careful assistant.", "cache_control": EPHEMERAL}
    ]
    assert body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "What is in a.txt, and where is TODO?"}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "call_a",
                    "name": "read_file",
                    "input": {"path": "a.txt"},
                },
                {
                    "type": "tool_use",
                    "id": "call_b",
                    "name": "search",
                    "input": {"pattern": "TODO", "path": "."},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_a",
                    "content": "hello",
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "call_b",
                    "content": "no match",
                    "is_error": True,
                    "cache_control": EPHEMERAL,
                },
                {"type": "text", "text": "Thanks, go on.", "cache_control": EPHEMERAL},
            ],
        },
    ]
    assert body["tools"] == [
        {"name": "read_file", "description": "Read a text file.", "input_schema": READ_SCHEMA},
        {
            "name": "search",
            "description": "Search files.",
            "input_schema": SEARCH_SCHEMA,
            "cache_control": EPHEMERAL,
        },
    ]
    for absent in ("tool_choice", "thinking", "stop_sequences", "output_config", "temperature"):
        assert absent not in body


async def test_results_go_back_in_call_order(server: WireServer, model: AnthropicModel) -> None:
    server.push(Stream(say("ok")))
    calls = tuple(ProposedCall(call_id=f"toolu_{n}", name="now", arguments="{}") for n in range(3))
    request = ModelRequest(
        system="",
        messages=(
            UserMessage(text="times?"),
            AssistantMessage(calls=calls),
            ToolResultMessage(call_id="toolu_2", name="now", content="two"),
            ToolResultMessage(call_id="toolu_0", name="now", content="zero"),
            ToolResultMessage(call_id="toolu_1", name="now", content="one"),
        ),
    )

    await model.complete(request)

    body = server.requests[0].body
    assert body["max_tokens"] == 4096
    assert "system" not in body
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    results = body["messages"][2]["content"]
    assert [(r["tool_use_id"], r["content"]) for r in results] == [
        ("toolu_0", "zero"),
        ("toolu_1", "one"),
        ("toolu_2", "two"),
    ]
    assert body["messages"][1]["content"][0] == {
        "type": "tool_use",
        "id": "toolu_0",
        "name": "now",
        "input": {},
    }


async def test_malformed_call_arguments_still_round_trip(
    server: WireServer, model: AnthropicModel
) -> None:
    server.push(Stream(say("ok")))
    bad = ProposedCall(call_id="toolu_x", name="read_file", arguments='{"path": ')
    request = ModelRequest(
        system="",
        messages=(
            UserMessage(text="read"),
            AssistantMessage(calls=(bad,)),
            ToolResultMessage(
                call_id="toolu_x", name="read_file", content="invalid JSON", is_error=True
            ),
        ),
    )

    await model.complete(request)

    [tool_use] = server.requests[0].body["messages"][1]["content"]
    assert tool_use["input"] == {"_raw_arguments": '{"path": '}


@pytest.mark.parametrize("status", [408, 429, 500, 529])
async def test_transient_status_is_retryable(
    server: WireServer, model: AnthropicModel, status: int
) -> None:
    server.push(
        Fail(status, {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    )

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is True
    assert caught.value.status == status
    assert isinstance(caught.value.__cause__, anthropic.APIStatusError)


@pytest.mark.parametrize("status", [400, 401, 403])
async def test_client_error_is_not_retryable(
    server: WireServer, model: AnthropicModel, status: int
) -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad input"}}
    server.push(Fail(status, body))

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is False
    assert caught.value.status == status
    assert "bad input" in caught.value.message


async def test_connection_refused_is_retryable() -> None:
    claude = AnthropicModel(
        model="claude-test", base_url=f"http://127.0.0.1:{closed_port()}", api_key="sk"
    )
    try:
        with pytest.raises(ProviderError) as caught:
            await claude.complete(HELLO)
    finally:
        await claude.aclose()

    assert caught.value.retryable is True
    assert caught.value.code == "provider_connection"


async def test_timeout_is_retryable(server: WireServer) -> None:
    claude = AnthropicModel(
        model="claude-test", base_url=server.base_url, api_key="sk", timeout=0.2
    )
    server.push(Stream(say("late"), delay=2))
    try:
        with pytest.raises(ProviderError) as caught:
            await claude.complete(HELLO)
    finally:
        await claude.aclose()

    assert caught.value.retryable is True
    assert caught.value.code == "provider_timeout"


@pytest.mark.parametrize(
    ("kind", "retryable"), [("overloaded_error", True), ("invalid_request_error", False)]
)
async def test_error_event_inside_stream(
    server: WireServer, model: AnthropicModel, kind: str, retryable: bool
) -> None:
    failure = event("error", error={"type": kind, "message": "went wrong"})
    server.push(Stream([start(), block_start(0, {"type": "text", "text": ""}), failure]))

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is retryable
    assert "went wrong" in caught.value.message


@pytest.mark.parametrize("cut", [True, False])
async def test_unfinished_stream_is_retryable(
    server: WireServer, model: AnthropicModel, cut: bool
) -> None:
    server.push(
        Stream([start(), block_start(0, {"type": "text", "text": ""}), text(0, "Hel")], cut=cut)
    )

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is True


def test_spec_and_missing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)

    with pytest.raises(ConfigError) as caught:
        AnthropicModel(model="claude-sonnet-4-5")

    assert "ANTHROPIC_API_KEY" in str(caught.value)
    assert AnthropicModel(model="claude-x", api_key="sk").spec == "anthropic:claude-x"


async def test_signed_thinking_is_kept_and_replayed_verbatim(server: WireServer) -> None:
    claude = AnthropicModel(
        model="claude-test", base_url=server.base_url, api_key="sk-ant-test", thinking_budget=2048
    )
    thinking_delta = {"type": "thinking_delta", "thinking": "the user wants "}
    server.push(
        Stream(
            [
                start(),
                block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
                event("content_block_delta", index=0, delta=thinking_delta),
                event(
                    "content_block_delta",
                    index=0,
                    delta={"type": "thinking_delta", "thinking": "the file"},
                ),
                event(
                    "content_block_delta",
                    index=0,
                    delta={"type": "signature_delta", "signature": "c2ln"},
                ),
                block_stop(0),
                block_start(1, {"type": "redacted_thinking", "data": "cmVk"}),
                block_stop(1),
                tool_start(2, "toolu_t", "read_file"),
                json_piece(2, '{"path": "a"}'),
                block_stop(2),
                *finish("tool_use", 30),
            ]
        ),
        Stream(say("done")),
    )
    first = await claude.complete(HELLO)
    assert first.reasoning == "the user wants the file"
    blocks = [
        {"type": "thinking", "thinking": "the user wants the file", "signature": "c2ln"},
        {"type": "redacted_thinking", "data": "cmVk"},
    ]
    assert first.provider_state == {"anthropic": {"thinking": blocks}}
    sent = server.requests[0].body
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert sent["max_tokens"] > 2048

    [call] = first.calls
    follow_up = ModelRequest(
        system="",
        messages=(
            *HELLO.messages,
            AssistantMessage(
                reasoning=first.reasoning, calls=first.calls, provider_state=first.provider_state
            ),
            ToolResultMessage(call_id=call.call_id, name=call.name, content="hello"),
        ),
    )
    await claude.complete(follow_up)
    assistant = server.requests[1].body["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][:2] == blocks  # first, signatures intact
    assert assistant["content"][2]["type"] == "tool_use"
    await claude.aclose()


def test_thinking_budget_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from lodger.providers import make_model

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("LODGER_THINKING_BUDGET", "4096")
    assert make_model("anthropic:claude-test")._thinking_budget == 4096  # type: ignore[attr-defined]
    monkeypatch.setenv("LODGER_THINKING_BUDGET", "lots")
    with pytest.raises(ConfigError, match="LODGER_THINKING_BUDGET"):
        make_model("anthropic:claude-test")

"""OpenAIResponsesModel against a real loopback server speaking the Responses API over SSE."""

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
from lodger.providers.base import (
    AssistantMessage,
    ModelRequest,
    ToolResultMessage,
    UserMessage,
)
from lodger.providers.openai_responses import OpenAIResponsesModel

HELLO = ModelRequest(system="", messages=(UserMessage(text="hi"),))


def event(kind: str, **fields: Any) -> tuple[str | None, str]:
    return sse({"type": kind, "sequence_number": 0, **fields}, event=kind)


def response_body(
    status: str = "completed", usage: tuple[int, int] | None = None, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "gpt-test",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "status": status,
        **extra,
    }
    if usage is not None:
        body["usage"] = {
            "input_tokens": usage[0],
            "output_tokens": usage[1],
            "total_tokens": sum(usage),
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
    return body


def text_delta(delta: str) -> tuple[str | None, str]:
    return event(
        "response.output_text.delta",
        item_id="msg_1",
        output_index=0,
        content_index=0,
        delta=delta,
        logprobs=[],
    )


def call_added(index: int, call_id: str, name: str) -> tuple[str | None, str]:
    item = {
        "type": "function_call",
        "id": f"fc_{index}",
        "call_id": call_id,
        "name": name,
        "arguments": "",
        "status": "in_progress",
    }
    return event("response.output_item.added", output_index=index, item=item)


def args_delta(index: int, delta: str) -> tuple[str | None, str]:
    return event(
        "response.function_call_arguments.delta",
        item_id=f"fc_{index}",
        output_index=index,
        delta=delta,
    )


def completed(usage: tuple[int, int] = (1, 1)) -> tuple[str | None, str]:
    return event("response.completed", response=response_body(usage=usage))


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


@pytest.fixture
async def model(server: WireServer) -> AsyncIterator[OpenAIResponsesModel]:
    responses = OpenAIResponsesModel(
        model="gpt-test", base_url=f"{server.base_url}/v1", api_key="sk-test"
    )
    yield responses
    await responses.aclose()


async def test_text_streams_in_deltas(server: WireServer, model: OpenAIResponsesModel) -> None:
    server.push(
        Stream(
            [
                event("response.created", response=response_body("in_progress")),
                text_delta("Hel"),
                text_delta("lo, "),
                text_delta("world"),
                completed(usage=(12, 4)),
            ]
        )
    )
    seen: list[str] = []

    response = await model.complete(HELLO, on_text=seen.append)

    assert seen == ["Hel", "lo, ", "world"]
    assert response.text == "Hello, world"
    assert response.calls == ()
    assert response.usage == Usage(input_tokens=12, output_tokens=4)
    assert response.finish_reason == "completed"


async def test_two_calls_with_split_arguments(
    server: WireServer, model: OpenAIResponsesModel
) -> None:
    # Only deltas, no done events: the adapter must join the pieces per output item.
    server.push(
        Stream(
            [
                text_delta("Checking."),
                call_added(1, "call_a", "read_file"),
                args_delta(1, '{"pa'),
                call_added(2, "call_b", "search"),
                args_delta(2, '{"pattern":'),
                args_delta(1, 'th": "a.txt"}'),
                args_delta(2, ' "TODO", "path": "."}'),
                completed(usage=(30, 9)),
            ]
        )
    )

    response = await model.complete(HELLO)

    assert response.text == "Checking."
    assert response.calls == (
        ProposedCall(call_id="call_a", name="read_file", arguments='{"path": "a.txt"}'),
        ProposedCall(call_id="call_b", name="search", arguments='{"pattern": "TODO", "path": "."}'),
    )
    assert response.usage == Usage(input_tokens=30, output_tokens=9)


async def test_done_events_are_not_doubled(server: WireServer, model: OpenAIResponsesModel) -> None:
    whole = '{"path": "a.txt"}'
    item = {"type": "function_call", "id": "fc_0", "call_id": "call_a", "name": "read_file"}
    server.push(
        Stream(
            [
                call_added(0, "call_a", "read_file"),
                args_delta(0, '{"path": '),
                args_delta(0, '"a.txt"}'),
                event(
                    "response.function_call_arguments.done",
                    item_id="fc_0",
                    output_index=0,
                    arguments=whole,
                ),
                event(
                    "response.output_item.done",
                    output_index=0,
                    item=item | {"arguments": whole, "status": "completed"},
                ),
                completed(),
            ]
        )
    )

    response = await model.complete(HELLO)

    assert response.calls == (ProposedCall(call_id="call_a", name="read_file", arguments=whole),)


async def test_request_wire_shape(server: WireServer, model: OpenAIResponsesModel) -> None:
    server.push(Stream([text_delta("ok"), completed()]))

    await model.complete(history_request(max_output_tokens=256))

    [sent] = server.requests
    assert sent.path == "/v1/responses"
    assert sent.headers["authorization"] == "Bearer sk-test"
    body = sent.body
    assert body["model"] == "gpt-test"
    assert body["stream"] is True
    assert body["instructions"] == "You are a careful assistant."
    assert body["max_output_tokens"] == 256
    assert "reasoning" not in body
    assert body["input"] == [
        {"type": "message", "role": "user", "content": "What is in a.txt, and where is TODO?"},
        {"type": "message", "role": "assistant", "content": "Let me look."},
        {
            "type": "function_call",
            "call_id": "call_a",
            "name": "read_file",
            "arguments": '{"path": "a.txt"}',
        },
        {
            "type": "function_call",
            "call_id": "call_b",
            "name": "search",
            "arguments": '{"pattern":"TODO","path":"."}',
        },
        {"type": "function_call_output", "call_id": "call_a", "output": "hello"},
        {"type": "function_call_output", "call_id": "call_b", "output": "no match"},
        {"type": "message", "role": "user", "content": "Thanks, go on."},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "name": "read_file",
            "description": "Read a text file.",
            "parameters": READ_SCHEMA,
            "strict": False,
        },
        {
            "type": "function",
            "name": "search",
            "description": "Search files.",
            "parameters": SEARCH_SCHEMA,
            "strict": False,
        },
    ]


async def test_reasoning_summary(server: WireServer) -> None:
    def summary(index: int, delta: str) -> tuple[str | None, str]:
        return event(
            "response.reasoning_summary_text.delta",
            item_id="rs_1",
            output_index=0,
            summary_index=index,
            delta=delta,
        )

    server.push(
        Stream(
            [
                summary(0, "**Plan** "),
                summary(0, "read the file."),
                summary(1, "Then answer."),
                text_delta("Done."),
                completed(),
            ]
        )
    )
    thinker = OpenAIResponsesModel(
        model="o-test", base_url=f"{server.base_url}/v1", api_key="sk", reasoning_summary="auto"
    )
    try:
        response = await thinker.complete(HELLO)
    finally:
        await thinker.aclose()

    assert response.reasoning == "**Plan** read the file.\n\nThen answer."
    assert response.text == "Done."
    assert server.requests[0].body["reasoning"] == {"summary": "auto"}


async def test_incomplete_response_reports_its_reason(
    server: WireServer, model: OpenAIResponsesModel
) -> None:
    body = response_body(
        "incomplete", usage=(5, 64), incomplete_details={"reason": "max_output_tokens"}
    )
    server.push(Stream([text_delta("It was a dark"), event("response.incomplete", response=body)]))

    response = await model.complete(HELLO)

    assert response.finish_reason == "max_output_tokens"
    assert response.text == "It was a dark"
    assert response.usage == Usage(input_tokens=5, output_tokens=64)


@pytest.mark.parametrize("status", [408, 429, 500, 502])
async def test_transient_status_is_retryable(
    server: WireServer, model: OpenAIResponsesModel, status: int
) -> None:
    server.push(Fail(status, {"error": {"message": "try later", "type": "server_error"}}))

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is True
    assert caught.value.status == status
    assert isinstance(caught.value.__cause__, openai.APIStatusError)


@pytest.mark.parametrize("status", [400, 401, 403])
async def test_client_error_is_not_retryable(
    server: WireServer, model: OpenAIResponsesModel, status: int
) -> None:
    server.push(Fail(status, {"error": {"message": "bad", "type": "invalid_request_error"}}))

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is False
    assert caught.value.status == status


async def test_connection_refused_is_retryable() -> None:
    responses = OpenAIResponsesModel(
        model="gpt-test", base_url=f"http://127.0.0.1:{closed_port()}/v1", api_key="sk"
    )
    try:
        with pytest.raises(ProviderError) as caught:
            await responses.complete(HELLO)
    finally:
        await responses.aclose()

    assert caught.value.retryable is True
    assert caught.value.code == "provider_connection"


@pytest.mark.parametrize(("code", "retryable"), [("server_error", True), ("invalid_prompt", False)])
async def test_failed_response(
    server: WireServer, model: OpenAIResponsesModel, code: str, retryable: bool
) -> None:
    failed = response_body("failed", error={"code": code, "message": "it broke"})
    server.push(Stream([text_delta("Hel"), event("response.failed", response=failed)]))

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is retryable
    assert "it broke" in caught.value.message


@pytest.mark.parametrize(
    ("code", "retryable"), [("rate_limit_exceeded", True), ("invalid_prompt", False)]
)
async def test_error_event(
    server: WireServer, model: OpenAIResponsesModel, code: str, retryable: bool
) -> None:
    server.push(Stream([event("error", code=code, message="stream error", param=None)]))

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is retryable


@pytest.mark.parametrize("cut", [True, False])
async def test_unfinished_stream_is_retryable(
    server: WireServer, model: OpenAIResponsesModel, cut: bool
) -> None:
    server.push(Stream([text_delta("Hel")], cut=cut))

    with pytest.raises(ProviderError) as caught:
        await model.complete(HELLO)

    assert caught.value.retryable is True


def test_spec_and_missing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    with pytest.raises(ConfigError) as caught:
        OpenAIResponsesModel(model="gpt-5")

    assert "OPENAI_API_KEY" in str(caught.value)
    assert OpenAIResponsesModel(model="gpt-5", api_key="sk").spec == "responses:gpt-5"


async def test_encrypted_reasoning_is_kept_and_replayed(server: WireServer) -> None:
    responses = OpenAIResponsesModel(
        model="gpt-test", base_url=f"{server.base_url}/v1", api_key="sk-test", replay_reasoning=True
    )
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "encrypted_content": "ZW5jcnlwdGVk",
    }
    server.push(
        Stream(
            [
                event(
                    "response.output_item.done",
                    output_index=0,
                    item=reasoning | {"status": "completed"},
                ),
                call_added(1, "call_r", "read_file"),
                args_delta(1, '{"path": "a"}'),
                completed(),
            ]
        ),
        Stream([text_delta("done"), completed()]),
    )
    first = await responses.complete(HELLO)
    assert first.provider_state == {"openai_responses": {"reasoning": [reasoning]}}
    sent = server.requests[0].body
    assert sent["include"] == ["reasoning.encrypted_content"]
    assert sent["store"] is False

    [call] = first.calls
    follow_up = ModelRequest(
        system="",
        messages=(
            *HELLO.messages,
            AssistantMessage(calls=first.calls, provider_state=first.provider_state),
            ToolResultMessage(call_id=call.call_id, name=call.name, content="a says hi"),
        ),
    )
    await responses.complete(follow_up)
    items = server.requests[1].body["input"]
    assert [i["type"] for i in items[1:]] == ["reasoning", "function_call", "function_call_output"]
    assert items[1] == reasoning
    await responses.aclose()

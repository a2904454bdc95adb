"""What OpenAIResponsesModel sends for structured output, settings and media, as the wire
server recorded it, and what it makes of tool-mode answers and cached-token usage."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from test_openai_chat_requests import NOT_STRICT, PDF, PNG, READ, STRICT_OK, ask
from test_openai_responses import (
    args_delta,
    call_added,
    completed,
    event,
    response_body,
    text_delta,
)
from wire_server import Stream, WireServer

from lodger.errors import ProviderError
from lodger.events import ProposedCall, Usage
from lodger.providers.base import (
    OUTPUT_TOOL,
    AssistantMessage,
    MediaPart,
    ModelRequest,
    ModelSettings,
    ToolResultMessage,
    UserMessage,
)
from lodger.providers.openai_responses import OpenAIResponsesModel

PNG_URL = "data:image/png;base64,iVBORw0KGgpmYWtl"
PDF_URL = "data:application/pdf;base64,JVBERi0xLjQgZmFrZQ=="


def answer(text: str = "ok") -> Stream:
    return Stream([text_delta(text), completed()])


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


def test_native_is_the_default_mode_and_media_kinds_are_declared() -> None:
    assert OpenAIResponsesModel.output_mode == "native"
    assert OpenAIResponsesModel.media_kinds == frozenset({"image", "document"})


async def test_native_mode_sends_text_format_strict_when_the_schema_allows(
    server: WireServer, model: OpenAIResponsesModel
) -> None:
    server.push(answer('{"city": "Oslo", "count": 2}'), answer())

    response = await model.complete(ask(STRICT_OK, "native"))
    await model.complete(ask(NOT_STRICT, "native"))

    strict, loose = (r.body["text"] for r in server.requests)
    assert strict == {
        "format": {
            "type": "json_schema",
            "name": "Answer",
            "schema": {**STRICT_OK, "additionalProperties": False},
            "strict": True,
        }
    }
    assert loose == {
        "format": {
            "type": "json_schema",
            "name": OUTPUT_TOOL,
            "schema": NOT_STRICT,
            "strict": False,
        }
    }
    assert response.text == '{"city": "Oslo", "count": 2}'


async def test_prompted_mode_sends_the_schema_nowhere_and_tool_mode_only_as_a_tool(
    server: WireServer, model: OpenAIResponsesModel
) -> None:
    server.push(answer(), answer())

    await model.complete(ask(STRICT_OK, "prompted"))
    await model.complete(ask(STRICT_OK, "tool"))

    prompted, tool = (r.body for r in server.requests)
    assert {"text", "tools", "tool_choice"}.isdisjoint(prompted)
    assert "text" not in tool
    assert [t["name"] for t in tool["tools"]] == [OUTPUT_TOOL]


async def test_tool_mode_forces_the_output_tool_and_its_call_is_the_answer(
    server: WireServer, model: OpenAIResponsesModel
) -> None:
    server.push(
        Stream(
            [
                call_added(0, "call_1", OUTPUT_TOOL),
                args_delta(0, '{"city": "Oslo", "count": 2}'),
                completed(),
            ]
        )
    )

    response = await model.complete(ask(STRICT_OK, "tool"))

    body = server.requests[0].body
    [tool] = body["tools"]
    assert tool["name"] == OUTPUT_TOOL
    assert tool["parameters"] == {**STRICT_OK, "additionalProperties": False}
    assert tool["strict"] is True
    assert body["tool_choice"] == {"type": "function", "name": OUTPUT_TOOL}
    assert response.text == '{"city": "Oslo", "count": 2}'
    assert response.calls == ()


async def test_tool_mode_with_other_tools_requires_a_call(
    server: WireServer, model: OpenAIResponsesModel
) -> None:
    server.push(
        Stream([call_added(0, "call_1", "read_file"), args_delta(0, '{"path": "a"}'), completed()])
    )

    response = await model.complete(ask(NOT_STRICT, "tool", tools=(READ,)))

    body = server.requests[0].body
    assert body["tool_choice"] == "required"
    assert [(t["name"], t["strict"]) for t in body["tools"]] == [
        ("read_file", False),
        (OUTPUT_TOOL, False),
    ]
    assert response.calls == (
        ProposedCall(call_id="call_1", name="read_file", arguments='{"path": "a"}'),
    )


async def test_settings_map_onto_responses_parameters(server: WireServer) -> None:
    model = OpenAIResponsesModel(
        model="gpt-test",
        base_url=f"{server.base_url}/v1",
        api_key="sk-test",
        reasoning_summary="auto",
    )
    server.push(answer())
    settings = ModelSettings(
        temperature=0.2,
        top_p=0.9,
        max_tokens=300,
        stop=("END",),  # no such knob on Responses: ignored
        seed=7,  # likewise
        parallel_tool_calls=False,
        reasoning_effort="high",
        extra={"service_tier": "flex"},
    )
    try:
        await model.complete(ask(tools=(READ,), settings=settings, max_output_tokens=50))
    finally:
        await model.aclose()

    body = server.requests[0].body
    sent = {key: body[key] for key in body if key not in {"input", "tools", "model"}}
    assert sent == {
        "stream": True,
        "temperature": 0.2,
        "top_p": 0.9,
        "max_output_tokens": 300,
        "parallel_tool_calls": False,
        "reasoning": {"summary": "auto", "effort": "high"},
        "service_tier": "flex",
    }


async def test_no_parallel_tool_calls_without_tools_and_the_request_limit_as_fallback(
    server: WireServer, model: OpenAIResponsesModel
) -> None:
    server.push(answer())

    await model.complete(
        ask(
            settings=ModelSettings(parallel_tool_calls=True, reasoning_effort="low"),
            max_output_tokens=64,
        )
    )

    body = server.requests[0].body
    assert "parallel_tool_calls" not in body
    assert body["max_output_tokens"] == 64
    assert body["reasoning"] == {"effort": "low"}


async def test_cached_input_tokens_are_counted(
    server: WireServer, model: OpenAIResponsesModel
) -> None:
    done = response_body(usage=(1500, 40))
    done["usage"]["input_tokens_details"]["cached_tokens"] = 1280
    server.push(Stream([text_delta("ok"), event("response.completed", response=done)]))

    response = await model.complete(ask())

    assert response.usage == Usage(input_tokens=1500, output_tokens=40, cache_read_tokens=1280)


async def test_user_media_and_tool_result_media_become_input_parts(
    server: WireServer, model: OpenAIResponsesModel
) -> None:
    server.push(answer())
    request = ModelRequest(
        system="",
        messages=(
            UserMessage(
                text="Compare these",
                parts=(
                    MediaPart(media_type="image/png", data=PNG),
                    MediaPart(media_type="application/pdf", url="https://example.com/a.pdf"),
                ),
            ),
            AssistantMessage(calls=(ProposedCall(call_id="call_s", name="shot", arguments="{}"),)),
            ToolResultMessage(
                call_id="call_s",
                name="shot",
                content="two files",
                parts=(
                    MediaPart(media_type="image/jpeg", url="https://example.com/b.jpg"),
                    MediaPart(media_type="application/pdf", data=PDF, name="r.pdf"),
                    MediaPart(media_type="text/csv", data=b"a,b\n1,2", name="t.csv"),
                ),
            ),
        ),
    )

    await model.complete(request)

    items = server.requests[0].body["input"]
    assert items[0] == {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_image", "image_url": PNG_URL, "detail": "auto"},
            {"type": "input_file", "file_url": "https://example.com/a.pdf"},
            {"type": "input_text", "text": "Compare these"},
        ],
    }
    assert items[2] == {
        "type": "function_call_output",
        "call_id": "call_s",
        "output": [
            {"type": "input_text", "text": "two files"},
            {"type": "input_image", "image_url": "https://example.com/b.jpg", "detail": "auto"},
            {"type": "input_file", "filename": "r.pdf", "file_data": PDF_URL},
            {"type": "input_text", "text": "[document t.csv (text/csv)]\na,b\n1,2"},
        ],
    }


async def test_a_media_type_openai_does_not_take_fails_before_sending(
    server: WireServer, model: OpenAIResponsesModel
) -> None:
    part = MediaPart(media_type="video/mp4", data=b"\x00")
    request = ModelRequest(system="", messages=(UserMessage(text="look", parts=(part,)),))

    with pytest.raises(ProviderError) as caught:
        await model.complete(request)

    assert caught.value.retryable is False
    assert "video/mp4" in str(caught.value)
    assert server.requests == []

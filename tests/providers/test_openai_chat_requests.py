"""What OpenAIChatModel sends for structured output, settings and media, as the wire
server recorded it, and what it makes of tool-mode answers and cached-token usage."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from test_openai_chat import DONE, call_piece, chunk
from wire_server import READ_SCHEMA, Stream, WireServer

from lodger.errors import ProviderError
from lodger.events import ProposedCall, Usage
from lodger.providers.base import (
    OUTPUT_TOOL,
    AssistantMessage,
    MediaPart,
    ModelRequest,
    ModelSettings,
    OutputMode,
    ToolResultMessage,
    ToolSchema,
    UserMessage,
)
from lodger.providers.openai_chat import OpenAIChatModel

STRICT_OK = {
    "type": "object",
    "title": "Answer",
    "properties": {"city": {"type": "string"}, "count": {"type": "integer"}},
    "required": ["city", "count"],
}
NOT_STRICT = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "note": {"type": "string"}},
    "required": ["city"],
}
READ = ToolSchema(name="read_file", description="Read a text file.", parameters=READ_SCHEMA)
PNG = b"\x89PNG\r\n\x1a\nfake"
PDF = b"%PDF-1.4 fake"


def ask(
    schema: dict[str, Any] | None = None,
    mode: OutputMode = "prompted",
    *,
    tools: tuple[ToolSchema, ...] = (),
    settings: ModelSettings | None = None,
    max_output_tokens: int | None = None,
) -> ModelRequest:
    return ModelRequest(
        system="",
        messages=(UserMessage(text="hi"),),
        output_schema=schema,
        output_mode=mode,
        tools=tools,
        settings=settings or ModelSettings(),
        max_output_tokens=max_output_tokens,
    )


def answer(text: str = "ok", usage: dict[str, Any] | None = None) -> Stream:
    frames = [chunk({"role": "assistant", "content": text}), chunk({}, finish="stop")]
    if usage is not None:
        frames.append(chunk(usage=usage))
    return Stream([*frames, DONE])


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


@pytest.fixture
async def model(
    server: WireServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[OpenAIChatModel]:
    """As for OpenAI itself (no base_url given): the SDK's OPENAI_BASE_URL points it at
    the wire server."""
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.base_url}/v1")
    chat = OpenAIChatModel(model="gpt-test", api_key="sk-test")
    assert chat.spec == "openai:gpt-test"
    yield chat
    await chat.aclose()


@pytest.fixture
async def compatible(server: WireServer) -> AsyncIterator[OpenAIChatModel]:
    chat = OpenAIChatModel(model="qwen", base_url=f"{server.base_url}/v1")
    yield chat
    await chat.aclose()


def test_native_is_the_default_mode_and_media_kinds_are_declared() -> None:
    assert OpenAIChatModel.output_mode == "native"
    assert OpenAIChatModel.media_kinds == frozenset({"image", "document"})


async def test_native_mode_sends_a_strict_json_schema(
    server: WireServer, model: OpenAIChatModel
) -> None:
    server.push(answer('{"city": "Oslo", "count": 2}'))

    response = await model.complete(ask(STRICT_OK, "native"))

    assert server.requests[0].body["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "Answer",
            "schema": {**STRICT_OK, "additionalProperties": False},
            "strict": True,
        },
    }
    assert response.text == '{"city": "Oslo", "count": 2}'


async def test_native_mode_sends_an_optional_field_schema_as_is_not_strict(
    server: WireServer, compatible: OpenAIChatModel
) -> None:
    server.push(answer())

    await compatible.complete(ask(NOT_STRICT, "native"))

    assert server.requests[0].body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": OUTPUT_TOOL, "schema": NOT_STRICT, "strict": False},
    }


async def test_prompted_mode_sends_the_schema_nowhere_and_tool_mode_only_as_a_tool(
    server: WireServer, model: OpenAIChatModel
) -> None:
    server.push(answer(), answer())

    await model.complete(ask(STRICT_OK, "prompted"))
    await model.complete(ask(STRICT_OK, "tool"))

    prompted, tool = (r.body for r in server.requests)
    assert {"response_format", "tools", "tool_choice"}.isdisjoint(prompted)
    assert "response_format" not in tool
    assert [t["function"]["name"] for t in tool["tools"]] == [OUTPUT_TOOL]


async def test_tool_mode_forces_the_lone_output_tool_and_its_call_is_the_answer(
    server: WireServer, model: OpenAIChatModel
) -> None:
    server.push(
        Stream(
            [
                call_piece(0, '{"city": "Oslo",', call_id="call_1", name=OUTPUT_TOOL),
                call_piece(0, ' "count": 2}'),
                chunk({}, finish="tool_calls"),
                DONE,
            ]
        )
    )

    response = await model.complete(ask(STRICT_OK, "tool"))

    body = server.requests[0].body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": OUTPUT_TOOL,
                "description": body["tools"][0]["function"]["description"],
                "parameters": {**STRICT_OK, "additionalProperties": False},
                "strict": True,
            },
        }
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": OUTPUT_TOOL}}
    assert response.text == '{"city": "Oslo", "count": 2}'
    assert response.calls == ()


async def test_tool_mode_with_other_tools_requires_a_call_and_keeps_their_calls(
    server: WireServer, model: OpenAIChatModel
) -> None:
    server.push(
        Stream(
            [
                call_piece(0, '{"path": "a"}', call_id="call_1", name="read_file"),
                chunk({}, finish="tool_calls"),
                DONE,
            ]
        )
    )

    response = await model.complete(ask(NOT_STRICT, "tool", tools=(READ,)))

    body = server.requests[0].body
    assert body["tool_choice"] == "required"
    assert [t["function"]["name"] for t in body["tools"]] == ["read_file", OUTPUT_TOOL]
    assert "strict" not in body["tools"][1]["function"]  # optional field: not strict
    assert response.calls == (
        ProposedCall(call_id="call_1", name="read_file", arguments='{"path": "a"}'),
    )
    assert response.text == ""


async def test_settings_map_onto_chat_parameters(
    server: WireServer, model: OpenAIChatModel
) -> None:
    server.push(answer())
    settings = ModelSettings(
        temperature=0.2,
        top_p=0.9,
        max_tokens=300,
        stop=("END",),
        seed=7,
        parallel_tool_calls=False,
        reasoning_effort="low",
        extra={"service_tier": "flex", "metadata": {"k": "v"}},
    )

    await model.complete(ask(tools=(READ,), settings=settings, max_output_tokens=50))

    body = server.requests[0].body
    sent = {key: body[key] for key in body if key not in {"messages", "tools", "model"}}
    assert sent == {
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.2,
        "top_p": 0.9,
        "max_completion_tokens": 300,
        "stop": ["END"],
        "seed": 7,
        "parallel_tool_calls": False,
        "reasoning_effort": "low",
        "service_tier": "flex",
        "metadata": {"k": "v"},
    }


async def test_max_tokens_falls_back_to_the_request_limit_and_tool_knobs_need_tools(
    server: WireServer, model: OpenAIChatModel, compatible: OpenAIChatModel
) -> None:
    server.push(answer(), answer())
    no_limit = ModelSettings(parallel_tool_calls=True, seed=1)

    await model.complete(ask(settings=no_limit, max_output_tokens=64))
    await compatible.complete(ask(settings=ModelSettings(max_tokens=99), max_output_tokens=64))

    openai_body, compatible_body = (r.body for r in server.requests)
    assert "parallel_tool_calls" not in openai_body  # no tools sent
    assert openai_body["seed"] == 1
    assert openai_body["max_completion_tokens"] == 64  # the request's limit as fallback
    assert "max_tokens" not in openai_body
    assert compatible_body["max_tokens"] == 99  # what compatible servers understand
    assert "max_completion_tokens" not in compatible_body


async def test_cached_prompt_tokens_are_counted(server: WireServer, model: OpenAIChatModel) -> None:
    usage = {
        "prompt_tokens": 1200,
        "completion_tokens": 30,
        "total_tokens": 1230,
        "prompt_tokens_details": {"cached_tokens": 1024},
    }
    server.push(answer(usage=usage))

    response = await model.complete(ask())

    assert response.usage == Usage(input_tokens=1200, output_tokens=30, cache_read_tokens=1024)
    assert server.requests[0].body["stream_options"] == {"include_usage": True}


async def test_user_images_and_documents_become_content_parts(
    server: WireServer, model: OpenAIChatModel
) -> None:
    server.push(answer())
    parts = (
        MediaPart(media_type="image/png", data=PNG),
        MediaPart(media_type="image/jpeg", url="https://example.com/cat.jpg"),
        MediaPart(media_type="application/pdf", data=PDF, name="report.pdf"),
    )
    request = ModelRequest(system="", messages=(UserMessage(text="What is shown?", parts=parts),))

    await model.complete(request)

    assert server.requests[0].body["messages"] == [
        {
            "role": "user",
            "content": [
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,iVBORw0KGgpmYWtl"},
                },
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                {
                    "type": "file",
                    "file": {
                        "filename": "report.pdf",
                        "file_data": "data:application/pdf;base64,JVBERi0xLjQgZmFrZQ==",
                    },
                },
                {"type": "text", "text": "What is shown?"},
            ],
        }
    ]


async def test_tool_result_images_follow_the_steps_tool_messages_as_a_user_message(
    server: WireServer, model: OpenAIChatModel
) -> None:
    server.push(answer())
    shot = MediaPart(media_type="image/png", data=PNG, name="shot.png")
    request = ModelRequest(
        system="",
        messages=(
            UserMessage(text="Take a screenshot and read a.txt"),
            AssistantMessage(
                calls=(
                    ProposedCall(call_id="call_s", name="screenshot", arguments="{}"),
                    ProposedCall(call_id="call_r", name="read_file", arguments="{}"),
                )
            ),
            ToolResultMessage(
                call_id="call_s", name="screenshot", content="1 image", parts=(shot,)
            ),
            ToolResultMessage(call_id="call_r", name="read_file", content="hello"),
            UserMessage(text="Go on."),
        ),
    )

    await model.complete(request)

    messages = server.requests[0].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "user", "user"]
    assert messages[2] == {"role": "tool", "tool_call_id": "call_s", "content": "1 image"}
    assert messages[4] == {
        "role": "user",
        "content": [
            {
                "type": "text",
                "text": "The images and documents the screenshot call call_s returned:",
            },
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgpmYWtl"}},
        ],
    }
    assert messages[5] == {"role": "user", "content": "Go on."}


async def test_text_documents_go_as_text_parts_under_a_header(
    server: WireServer, model: OpenAIChatModel
) -> None:
    server.push(answer())
    notes = MediaPart(media_type="text/markdown", data=b"# Plan\nship it", name="plan.md")
    request = ModelRequest(system="", messages=(UserMessage(text="Summarize", parts=(notes,)),))

    await model.complete(request)

    assert server.requests[0].body["messages"][0]["content"] == [
        {"type": "text", "text": "[document plan.md (text/markdown)]\n# Plan\nship it"},
        {"type": "text", "text": "Summarize"},
    ]


@pytest.mark.parametrize(
    ("part", "why"),
    [
        (MediaPart(media_type="application/pdf", url="https://example.com/a.pdf"), "by URL"),
        (MediaPart(media_type="text/plain", url="https://example.com/a.txt"), "does not fetch"),
        (MediaPart(media_type="text/csv", data=b"\xff\xfe"), "not UTF-8"),
        (MediaPart(media_type="audio/wav", data=b"RIFF"), "does not take"),
        (MediaPart(media_type="image/png"), "neither bytes nor a URL"),
    ],
)
async def test_unsendable_parts_fail_before_sending(
    server: WireServer, model: OpenAIChatModel, part: MediaPart, why: str
) -> None:
    request = ModelRequest(system="", messages=(UserMessage(text="look", parts=(part,)),))

    with pytest.raises(ProviderError) as caught:
        await model.complete(request)

    assert why in str(caught.value)
    assert caught.value.retryable is False
    assert server.requests == []

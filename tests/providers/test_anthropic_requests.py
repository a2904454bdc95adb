"""What AnthropicModel sends for structured output, model settings, media and the prompt
cache, and what it reads back, against a real loopback server speaking the Messages API."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import pytest
from test_anthropic import (
    EPHEMERAL,
    block_start,
    block_stop,
    event,
    finish,
    json_piece,
    say,
    start,
    text,
    tool_start,
)
from wire_server import READ_SCHEMA, Stream, WireServer, history_request

from lodger.errors import ProviderError
from lodger.events import ProposedCall, Usage
from lodger.providers.anthropic import AnthropicModel
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
    output_tool,
)

PLACE = {
    "type": "object",
    "title": "Place",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "population": {"type": "integer", "minimum": 0},
    },
    "required": ["city"],
}
READ = ToolSchema(name="read_file", description="Read a text file.", parameters=READ_SCHEMA)
PNG = b"\x89PNG\r\n\x1a\n-not-really-an-image"
PDF = b"%PDF-1.7 a tiny document"


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


async def _claude(server: WireServer, **options: Any) -> AsyncIterator[AnthropicModel]:
    claude = AnthropicModel(
        model="claude-test", base_url=server.base_url, api_key="sk-ant-test", **options
    )
    yield claude
    await claude.aclose()


@pytest.fixture
async def model(server: WireServer) -> AsyncIterator[AnthropicModel]:
    async for claude in _claude(server):
        yield claude


@pytest.fixture
async def thinker(server: WireServer) -> AsyncIterator[AnthropicModel]:
    async for claude in _claude(server, thinking_budget=2048):
        yield claude


def ask(
    *,
    mode: OutputMode = "prompted",
    schema: dict[str, Any] | None = None,
    tools: tuple[ToolSchema, ...] = (),
    settings: ModelSettings | None = None,
) -> ModelRequest:
    return ModelRequest(
        system="",
        messages=(UserMessage(text="Where?"),),
        tools=tools,
        output_schema=schema,
        output_mode=mode,
        settings=settings or ModelSettings(),
    )


def calling(*calls: tuple[str, str, str]) -> Stream:
    """A step that makes ``calls`` (id, name, arguments as JSON text)."""
    frames = [start()]
    for index, (call_id, name, arguments) in enumerate(calls):
        frames += [tool_start(index, call_id, name), json_piece(index, arguments)]
        frames.append(block_stop(index))
    return Stream([*frames, *finish("tool_use", 9)])


def breakpoints(body: dict[str, Any]) -> list[str]:
    """Where a request's cache_control markers are, as short paths."""
    found: list[str] = []
    system = body.get("system")
    if isinstance(system, list):
        found += [f"system[{n}]" for n, block in enumerate(system) if "cache_control" in block]
    found += [
        f"tools[{n}]" for n, tool in enumerate(body.get("tools", [])) if "cache_control" in tool
    ]
    for m, message in enumerate(body["messages"]):
        for b, block in enumerate(message["content"]):
            if "cache_control" in block:
                found.append(f"messages[{m}][{b}]")
    return found


# ------------------------------------------------------------------ structured output


def test_the_adapter_declares_native_output_and_images_and_documents() -> None:
    assert AnthropicModel.output_mode == "native"
    assert AnthropicModel.media_kinds == frozenset({"image", "document"})


async def test_native_mode_sends_the_schema_as_output_config(
    server: WireServer, model: AnthropicModel
) -> None:
    server.push(Stream(say('{"city": "Paris"}')))

    response = await model.complete(ask(mode="native", schema=PLACE))

    body = server.requests[0].body
    # Made strict by the SDK's transform: what the API does not enforce moves into
    # descriptions (lodger validates the answer against the schema itself).
    assert body["output_config"] == {
        "format": {
            "type": "json_schema",
            "schema": {
                "type": "object",
                "title": "Place",
                "properties": {
                    "city": {"type": "string", "description": "{minLength: 1}"},
                    "population": {"type": "integer", "description": "{minimum: 0}"},
                },
                "additionalProperties": False,
                "required": ["city"],
            },
        }
    }
    assert "tools" not in body
    assert "tool_choice" not in body
    assert response.text == '{"city": "Paris"}'


async def test_native_mode_keeps_an_output_config_given_in_extra(
    server: WireServer, model: AnthropicModel
) -> None:
    server.push(Stream(say("{}")))
    settings = ModelSettings(extra={"output_config": {"effort": "high"}, "metadata": {"a": 1}})

    await model.complete(ask(mode="native", schema=PLACE, settings=settings))

    body = server.requests[0].body
    assert body["output_config"]["effort"] == "high"
    assert body["output_config"]["format"]["type"] == "json_schema"
    assert body["metadata"] == {"a": 1}


async def test_a_schema_the_api_cannot_take_natively_fails_before_sending(
    server: WireServer, model: AnthropicModel
) -> None:
    untyped = {"type": "object", "properties": {"anything": {}}}

    with pytest.raises(ProviderError) as caught:
        await model.complete(ask(mode="native", schema=untyped))

    assert caught.value.retryable is False
    assert "output_mode" in (caught.value.hint or "")
    assert server.requests == []


async def test_tool_mode_forces_the_output_tool_when_it_is_the_only_tool(
    server: WireServer, model: AnthropicModel
) -> None:
    server.push(calling(("toolu_o", OUTPUT_TOOL, '{"city": "Paris"}')))
    request = ask(mode="tool", schema=PLACE)

    response = await model.complete(request)

    answer = output_tool(request)
    assert answer is not None
    body = server.requests[0].body
    assert body["tools"] == [
        {
            "name": OUTPUT_TOOL,
            "description": answer.description,
            "input_schema": PLACE,
            "cache_control": EPHEMERAL,
        }
    ]
    assert body["tool_choice"] == {"type": "tool", "name": OUTPUT_TOOL}
    assert "output_config" not in body
    # The lone output call is the answer, as text for the engine to validate.
    assert response.text == '{"city": "Paris"}'
    assert response.calls == ()


async def test_tool_mode_with_other_tools_asks_for_any_tool(
    server: WireServer, model: AnthropicModel
) -> None:
    server.push(calling(("toolu_r", "read_file", '{"path": "a"}'), ("toolu_o", OUTPUT_TOOL, "{}")))
    settings = ModelSettings(parallel_tool_calls=False)

    response = await model.complete(
        ask(mode="tool", schema=PLACE, tools=(READ,), settings=settings)
    )

    body = server.requests[0].body
    assert [tool["name"] for tool in body["tools"]] == ["read_file", OUTPUT_TOOL]
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    # An answer given with other calls waits: the other calls run first.
    assert response.calls == (
        ProposedCall(call_id="toolu_r", name="read_file", arguments='{"path": "a"}'),
    )
    assert response.text == ""


async def test_tool_mode_with_thinking_leaves_the_choice_to_the_model(
    server: WireServer, thinker: AnthropicModel
) -> None:
    server.push(Stream(say('{"city": "Rome"}')))

    response = await thinker.complete(ask(mode="tool", schema=PLACE, tools=(READ,)))

    body = server.requests[0].body
    assert [tool["name"] for tool in body["tools"]] == ["read_file", OUTPUT_TOOL]
    assert "tool_choice" not in body  # auto: thinking refuses a forced tool
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert response.text == '{"city": "Rome"}'


async def test_prompted_mode_sends_no_schema_where_the_others_do(
    server: WireServer, model: AnthropicModel
) -> None:
    server.push(*(Stream(say("{}")) for _ in range(3)))

    for mode in ("prompted", "native", "tool"):
        await model.complete(ask(mode=mode, schema=PLACE, tools=(READ,)))

    prompted, native, tooled = (sent.body for sent in server.requests)
    assert [tool["name"] for tool in prompted["tools"]] == ["read_file"]
    assert "tool_choice" not in prompted
    assert "output_config" not in prompted
    assert "format" in native["output_config"]
    assert tooled["tool_choice"] == {"type": "any"}


# ------------------------------------------------------------------ model settings


async def test_settings_reach_the_request(server: WireServer, model: AnthropicModel) -> None:
    server.push(Stream(say("ok")))
    settings = ModelSettings(
        temperature=0.2,
        top_p=0.9,
        max_tokens=300,
        stop=("END", "STOP"),
        seed=7,
        parallel_tool_calls=False,
        extra={"top_k": 5, "metadata": {"user_id": "u1"}},
    )
    request = ModelRequest(
        system="",
        messages=(UserMessage(text="hi"),),
        tools=(READ,),
        max_output_tokens=100,
        settings=settings,
    )

    await model.complete(request)

    body = server.requests[0].body
    assert {key: body[key] for key in body if key not in ("messages", "tools")} == {
        "model": "claude-test",
        "stream": True,
        "max_tokens": 300,  # the settings' max_tokens before the request's
        "temperature": 0.2,
        "top_p": 0.9,
        "stop_sequences": ["END", "STOP"],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "top_k": 5,
        "metadata": {"user_id": "u1"},
    }  # no seed: the API has no such knob

    # Without a max_tokens setting, the request's max_output_tokens.
    server.push(Stream(say("ok")))
    await model.complete(replace(request, settings=replace(settings, max_tokens=None)))
    assert server.requests[1].body["max_tokens"] == 100


@pytest.mark.parametrize(
    ("effort", "budget"), [("minimal", 1024), ("low", 4096), ("medium", 8192), ("high", 16384)]
)
async def test_reasoning_effort_becomes_a_thinking_budget(
    server: WireServer, model: AnthropicModel, effort: str, budget: int
) -> None:
    server.push(Stream(say("ok")))
    settings = ModelSettings(reasoning_effort=effort, max_tokens=1000)

    await model.complete(ask(settings=settings))

    body = server.requests[0].body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert body["max_tokens"] == budget + 1024  # room for the answer after the thinking


async def test_a_thinking_budget_of_the_model_wins_over_reasoning_effort(
    server: WireServer, thinker: AnthropicModel
) -> None:
    server.push(Stream(say("ok")), Stream(say("ok")))

    for effort in ("high", "none"):
        await thinker.complete(ask(settings=ModelSettings(reasoning_effort=effort, max_tokens=10)))

    for sent in server.requests:
        assert sent.body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
        assert sent.body["max_tokens"] == 2048 + 1024  # the setting, raised to fit the thinking


async def test_an_unknown_reasoning_effort_fails_before_sending(
    server: WireServer, model: AnthropicModel
) -> None:
    server.push(Stream(say("ok")))
    await model.complete(ask(settings=ModelSettings(reasoning_effort="none")))
    assert "thinking" not in server.requests[0].body  # none: thinking stays off

    with pytest.raises(ProviderError) as caught:
        await model.complete(ask(settings=ModelSettings(reasoning_effort="ludicrous")))

    assert caught.value.retryable is False
    assert "ludicrous" in caught.value.message
    assert "minimal" in (caught.value.hint or "")
    assert len(server.requests) == 1


# ------------------------------------------------------------------ media


async def test_images_and_documents_in_the_input(server: WireServer, model: AnthropicModel) -> None:
    server.push(Stream(say("ok")))
    parts = (
        MediaPart(media_type="image/png", data=PNG),
        MediaPart(media_type="image/jpeg", url="https://example.com/cat.jpg"),
        MediaPart(media_type="application/pdf", data=PDF, name="spec.pdf"),
        MediaPart(media_type="application/pdf", url="https://example.com/paper.pdf"),
        MediaPart(media_type="text/plain; charset=utf-8", data="notes: ünïcode".encode()),
    )
    request = ModelRequest(system="", messages=(UserMessage(text="Compare these.", parts=parts),))

    await model.complete(request)

    [message] = server.requests[0].body["messages"]
    assert message == {
        "role": "user",
        "content": [
            {
                "type": "image",
                "source": {
                    "type": "base64",
                    "media_type": "image/png",
                    "data": "iVBORw0KGgotbm90LXJlYWxseS1hbi1pbWFnZQ==",
                },
            },
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
            {
                "type": "document",
                "source": {
                    "type": "base64",
                    "media_type": "application/pdf",
                    "data": "JVBERi0xLjcgYSB0aW55IGRvY3VtZW50",
                },
                "title": "spec.pdf",
            },
            {
                "type": "document",
                "source": {"type": "url", "url": "https://example.com/paper.pdf"},
            },
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "notes: ünïcode"},
            },
            {"type": "text", "text": "Compare these.", "cache_control": EPHEMERAL},
        ],
    }


async def test_images_in_a_tool_result(server: WireServer, model: AnthropicModel) -> None:
    server.push(Stream(say("a chart")))
    shot = MediaPart(media_type="image/webp", data=b"RIFF-webp", name="shot.webp")
    request = ModelRequest(
        system="",
        messages=(
            UserMessage(text="Show me."),
            AssistantMessage(
                calls=(ProposedCall(call_id="toolu_s", name="screenshot", arguments="{}"),)
            ),
            ToolResultMessage(
                call_id="toolu_s", name="screenshot", content="one image", parts=(shot,)
            ),
        ),
    )

    await model.complete(request)

    result = server.requests[0].body["messages"][2]["content"][0]
    assert result == {
        "type": "tool_result",
        "tool_use_id": "toolu_s",
        "content": [
            {"type": "text", "text": "one image"},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/webp", "data": "UklGRi13ZWJw"},
            },
        ],
        "is_error": False,
        "cache_control": EPHEMERAL,
    }


@pytest.mark.parametrize(
    ("part", "said"),
    [
        (MediaPart(media_type="image/tiff", data=b"II*\x00", name="scan.tiff"), "does not take"),
        (MediaPart(media_type="video/mp4", url="https://example.com/v.mp4"), "does not take"),
        (MediaPart(media_type="text/plain", url="https://example.com/a.txt"), "by URL"),
        (MediaPart(media_type="text/plain", data=b"\xff\xfe"), "not UTF-8"),
        (MediaPart(media_type="image/png"), "neither bytes nor a URL"),
    ],
)
async def test_media_anthropic_cannot_take_fails_before_sending(
    server: WireServer, model: AnthropicModel, part: MediaPart, said: str
) -> None:
    request = ModelRequest(
        system="",
        messages=(
            UserMessage(text="read"),
            AssistantMessage(calls=(ProposedCall(call_id="t", name="get", arguments="{}"),)),
            ToolResultMessage(call_id="t", name="get", content="", parts=(part,)),
        ),
    )

    with pytest.raises(ProviderError) as caught:
        await model.complete(request)

    assert caught.value.retryable is False
    assert said in caught.value.message
    assert part.media_type in caught.value.message
    assert "PDF" in (caught.value.hint or "")
    assert server.requests == []


# ------------------------------------------------------------------ prompt cache


async def test_cache_usage_is_input_and_reported_apart(
    server: WireServer, model: AnthropicModel
) -> None:
    server.push(
        Stream(
            [
                start(3, cache_read_input_tokens=1000, cache_creation_input_tokens=200),
                block_start(0, {"type": "text", "text": ""}),
                text(0, "ok"),
                block_stop(0),
                *finish("end_turn", 4),
            ]
        ),
        # Counts in message_delta are cumulative and replace those of message_start.
        Stream(
            [
                start(0),
                block_start(0, {"type": "text", "text": ""}),
                text(0, "ok"),
                block_stop(0),
                event(
                    "message_delta",
                    delta={"stop_reason": "end_turn", "stop_sequence": None},
                    usage={
                        "output_tokens": 6,
                        "input_tokens": 5,
                        "cache_read_input_tokens": 800,
                        "cache_creation_input_tokens": 0,
                    },
                ),
                event("message_stop"),
            ]
        ),
    )

    first = await model.complete(ask())
    second = await model.complete(ask())

    assert first.usage == Usage(
        input_tokens=1203, output_tokens=4, cache_read_tokens=1000, cache_write_tokens=200
    )
    assert second.usage == Usage(input_tokens=805, output_tokens=6, cache_read_tokens=800)


def two_turns(*later_steps: tuple[str, str]) -> ModelRequest:
    """A second turn after a finished first one; ``later_steps`` are (call id, result) of
    the second turn's steps so far, each a call of read_file after signed thinking."""
    thinking = {"type": "thinking", "thinking": "Look again.", "signature": "c2ln"}
    steps: list[AssistantMessage | ToolResultMessage] = []
    for call_id, result in later_steps:
        call = ProposedCall(call_id=call_id, name="read_file", arguments='{"path": "b"}')
        steps.append(
            AssistantMessage(calls=(call,), provider_state={"anthropic": {"thinking": [thinking]}})
        )
        steps.append(ToolResultMessage(call_id=call_id, name="read_file", content=result))
    first_call = ProposedCall(call_id="toolu_1", name="read_file", arguments='{"path": "a"}')
    return ModelRequest(
        system="Be brief.",
        messages=(
            UserMessage(text="What is in a?"),
            AssistantMessage(text="Looking.", calls=(first_call,)),
            ToolResultMessage(call_id="toolu_1", name="read_file", content="alpha"),
            AssistantMessage(text="It says alpha."),
            UserMessage(text="Not valid, try again", source="runtime"),
            AssistantMessage(text="It says alpha!"),
            UserMessage(text="And b?"),
            *steps,
        ),
        tools=(READ,),
    )


async def test_breakpoints_across_the_steps_of_a_turn(
    server: WireServer, model: AnthropicModel
) -> None:
    server.push(*(Stream(say("ok")) for _ in range(3)))

    for steps in ((), (("toolu_2", "beta"),), (("toolu_2", "beta"), ("toolu_3", "gamma"))):
        await model.complete(two_turns(*steps))

    first, second, third = (sent.body for sent in server.requests)
    assert first["system"] == [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}]
    assert first["tools"][-1]["cache_control"] == EPHEMERAL
    # The turn's first step: the history before the new input (a runtime message is not
    # input), and the input itself.
    assert first["messages"][-2:] == [
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "It says alpha!", "cache_control": EPHEMERAL}],
        },
        {
            "role": "user",
            "content": [{"type": "text", "text": "And b?", "cache_control": EPHEMERAL}],
        },
    ]
    assert breakpoints(first) == ["system[0]", "tools[0]", "messages[5][0]", "messages[6][0]"]
    # Later steps: the breakpoint before the input stays; the last one moves to the newest
    # results (never onto signed thinking, which refuses one).
    assert second["messages"][7:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Look again.", "signature": "c2ln"},
                {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"path": "b"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "beta",
                    "is_error": False,
                    "cache_control": EPHEMERAL,
                }
            ],
        },
    ]
    assert breakpoints(second) == ["system[0]", "tools[0]", "messages[5][0]", "messages[8][0]"]
    assert breakpoints(third) == ["system[0]", "tools[0]", "messages[5][0]", "messages[10][0]"]
    # The prefix the second step wrote is the third step's, byte for byte, up to its mark.
    assert _unmarked(third["messages"][:8]) == _unmarked(second["messages"][:8])


def _unmarked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            **message,
            "content": [
                {k: v for k, v in block.items() if k != "cache_control"}
                for block in message["content"]
            ],
        }
        for message in messages
    ]


async def test_a_breakpoint_skips_signed_thinking(
    server: WireServer, model: AnthropicModel
) -> None:
    server.push(Stream(say("ok")))
    thinking = {"type": "thinking", "thinking": "Hmm.", "signature": "c2ln"}
    request = ModelRequest(
        system="",
        messages=(
            UserMessage(text="one"),
            AssistantMessage(text="first", provider_state={"anthropic": {"thinking": [thinking]}}),
            AssistantMessage(provider_state={"anthropic": {"thinking": [thinking]}}),
            UserMessage(text="two"),
        ),
    )

    await model.complete(request)

    body = server.requests[0].body
    # The assistant's blocks: thinking, "first", thinking; the mark lands on "first".
    assert breakpoints(body) == ["messages[1][1]", "messages[2][0]"]


async def test_breakpoints_can_be_turned_off(server: WireServer) -> None:
    async for claude in _claude(server, cache_breakpoints=False):
        server.push(Stream(say("ok")))
        await claude.complete(history_request())

    body = server.requests[0].body
    assert body["system"] == "You are a careful assistant."
    assert breakpoints(body) == []

"""GeminiModel against a real loopback server speaking streamGenerateContent over SSE."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from wire_server import READ_SCHEMA, Fail, Stream, WireServer, closed_port, sse

from lodger.errors import ConfigError, ProviderError
from lodger.events import ProposedCall
from lodger.providers import make_model
from lodger.providers.base import (
    AssistantMessage,
    MediaPart,
    ModelRequest,
    ModelResponse,
    ModelSettings,
    ToolResultMessage,
    ToolSchema,
    UserMessage,
)
from lodger.providers.gemini import GeminiModel

HELLO = ModelRequest(system="Be brief.", messages=(UserMessage(text="hi"),))
READ = ToolSchema(name="read_file", description="Read a file.", parameters=READ_SCHEMA)
SIG = base64.b64encode(b"signed-thought").decode()


def frame(parts: list[dict[str, Any]], finish: str | None = None, **usage: int) -> Any:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    body: dict[str, Any] = {"candidates": [candidate]}
    if usage:
        body["usageMetadata"] = usage
    return sse(body)


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as ws:
        yield ws


async def ask(server: WireServer, request: ModelRequest, **kw: Any) -> ModelResponse:
    model = GeminiModel(model="gemini-test", base_url=server.base_url, api_key="k")
    try:
        return await model.complete(request, **kw)
    finally:
        await model.aclose()


async def test_text_streams_and_the_request_has_the_system_instruction(
    server: WireServer,
) -> None:
    server.push(
        Stream(
            [
                frame([{"text": "Hel"}]),
                frame([{"text": "lo."}], "STOP", promptTokenCount=10, candidatesTokenCount=2),
            ]
        )
    )
    pieces: list[str] = []
    response = await ask(server, HELLO, on_text=pieces.append)
    assert pieces == ["Hel", "lo."]
    assert response.text == "Hello."
    assert response.finish_reason == "STOP"
    recorded = server.requests[0]
    assert recorded.path == "/v1beta/models/gemini-test:streamGenerateContent?alt=sse"
    assert recorded.headers["x-goog-api-key"] == "k"
    assert recorded.body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert recorded.body["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]


async def test_usage_counts_thoughts_as_output_and_cached_tokens(server: WireServer) -> None:
    server.push(
        Stream(
            [
                frame(
                    [{"text": "ok"}],
                    "STOP",
                    promptTokenCount=100,
                    candidatesTokenCount=5,
                    thoughtsTokenCount=7,
                    cachedContentTokenCount=80,
                )
            ]
        )
    )
    usage = (await ask(server, HELLO)).usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == (100, 12, 80)


async def test_calls_get_stable_ids_and_results_pair_by_name_with_signatures_replayed(
    server: WireServer,
) -> None:
    server.push(
        Stream(
            [
                frame([{"thought": True, "text": "thinking..."}]),
                frame(
                    [
                        {
                            "functionCall": {"name": "read_file", "args": {"path": "a.txt"}},
                            "thoughtSignature": SIG,
                        },
                        {"functionCall": {"name": "read_file", "args": {"path": "b.txt"}}},
                    ],
                    "STOP",
                ),
            ]
        )
    )
    first = ModelRequest(system="", messages=(UserMessage(text="read"),), tools=(READ,))
    response = await ask(server, first)
    assert response.reasoning == "thinking..."
    assert [c.call_id for c in response.calls] == ["gemini_1_0", "gemini_1_1"]
    assert [json.loads(c.arguments) for c in response.calls] == [
        {"path": "a.txt"},
        {"path": "b.txt"},
    ]
    declared = server.requests[0].body["tools"][0]["functionDeclarations"][0]
    assert declared["parameters_json_schema"]  # the SDK keeps the proto name == READ_SCHEMA
    assert response.provider_state == {"gemini": {"signatures": {"gemini_1_0": SIG}}}

    server.push(Stream([frame([{"text": "done"}], "STOP")]))
    second = ModelRequest(
        system="",
        messages=(
            UserMessage(text="read"),
            AssistantMessage(calls=response.calls, provider_state=response.provider_state),
            ToolResultMessage(call_id="gemini_1_0", name="read_file", content="A"),
            ToolResultMessage(call_id="gemini_1_1", name="read_file", content="no", is_error=True),
        ),
        tools=(READ,),
    )
    await ask(server, second)
    contents = server.requests[1].body["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    model_parts = contents[1]["parts"]
    assert model_parts[0]["thoughtSignature"] == SIG
    assert "thoughtSignature" not in model_parts[1]
    assert "id" not in model_parts[0]["functionCall"]  # Gemini gave none
    assert contents[2]["parts"] == [
        {"functionResponse": {"name": "read_file", "response": {"output": "A"}}},
        {"functionResponse": {"name": "read_file", "response": {"error": "no"}}},
    ]


async def test_ids_gemini_gave_are_sent_back(server: WireServer) -> None:
    server.push(
        Stream([frame([{"functionCall": {"id": "g1", "name": "read_file", "args": {}}}], "STOP")])
    )
    response = await ask(server, ModelRequest(system="", messages=(UserMessage(text="x"),)))
    assert response.calls[0].call_id == "g1"
    server.push(Stream([frame([{"text": "ok"}], "STOP")]))
    follow = ModelRequest(
        system="",
        messages=(
            UserMessage(text="x"),
            AssistantMessage(calls=response.calls, provider_state=response.provider_state),
            ToolResultMessage(call_id="g1", name="read_file", content="A"),
        ),
    )
    await ask(server, follow)
    contents = server.requests[1].body["contents"]
    assert contents[1]["parts"][0]["functionCall"]["id"] == "g1"
    assert contents[2]["parts"][0]["functionResponse"]["id"] == "g1"


async def test_another_providers_state_and_ids_are_not_replayed(server: WireServer) -> None:
    server.push(Stream([frame([{"text": "ok"}], "STOP")]))
    call = ProposedCall(call_id="call_abc", name="read_file", arguments='{"path":"a"}')
    request = ModelRequest(
        system="",
        messages=(
            UserMessage(text="x"),
            AssistantMessage(
                text="Reading.",
                calls=(call,),
                provider_state={"anthropic": {"thinking": [{"type": "thinking"}]}},
            ),
            ToolResultMessage(call_id="call_abc", name="read_file", content="A"),
        ),
    )
    await ask(server, request)
    parts = server.requests[0].body["contents"][1]["parts"]
    assert parts == [
        {"text": "Reading."},
        {"functionCall": {"name": "read_file", "args": {"path": "a"}}},
    ]


async def test_native_output_sends_the_json_schema(server: WireServer) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    server.push(Stream([frame([{"text": '{"n": 1}'}], "STOP")]))
    request = ModelRequest(
        system="", messages=HELLO.messages, output_schema=schema, output_mode="native"
    )
    assert (await ask(server, request)).text == '{"n": 1}'
    config = server.requests[0].body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"] == schema
    assert GeminiModel.output_mode == "native"


async def test_tool_output_mode_offers_the_output_tool_and_takes_its_call(
    server: WireServer,
) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    server.push(
        Stream([frame([{"functionCall": {"name": "final_result", "args": {"n": 3}}}], "STOP")])
    )
    request = ModelRequest(
        system="", messages=HELLO.messages, output_schema=schema, output_mode="tool"
    )
    response = await ask(server, request)
    assert json.loads(response.text) == {"n": 3}
    assert response.calls == ()
    body = server.requests[0].body
    names = [d["name"] for d in body["tools"][0]["functionDeclarations"]]
    assert names == ["final_result"]
    assert "responseJsonSchema" not in body.get("generationConfig", {})


async def test_settings_reach_the_generation_config(server: WireServer) -> None:
    server.push(Stream([frame([{"text": "ok"}], "STOP")]))
    settings = ModelSettings(
        temperature=0.2,
        top_p=0.9,
        max_tokens=64,
        stop=("END",),
        seed=7,
        reasoning_effort="low",
        extra={"candidate_count": 1},
    )
    await ask(server, ModelRequest(system="", messages=HELLO.messages, settings=settings))
    config = server.requests[0].body["generationConfig"]
    assert config["temperature"] == 0.2
    assert config["topP"] == 0.9
    assert config["maxOutputTokens"] == 64
    assert config["stopSequences"] == ["END"]
    assert config["seed"] == 7
    assert config["candidateCount"] == 1
    assert config["thinkingConfig"] == {"thinking_level": "LOW", "include_thoughts": True}


async def test_images_and_documents_travel_as_inline_and_file_parts(server: WireServer) -> None:
    server.push(Stream([frame([{"text": "a cat"}], "STOP")]))
    png = MediaPart(media_type="image/png", data=b"\x89PNG")
    pdf = MediaPart(media_type="application/pdf", url="https://example.com/a.pdf")
    request = ModelRequest(
        system="",
        messages=(
            UserMessage(text="what is this?", parts=(png,)),
            AssistantMessage(calls=(ProposedCall(call_id="c", name="read_file", arguments="{}"),)),
            ToolResultMessage(call_id="c", name="read_file", content="see", parts=(pdf,)),
        ),
    )
    await ask(server, request)
    contents = server.requests[0].body["contents"]
    assert contents[0]["parts"][1] == {
        "inlineData": {"mime_type": "image/png", "data": base64.b64encode(b"\x89PNG").decode()}
    }
    assert contents[2]["parts"][1] == {
        "fileData": {"mime_type": "application/pdf", "file_uri": "https://example.com/a.pdf"}
    }
    assert GeminiModel.media_kinds == frozenset({"image", "document"})


@pytest.mark.parametrize(
    ("status", "retryable"), [(429, True), (500, True), (503, True), (400, False)]
)
async def test_http_errors_are_mapped(server: WireServer, status: int, retryable: bool) -> None:
    error = {"error": {"code": status, "message": "the provider says no", "status": "X"}}
    server.push(Fail(status, error, headers={"Retry-After": "3"}))
    with pytest.raises(ProviderError) as caught:
        await ask(server, HELLO)
    assert caught.value.retryable is retryable
    assert caught.value.status == status
    assert "the provider says no" in str(caught.value)
    if retryable:
        assert caught.value.retry_after == 3.0


async def test_a_cut_stream_is_retryable(server: WireServer) -> None:
    server.push(Stream([frame([{"text": "Hel"}])], cut=True))
    with pytest.raises(ProviderError) as caught:
        await ask(server, HELLO)
    assert caught.value.retryable


async def test_a_stream_without_a_finish_is_retryable(server: WireServer) -> None:
    server.push(Stream([frame([{"text": "Hel"}])]))
    with pytest.raises(ProviderError) as caught:
        await ask(server, HELLO)
    assert caught.value.retryable
    assert caught.value.code == "provider_stream"


def test_make_model_takes_gemini_and_google_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "k")
    assert make_model("gemini:gemini-2.5-flash").spec == "gemini:gemini-2.5-flash"
    assert make_model("google:gemini-2.5-pro").spec == "gemini:gemini-2.5-pro"


async def test_a_signature_on_text_is_replayed_on_the_text_part(server: WireServer) -> None:
    server.push(Stream([frame([{"text": "Answer.", "thoughtSignature": SIG}], "STOP")]))
    response = await ask(server, HELLO)
    assert response.provider_state == {"gemini": {"signatures": {"text": SIG}}}
    server.push(Stream([frame([{"text": "ok"}], "STOP")]))
    follow = ModelRequest(
        system="",
        messages=(
            UserMessage(text="hi"),
            AssistantMessage(text=response.text, provider_state=response.provider_state),
            UserMessage(text="more"),
        ),
    )
    await ask(server, follow)
    model = server.requests[1].body["contents"][1]
    assert model == {"role": "model", "parts": [{"text": "Answer.", "thoughtSignature": SIG}]}


async def test_an_unreachable_server_is_retryable() -> None:
    model = GeminiModel(model="gemini-test", base_url=f"http://127.0.0.1:{closed_port()}")
    try:
        with pytest.raises(ProviderError) as caught:
            await model.complete(HELLO)
    finally:
        await model.aclose()
    assert caught.value.retryable
    assert caught.value.code == "provider_connection"


def test_no_key_and_no_base_url_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "LODGER_GEMINI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="no Gemini API key"):
        GeminiModel(model="gemini-test")


def test_an_unknown_reasoning_effort_is_a_config_error(server: WireServer) -> None:
    request = ModelRequest(
        system="", messages=HELLO.messages, settings=ModelSettings(reasoning_effort="huge")
    )
    with pytest.raises(ConfigError, match="no Gemini thinking level"):
        asyncio.run(ask(server, request))

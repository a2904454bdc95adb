"""A request longer than the model's context window is told apart from other refusals:
the adapters give it the code ``context_length`` (the engine compacts once and asks
again), from the errors the providers document, sent by a real loopback server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from wire_server import Fail, WireServer

from lodger.errors import ProviderError
from lodger.providers.anthropic import AnthropicModel
from lodger.providers.base import (
    ModelRequest,
    UserMessage,
    is_context_length_error,
    names_context_length,
)
from lodger.providers.openai_chat import OpenAIChatModel

HELLO = ModelRequest(system="", messages=(UserMessage(text="hi"),))

OPENAI_TOO_LONG = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens. However, your "
        "messages resulted in 130412 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
ANTHROPIC_TOO_LONG = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 210463 tokens > 200000 maximum",
    },
}


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


async def _error(model: OpenAIChatModel | AnthropicModel) -> ProviderError:
    try:
        with pytest.raises(ProviderError) as caught:
            await model.complete(HELLO)
    finally:
        await model.aclose()
    return caught.value


async def test_openai_context_length_exceeded(server: WireServer) -> None:
    server.push(Fail(400, OPENAI_TOO_LONG))
    error = await _error(
        OpenAIChatModel(model="gpt-test", base_url=f"{server.base_url}/v1", api_key="sk")
    )
    assert error.code == "context_length" and is_context_length_error(error)
    assert error.retryable is False and "context window" in (error.hint or "")


async def test_anthropic_prompt_is_too_long(server: WireServer) -> None:
    server.push(Fail(400, ANTHROPIC_TOO_LONG))
    error = await _error(
        AnthropicModel(model="claude-test", base_url=server.base_url, api_key="sk-ant")
    )
    assert error.code == "context_length" and is_context_length_error(error)


async def test_another_bad_request_is_not_a_context_length_error(server: WireServer) -> None:
    server.push(Fail(400, {"error": {"message": "no", "type": "invalid_request_error"}}))
    error = await _error(
        OpenAIChatModel(model="gpt-test", base_url=f"{server.base_url}/v1", api_key="sk")
    )
    assert error.code == "provider_rejected" and not is_context_length_error(error)


@pytest.mark.parametrize(
    ("text", "too_long"),
    [
        ("The input token count (1048577) exceeds the maximum number of tokens allowed", True),
        ("This model's maximum context length is 4096 tokens", True),
        ("the request exceeds the available context size, try increasing it", True),
        ("input length and `max_tokens` exceed context limit: 199000 + 8192 > 200000", True),
        ("invalid value for temperature", False),
        ("rate limit exceeded", False),
    ],
)
def test_provider_wordings(text: str, too_long: bool) -> None:
    assert names_context_length(text) is too_long

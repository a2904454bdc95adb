"""Model adapters. ``make_model(spec)`` turns a ``--model`` spec into a ``Model``.

Specs: ``script:PATH`` (offline, deterministic), ``function:NAME`` (a function the
program registered with ``register_function``), ``test`` (``TestModel``: calls every
tool that does not write once with schema-valid arguments, then answers), ``openai:MODEL``,
``openai-compatible:URL#MODEL`` (Ollama, vLLM, llama.cpp ...), ``responses:MODEL``,
``anthropic:MODEL`` (``LODGER_THINKING_BUDGET=N`` turns on extended thinking;
``LODGER_REPLAY_REASONING=1`` replays a Responses model's encrypted reasoning),
``gemini:MODEL`` or ``google:MODEL`` (``GEMINI_API_KEY``; ``LODGER_GEMINI_BASE_URL`` points
it at another server). SDK-backed adapters are imported only when asked for. Specs
joined by ``|`` (``openai:gpt-4.1|anthropic:claude-sonnet-4-5``) are a ``FallbackModel``:
the models in that order, each taking over a step the one before failed.
"""

from __future__ import annotations

import os

from lodger.errors import ConfigError
from lodger.providers.base import (
    AssistantMessage,
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ToolResultMessage,
    ToolSchema,
    UserMessage,
)
from lodger.providers.fallback import SEPARATOR, FallbackModel
from lodger.providers.scripted import (
    FunctionModel,
    ScriptedModel,
    function_model,
    register_function,
    tool_call,
)
from lodger.providers.testmodel import TestModel

__all__ = [
    "AssistantMessage",
    "FallbackModel",
    "FunctionModel",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ScriptedModel",
    "TestModel",
    "ToolResultMessage",
    "ToolSchema",
    "UserMessage",
    "make_model",
    "register_function",
    "tool_call",
]

_HINT = (
    "use test, script:PATH, function:NAME, openai:MODEL, openai-compatible:URL#MODEL, "
    "responses:MODEL, anthropic:MODEL or gemini:MODEL; join specs with | for a fallback chain"
)


def make_model(spec: str) -> Model:
    """The model a spec names; ``a|b`` is ``FallbackModel(make_model(a), make_model(b))``."""
    if SEPARATOR in spec:
        parts = [part.strip() for part in spec.split(SEPARATOR)]
        if not all(parts):
            raise ConfigError(
                f"model spec {spec!r} has an empty model in its fallback chain",
                hint="write it as openai:gpt-4.1|anthropic:claude-sonnet-4-5",
            )
        if len(parts) > len(set(parts)):
            raise ConfigError(
                f"model spec {spec!r} names the same model twice in its fallback chain",
                hint="list each model once; the run's retries already ask a model again",
            )
        return FallbackModel(*(_one_model(part) for part in parts))
    return _one_model(spec)


def _one_model(spec: str) -> Model:
    if spec in ("test", "test:"):
        return TestModel()
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise ConfigError(f"model spec {spec!r} has no provider prefix", hint=_HINT)
    if kind == "test":  # what a TestModel's spec says, so a resumed session reads it back
        return TestModel(name=rest)
    if kind == "script":
        return ScriptedModel.from_file(rest)
    if kind == "function":  # a function this process registered (register_function)
        return function_model(rest)
    if kind == "openai":
        from lodger.providers.openai_chat import OpenAIChatModel

        return OpenAIChatModel(model=rest)
    if kind == "openai-compatible":
        url, hash_, model = rest.rpartition("#")
        if not hash_ or not url or not model:
            raise ConfigError(
                f"model spec {spec!r} needs a base URL and a model name",
                hint="write it as openai-compatible:http://localhost:11434/v1#llama3.2",
            )
        from lodger.providers.openai_chat import OpenAIChatModel

        return OpenAIChatModel(model=model, base_url=url)
    if kind == "responses":
        from lodger.providers.openai_responses import OpenAIResponsesModel

        replay = os.environ.get("LODGER_REPLAY_REASONING", "") not in ("", "0")
        return OpenAIResponsesModel(model=rest, replay_reasoning=replay)
    if kind == "anthropic":
        from lodger.providers.anthropic import AnthropicModel

        return AnthropicModel(model=rest, thinking_budget=_thinking_budget())
    if kind in ("gemini", "google"):
        from lodger.providers.gemini import GeminiModel

        return GeminiModel(model=rest)
    raise ConfigError(f"unknown model provider {kind!r} in {spec!r}", hint=_HINT)


def _thinking_budget() -> int | None:
    """``LODGER_THINKING_BUDGET``: turn on Anthropic extended thinking with this budget."""
    raw = os.environ.get("LODGER_THINKING_BUDGET", "").strip()
    if not raw:
        return None
    try:
        budget = int(raw)
    except ValueError:
        budget = 0
    if budget < 1024:
        raise ConfigError(
            f"LODGER_THINKING_BUDGET={raw!r} is not a usable thinking budget",
            hint="use a whole number of tokens, at least 1024, or unset it",
        )
    return budget

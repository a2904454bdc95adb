"""Google Gemini through the official ``google-genai`` SDK (streamed ``generateContent``).

The history becomes ``user``/``model`` contents: calls are ``functionCall`` parts of a
model content, results ``functionResponse`` parts of the next user content (all results of
one step in one content, in call order, paired by name and order as the API wants; an id is
sent back only where Gemini gave one). Images and documents travel as ``inlineData``
(bytes) or ``fileData`` (URL) parts, in the input and next to a tool's response.

    model = GeminiModel(model="gemini-2.5-flash")
    response = await model.complete(request, on_text=print)

Gemini may omit call ids: the adapter names such calls ``gemini_<step>_<n>`` (the number
of messages the request held, and the call's place), stable and unique in a session.
Thought signatures (Gemini 2.5+) are kept in ``provider_state["gemini"]`` and replayed
verbatim on the same parts, only to Gemini; thought text becomes ``reasoning``.

Settings: temperature, top_p, max_tokens (``maxOutputTokens``), stop (``stopSequences``),
seed, and reasoning_effort -> ``thinkingConfig.thinkingLevel`` (``minimal``, ``low``,
``medium``, ``high``: Gemini 3's levels; for a Gemini 2.5 thinking budget pass
``extra={"thinking_config": {"thinking_budget": N}}``). ``extra`` is merged into the
``GenerateContentConfig`` (its field names). ``parallel_tool_calls`` has no Gemini knob and
is ignored. SDK retries are off: the agent loop owns retries.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
from collections.abc import AsyncIterator
from typing import Any

from lodger._core.extras import require
from lodger.errors import ConfigError, ProviderError
from lodger.events import ProposedCall, Usage
from lodger.providers._errors import (
    ANSWER_TIMEOUT,
    MALFORMED,
    SinkFailed,
    brief,
    error_for_status,
    finish_reason,
    guarded_sink,
    malformed,
    sized,
    stream_unfinished,
    token_count,
    unreachable,
    within,
)
from lodger.providers.base import (
    AssistantMessage,
    MediaPart,
    ModelRequest,
    ModelResponse,
    OutputMode,
    TextSink,
    ToolResultMessage,
    UserMessage,
    output_tool,
    take_output_call,
)

with require("gemini", "the Gemini provider"):
    import httpx2
    from google import genai
    from google.genai import errors as genai_errors
    from google.genai import types

__all__ = ["GeminiModel"]

# The key of this adapter's entry in provider_state.
_STATE_KEY = "gemini"
_PLACEHOLDER_KEY = "lodger-placeholder-key"
_KEY_ENVS = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
BASE_URL_ENV = "LODGER_GEMINI_BASE_URL"
_LEVELS = {"minimal": "MINIMAL", "low": "LOW", "medium": "MEDIUM", "high": "HIGH"}

Json = dict[str, Any]


class GeminiModel:
    """A ``Model`` over streaming Gemini ``generateContent``."""

    output_mode: OutputMode = "native"
    media_kinds: frozenset[str] = frozenset({"image", "document"})

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 120,
        answer_timeout: float = ANSWER_TIMEOUT,
    ) -> None:
        self._model = model
        self._answer_timeout = answer_timeout
        base_url = base_url or os.environ.get(BASE_URL_ENV) or None
        key = api_key or next((os.environ[e] for e in _KEY_ENVS if os.environ.get(e)), None)
        if not key:
            if base_url is None:
                raise ConfigError(
                    "no Gemini API key was given",
                    hint="set GEMINI_API_KEY (or GOOGLE_API_KEY), or pass api_key=",
                    code="missing_api_key",
                )
            key = _PLACEHOLDER_KEY
        try:
            self._client = genai.Client(
                api_key=key,
                http_options=types.HttpOptions(
                    base_url=base_url,
                    api_version="v1beta",  # the Gemini API's default; v1 lacks JSON schemas
                    timeout=int(timeout * 1000),  # milliseconds
                    retry_options=types.HttpRetryOptions(attempts=1),
                ),
            )
        except (ValueError, genai_errors.APIError) as exc:
            raise ConfigError(f"cannot configure the Gemini client: {exc}") from exc

    @property
    def spec(self) -> str:
        return f"gemini:{self._model}"

    async def aclose(self) -> None:
        """Close the HTTP connections the SDK client holds."""
        await self._client.aio.aclose()

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        return await within(self.spec, self._answer_timeout, self._complete(request, on_text))

    async def _complete(self, request: ModelRequest, on_text: TextSink | None) -> ModelResponse:
        config = _config(request)
        folded = _Folder(guarded_sink(on_text), step=len(request.messages))
        try:
            stream: AsyncIterator[
                types.GenerateContentResponse
            ] = await self._client.aio.models.generate_content_stream(
                model=self._model, contents=_contents(request), config=config
            )
            async for chunk in stream:
                folded.feed(chunk)
            if folded.finish is None:
                raise stream_unfinished(self.spec, "a candidate finished")
            response = sized(folded.response())
        except genai_errors.APIError as exc:
            raise _provider_error(exc, spec=self.spec) from exc
        except (httpx2.TransportError, ssl.SSLError) as exc:
            raise unreachable(self.spec, f"{type(exc).__name__}: {exc}") from exc
        except SinkFailed as exc:
            raise exc.__cause__ or exc from None
        except MALFORMED as exc:
            raise malformed(self.spec, exc) from exc
        text, calls = take_output_call(response.calls, request)
        if text is None:
            return response
        return ModelResponse(
            text=text,
            reasoning=response.reasoning,
            calls=calls,
            usage=response.usage,
            finish_reason=response.finish_reason,
            provider_state=response.provider_state,
        )


def _config(request: ModelRequest) -> types.GenerateContentConfig:
    """The request's tools, output schema and settings as a ``GenerateContentConfig``."""
    settings = request.settings
    config: Json = {}
    if request.system:
        config["system_instruction"] = request.system
    tools = list(request.tools)
    extra_tool = output_tool(request)
    if extra_tool is not None:
        tools.append(extra_tool)
        config["tool_config"] = {"function_calling_config": {"mode": "ANY"}}
    if tools:
        config["tools"] = [
            {
                "function_declarations": [
                    {
                        "name": t.name,
                        "description": t.description,
                        "parameters_json_schema": t.parameters,
                    }
                    for t in tools
                ]
            }
        ]
    if request.output_mode == "native" and request.output_schema is not None:
        config["response_mime_type"] = "application/json"
        config["response_json_schema"] = request.output_schema
    max_tokens = settings.max_tokens or request.max_output_tokens
    for name, value in (
        ("temperature", settings.temperature),
        ("top_p", settings.top_p),
        ("max_output_tokens", max_tokens),
        ("stop_sequences", list(settings.stop) or None),
        ("seed", settings.seed),
    ):
        if value is not None:
            config[name] = value
    if settings.reasoning_effort is not None:
        level = _LEVELS.get(settings.reasoning_effort)
        if level is None:
            raise ConfigError(
                f"reasoning_effort {settings.reasoning_effort!r} has no Gemini thinking level",
                hint="use minimal, low, medium or high",
            )
        config["thinking_config"] = {"thinking_level": level, "include_thoughts": True}
    config.update(settings.extra)
    try:
        return types.GenerateContentConfig.model_validate(config)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ConfigError(
            f"the Gemini request settings are not valid: {brief(exc)}",
            hint="settings.extra takes GenerateContentConfig fields (snake_case)",
        ) from exc


def _contents(request: ModelRequest) -> list[types.Content]:
    """The history as alternating user/model contents; results of one step share one."""
    turns: list[tuple[str, list[Json]]] = []

    def add(role: str, parts: list[Json]) -> None:
        if not parts:
            return
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(parts)
        else:
            turns.append((role, parts))

    own_ids: set[str] = set()
    for message in request.messages:
        if isinstance(message, UserMessage):
            add("user", [*_text_parts(message.text), *map(_media_part, message.parts)])
        elif isinstance(message, AssistantMessage):
            state = _state(message)
            own_ids = set(state.get("ids", []))
            add("model", _model_parts(message, state, own_ids))
        elif isinstance(message, ToolResultMessage):
            add("user", _result_parts(message, own_ids))
    return [types.Content.model_validate({"role": r, "parts": p}) for r, p in turns]


def _state(message: AssistantMessage) -> Json:
    state = (message.provider_state or {}).get(_STATE_KEY)
    return state if isinstance(state, dict) else {}


def _signature(state: Json, key: str) -> Json:
    """The thought signature recorded for a part, as the field to send back verbatim."""
    signatures = state.get("signatures")
    value = signatures.get(key) if isinstance(signatures, dict) else None
    return {"thought_signature": base64.b64decode(value)} if isinstance(value, str) else {}


def _model_parts(message: AssistantMessage, state: Json, own_ids: set[str]) -> list[Json]:
    parts: list[Json] = []
    if message.text:
        parts.append({"text": message.text, **_signature(state, "text")})
    for call in message.calls:
        try:
            args = json.loads(call.arguments)
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            args = {"_raw_arguments": call.arguments}  # the API wants an object
        function_call: Json = {"name": call.name, "args": args}
        if call.call_id in own_ids:
            function_call["id"] = call.call_id
        parts.append({"function_call": function_call, **_signature(state, call.call_id)})
    return parts


def _result_parts(result: ToolResultMessage, own_ids: set[str]) -> list[Json]:
    response: Json = {"name": result.name}
    response["response"] = {"error" if result.is_error else "output": result.content}
    if result.call_id in own_ids:
        response["id"] = result.call_id
    return [{"function_response": response}, *map(_media_part, result.parts)]


def _text_parts(text: str) -> list[Json]:
    return [{"text": text}] if text else []


def _media_part(part: MediaPart) -> Json:
    if part.data is not None:
        return {"inline_data": {"mime_type": part.media_type, "data": part.data}}
    return {"file_data": {"mime_type": part.media_type, "file_uri": part.url}}


class _Folder:
    """Accumulates streamed ``GenerateContentResponse`` chunks into one answer."""

    def __init__(self, on_text: TextSink | None, *, step: int) -> None:
        self._on_text = on_text
        self._step = step
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ProposedCall] = []
        self._ids: list[str] = []  # the call ids Gemini gave
        self._signatures: dict[str, str] = {}
        self._usage: Usage | None = None
        self.finish: str | None = None

    def feed(self, chunk: types.GenerateContentResponse) -> None:
        if chunk.usage_metadata is not None:
            meta = chunk.usage_metadata
            self._usage = Usage(
                input_tokens=token_count(meta.prompt_token_count, "prompt"),
                output_tokens=token_count(meta.candidates_token_count, "candidates")
                + token_count(meta.thoughts_token_count, "thoughts"),
                cache_read_tokens=token_count(meta.cached_content_token_count, "cached"),
            )
        if not chunk.candidates:
            return
        candidate = chunk.candidates[0]
        for part in (candidate.content.parts if candidate.content else None) or ():
            self._part(part)
        if candidate.finish_reason is not None:
            self.finish = finish_reason(str(candidate.finish_reason.value))

    def _part(self, part: types.Part) -> None:
        key: str | None = None
        if part.function_call is not None:
            call = part.function_call
            call_id = call.id or f"gemini_{self._step}_{len(self._calls)}"
            if call.id:
                self._ids.append(call.id)
            arguments = json.dumps(call.args or {}, separators=(",", ":"))
            self._calls.append(
                ProposedCall(call_id=call_id, name=call.name or "", arguments=arguments)
            )
            key = call_id
        elif part.text is not None:
            if part.thought:
                self._reasoning.append(part.text)
            else:
                self._text.append(part.text)
                key = "text"
                if self._on_text is not None and part.text:
                    self._on_text(part.text)
        if part.thought_signature and key is not None:
            self._signatures[key] = base64.b64encode(part.thought_signature).decode()

    def response(self) -> ModelResponse:
        state: Json = {}
        if self._signatures:
            state["signatures"] = self._signatures
        if self._ids:
            state["ids"] = self._ids
        return ModelResponse(
            text="".join(self._text),
            reasoning="".join(self._reasoning),
            calls=tuple(self._calls),
            usage=self._usage,
            finish_reason=self.finish,
            provider_state={_STATE_KEY: state} if state else None,
        )


def _provider_error(exc: genai_errors.APIError, *, spec: str) -> ProviderError:
    """Translate one SDK exception; retryable for 408/409/429/5xx."""
    headers = getattr(exc.response, "headers", None)
    detail = exc.message or str(exc.details)
    return error_for_status(
        spec,
        exc.code,
        detail,
        key_env="GEMINI_API_KEY",
        headers=dict(headers) if headers is not None else None,
    )

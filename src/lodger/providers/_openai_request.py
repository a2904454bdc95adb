"""What the two OpenAI adapters send beyond the history: structured output, tool choice,
model settings and media parts, built from a ``ModelRequest`` as plain data.

Everything is checked before a byte goes out: a media type the API does not take, or a
document by URL on Chat Completions (the API has no such part), is a ``ProviderError``
that is not retried.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from typing import Any, Literal

from lodger.errors import ProviderError
from lodger.providers._openai_schema import strict_schema
from lodger.providers.base import (
    OUTPUT_TOOL,
    MediaPart,
    ModelRequest,
    ModelSettings,
    ToolSchema,
    output_tool,
)

__all__ = [
    "Api",
    "chat_media_parts",
    "chat_output",
    "chat_settings",
    "chat_tools",
    "response_media_parts",
    "response_output",
    "response_settings",
    "response_tools",
]

Api = Literal["chat", "responses"]

_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_DOCUMENT_TYPES = frozenset({"application/pdf"})
# Text documents go as text parts (the APIs' file parts are for PDFs), named by a header.
_TEXT_TYPES = frozenset({"text/plain", "text/markdown", "text/csv"})
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _schema_format(request: ModelRequest) -> tuple[str, dict[str, Any], bool] | None:
    """The name, schema and strictness of native structured output (None: not asked)."""
    if request.output_mode != "native" or request.output_schema is None:
        return None
    schema = request.output_schema
    title = schema.get("title")
    name = title if isinstance(title, str) and _NAME.match(title) else OUTPUT_TOOL
    strict = strict_schema(schema)
    return name, strict if strict is not None else schema, strict is not None


def chat_output(request: ModelRequest) -> dict[str, Any] | None:
    """``response_format`` for native mode (compatible servers such as Ollama and vLLM take
    it too); None in tool and prompted mode, where nothing extra is sent."""
    found = _schema_format(request)
    if found is None:
        return None
    name, schema, strict = found
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": schema, "strict": strict},
    }


def response_output(request: ModelRequest) -> dict[str, Any] | None:
    """``text`` (``{"format": ...}``) for native mode; None otherwise."""
    found = _schema_format(request)
    if found is None:
        return None
    name, schema, strict = found
    return {"format": {"type": "json_schema", "name": name, "schema": schema, "strict": strict}}


def _tool_schemas(request: ModelRequest) -> list[tuple[ToolSchema, bool, dict[str, Any]]]:
    """Each tool with whether it goes strict: the output tool of tool mode is strict when
    its schema allows (like native mode); the user's tools keep plain schemas."""
    out: list[tuple[ToolSchema, bool, dict[str, Any]]] = [
        (tool, False, tool.parameters) for tool in request.tools
    ]
    answer = output_tool(request)
    if answer is not None:
        strict = strict_schema(answer.parameters)
        out.append((answer, strict is not None, strict or answer.parameters))
    return out


def chat_tools(request: ModelRequest) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    for tool, strict, parameters in _tool_schemas(request):
        function: dict[str, Any] = {
            "name": tool.name,
            "description": tool.description,
            "parameters": parameters,
        }
        if strict:
            function["strict"] = True
        tools.append({"type": "function", "function": function})
    return tools


def response_tools(request: ModelRequest) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": parameters,
            "strict": strict,
        }
        for tool, strict, parameters in _tool_schemas(request)
    ]


def _tool_choice(request: ModelRequest, tools: Sequence[object], api: Api) -> Any:
    """Tool mode forces a tool call: the output tool by name when it is the only tool,
    ``"required"`` when the user's tools are sent too (the model calls tools, then
    answers through the output tool). None (the API's ``auto``) in other modes."""
    if output_tool(request) is None:
        return None
    if len(tools) > 1:
        return "required"
    if api == "chat":
        return {"type": "function", "function": {"name": OUTPUT_TOOL}}
    return {"type": "function", "name": OUTPUT_TOOL}


def _common(settings: ModelSettings, tools: Sequence[object]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if settings.temperature is not None:
        out["temperature"] = settings.temperature
    if settings.top_p is not None:
        out["top_p"] = settings.top_p
    if tools and settings.parallel_tool_calls is not None:
        out["parallel_tool_calls"] = settings.parallel_tool_calls
    return out


def _max_tokens(request: ModelRequest) -> int | None:
    settings = request.settings
    return settings.max_tokens if settings.max_tokens is not None else request.max_output_tokens


def chat_settings(
    request: ModelRequest, tools: Sequence[object], *, compatible: bool
) -> dict[str, Any]:
    """The Chat Completions arguments of ``request.settings`` (and the tool choice), as
    keyword arguments of ``chat.completions.create``; ``extra`` goes as ``extra_body``.

    OpenAI wants ``max_completion_tokens`` (reasoning models refuse ``max_tokens``);
    compatible servers widely understand only ``max_tokens``."""
    settings = request.settings
    out = _common(settings, tools)
    limit = _max_tokens(request)
    if limit is not None:
        out["max_tokens" if compatible else "max_completion_tokens"] = limit
    if settings.stop:
        out["stop"] = list(settings.stop)
    if settings.seed is not None:
        out["seed"] = settings.seed
    if settings.reasoning_effort is not None:
        out["reasoning_effort"] = settings.reasoning_effort
    choice = _tool_choice(request, tools, "chat")
    if choice is not None:
        out["tool_choice"] = choice
    if settings.extra:
        out["extra_body"] = dict(settings.extra)
    return out


def response_settings(
    request: ModelRequest, tools: Sequence[object], *, reasoning: dict[str, Any]
) -> dict[str, Any]:
    """The Responses arguments of ``request.settings`` (and the tool choice), as keyword
    arguments of ``responses.create``. ``reasoning`` is the adapter's own reasoning
    options (a summary), which ``reasoning_effort`` joins as ``reasoning.effort``.

    The Responses API has no ``stop`` and no ``seed``: those settings are ignored."""
    settings = request.settings
    out = _common(settings, tools)
    limit = _max_tokens(request)
    if limit is not None:
        out["max_output_tokens"] = limit
    reasoning = dict(reasoning)
    if settings.reasoning_effort is not None:
        reasoning["effort"] = settings.reasoning_effort
    if reasoning:
        out["reasoning"] = reasoning
    choice = _tool_choice(request, tools, "responses")
    if choice is not None:
        out["tool_choice"] = choice
    if settings.extra:
        out["extra_body"] = dict(settings.extra)
    return out


def _media_type(part: MediaPart, spec: str) -> str:
    media_type = part.media_type.partition(";")[0].strip().lower()
    if part.data is None and part.url is None:
        raise _unsendable(part, spec, "has neither bytes nor a URL")
    if media_type not in _IMAGE_TYPES | _DOCUMENT_TYPES | _TEXT_TYPES:
        raise _unsendable(part, spec, "is of a media type OpenAI does not take")
    return media_type


def _document_text(part: MediaPart, media_type: str, spec: str) -> str:
    """A text document as the text the model reads, under a header naming it."""
    if part.data is None:
        raise _unsendable(
            part, spec, "is a text document by URL, which OpenAI does not fetch", hint=_BYTES
        )
    try:
        text = part.data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _unsendable(part, spec, f"is not UTF-8 text ({exc.reason})") from exc
    return f"[document {part.name or 'untitled'} ({media_type})]\n{text}"


def _data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def _filename(part: MediaPart) -> str:
    return part.name or "document.pdf"


def chat_media_parts(parts: Sequence[MediaPart], spec: str) -> list[dict[str, Any]]:
    """Chat Completions content parts: ``image_url`` (a ``data:`` URL of the bytes, or the
    part's URL), ``file`` for PDFs (bytes only: the API takes no document URL) and
    ``text`` for text documents (plain, Markdown, CSV; bytes only)."""
    out: list[dict[str, Any]] = []
    for part in parts:
        media_type = _media_type(part, spec)
        if media_type in _IMAGE_TYPES:
            url = _data_url(media_type, part.data) if part.data is not None else part.url
            out.append({"type": "image_url", "image_url": {"url": url}})
        elif media_type in _TEXT_TYPES:
            out.append({"type": "text", "text": _document_text(part, media_type, spec)})
        elif part.data is None:
            raise _unsendable(
                part,
                spec,
                "is a document by URL, which Chat Completions does not take",
                hint=f"{_BYTES}, or use the Responses API (responses:MODEL)",
            )
        else:
            file = {"filename": _filename(part), "file_data": _data_url(media_type, part.data)}
            out.append({"type": "file", "file": file})
    return out


def response_media_parts(parts: Sequence[MediaPart], spec: str) -> list[dict[str, Any]]:
    """Responses content parts: ``input_image`` and ``input_file``, from bytes (a ``data:``
    URL) or the part's URL (which OpenAI fetches); ``input_text`` for text documents."""
    out: list[dict[str, Any]] = []
    for part in parts:
        media_type = _media_type(part, spec)
        if media_type in _IMAGE_TYPES:
            url = _data_url(media_type, part.data) if part.data is not None else part.url
            out.append({"type": "input_image", "image_url": url, "detail": "auto"})
        elif media_type in _TEXT_TYPES:
            out.append({"type": "input_text", "text": _document_text(part, media_type, spec)})
        elif part.data is not None:
            data = _data_url(media_type, part.data)
            out.append({"type": "input_file", "filename": _filename(part), "file_data": data})
        else:
            out.append({"type": "input_file", "file_url": part.url})
    return out


_BYTES = "give the document's bytes (BinaryContent) instead of its URL"


def _unsendable(part: MediaPart, spec: str, why: str, *, hint: str = "") -> ProviderError:
    named = f" {part.name!r}" if part.name else ""
    return ProviderError(
        f"{spec}: the {part.media_type} part{named} {why}",
        retryable=False,
        code="provider_rejected",
        hint=hint
        or "OpenAI takes images (JPEG, PNG, GIF, WebP), PDF and text documents; "
        "convert the file or leave it out",
    )

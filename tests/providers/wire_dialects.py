"""One provider's wire format, as the cross-provider tests need it: a real adapter pointed
at a ``WireServer``, the replies of a step (a tool call, with the provider's own reasoning
state where it has one, or a final text), and a provider-neutral reading of a recorded
request's conversation.

A ``Dialect`` is all a test of switching providers needs, so another provider (Gemini)
joins those tests by adding one here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wire_server import Stream, WireServer, sse

from lodger.providers.anthropic import AnthropicModel
from lodger.providers.base import Model
from lodger.providers.gemini import GeminiModel
from lodger.providers.openai_chat import OpenAIChatModel
from lodger.providers.openai_responses import OpenAIResponsesModel

__all__ = [
    "ANTHROPIC",
    "DIALECTS",
    "GEMINI",
    "OPENAI_CHAT",
    "OPENAI_RESPONSES",
    "Dialect",
    "Turn",
]

#: one entry of a conversation as any provider's wire carries it:
#: ("user", text), ("assistant", text), ("call", call id, tool name), ("result", call id, text)
Turn = tuple[str, ...]


@dataclass(frozen=True)
class Dialect:
    name: str
    #: the adapter, talking to ``server``
    model: Callable[[WireServer], Model]
    #: a step that calls ``name`` with ``arguments`` as ``call_id`` (and, where the
    #: provider has one, leaves its reasoning state with the output)
    call: Callable[[str, str, dict[str, Any]], Stream]
    #: a step that answers ``text``
    answer: Callable[[str], Stream]
    #: the conversation a recorded request body carries
    history: Callable[[dict[str, Any]], list[Turn]]
    #: text only this provider's reasoning state holds: it must reach this provider
    #: again and never another one
    state_marker: str | None = None


def _text_of(content: Any) -> str:
    """The text of a message's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    return "".join(
        part.get("text", "")
        for part in content
        if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text")
    )


# ---------------------------------------------------------------- OpenAI chat


def _chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[str | None, str]:
    return sse(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "gpt-chat",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def _chat_call(call_id: str, name: str, arguments: dict[str, Any]) -> Stream:
    piece = {
        "index": 0,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return Stream(
        [
            _chunk({"role": "assistant", "content": "Looking."}),
            _chunk({"tool_calls": [piece]}),
            _chunk({}, finish="tool_calls"),
            sse("[DONE]"),
        ]
    )


def _chat_answer(text: str) -> Stream:
    return Stream(
        [_chunk({"role": "assistant", "content": text}), _chunk({}, finish="stop"), sse("[DONE]")]
    )


def _chat_history(body: dict[str, Any]) -> list[Turn]:
    out: list[Turn] = []
    for message in body["messages"]:
        role = message["role"]
        if role == "user":
            out.append(("user", _text_of(message["content"])))
        elif role == "assistant":
            if message.get("content"):
                out.append(("assistant", _text_of(message["content"])))
            for call in message.get("tool_calls") or ():
                out.append(("call", call["id"], call["function"]["name"]))
        elif role == "tool":
            out.append(("result", message["tool_call_id"], _text_of(message["content"])))
    return out


OPENAI_CHAT = Dialect(
    name="openai_chat",
    model=lambda server: OpenAIChatModel(
        model="gpt-chat", base_url=f"{server.base_url}/v1", api_key="sk-test"
    ),
    call=_chat_call,
    answer=_chat_answer,
    history=_chat_history,
)


# ---------------------------------------------------------------- Anthropic

_SIGNATURE = "c2lnbmVkLWJ5LWFudGhyb3BpYw"  # only Anthropic's signed thinking holds it


def _anthropic_event(kind: str, **fields: Any) -> tuple[str | None, str]:
    return sse({"type": kind, **fields}, event=kind)


def _anthropic_start() -> tuple[str | None, str]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    return _anthropic_event("message_start", message=message)


def _anthropic_stop(reason: str) -> list[tuple[str | None, str]]:
    return [
        _anthropic_event(
            "message_delta",
            delta={"stop_reason": reason, "stop_sequence": None},
            usage={"output_tokens": 5},
        ),
        _anthropic_event("message_stop"),
    ]


def _anthropic_call(call_id: str, name: str, arguments: dict[str, Any]) -> Stream:
    thinking = {"type": "thinking", "thinking": "", "signature": ""}
    return Stream(
        [
            _anthropic_start(),
            _anthropic_event("content_block_start", index=0, content_block=thinking),
            _anthropic_event(
                "content_block_delta",
                index=0,
                delta={"type": "thinking_delta", "thinking": "I should look it up."},
            ),
            _anthropic_event(
                "content_block_delta",
                index=0,
                delta={"type": "signature_delta", "signature": _SIGNATURE},
            ),
            _anthropic_event("content_block_stop", index=0),
            _anthropic_event(
                "content_block_start",
                index=1,
                content_block={"type": "tool_use", "id": call_id, "name": name, "input": {}},
            ),
            _anthropic_event(
                "content_block_delta",
                index=1,
                delta={"type": "input_json_delta", "partial_json": json.dumps(arguments)},
            ),
            _anthropic_event("content_block_stop", index=1),
            *_anthropic_stop("tool_use"),
        ]
    )


def _anthropic_answer(text: str) -> Stream:
    return Stream(
        [
            _anthropic_start(),
            _anthropic_event(
                "content_block_start", index=0, content_block={"type": "text", "text": ""}
            ),
            _anthropic_event(
                "content_block_delta", index=0, delta={"type": "text_delta", "text": text}
            ),
            _anthropic_event("content_block_stop", index=0),
            *_anthropic_stop("end_turn"),
        ]
    )


def _anthropic_history(body: dict[str, Any]) -> list[Turn]:
    out: list[Turn] = []
    for message in body["messages"]:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for block in blocks:
            kind = block["type"]
            if kind == "text":
                out.append((message["role"], block["text"]))
            elif kind == "tool_use":
                out.append(("call", block["id"], block["name"]))
            elif kind == "tool_result":
                out.append(("result", block["tool_use_id"], _text_of(block["content"])))
    return out


ANTHROPIC = Dialect(
    name="anthropic",
    model=lambda server: AnthropicModel(
        model="claude-test", base_url=server.base_url, api_key="sk-ant-test", thinking_budget=2048
    ),
    call=_anthropic_call,
    answer=_anthropic_answer,
    history=_anthropic_history,
    state_marker=_SIGNATURE,
)


# ---------------------------------------------------------------- OpenAI Responses

_ENCRYPTED = "ZW5jcnlwdGVkLWJ5LW9wZW5haQ"  # only the Responses reasoning item holds it


def _responses_event(kind: str, **fields: Any) -> tuple[str | None, str]:
    return sse({"type": kind, "sequence_number": 0, **fields}, event=kind)


def _responses_completed() -> tuple[str | None, str]:
    body = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "gpt-resp",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "status": "completed",
        "usage": {
            "input_tokens": 3,
            "output_tokens": 5,
            "total_tokens": 8,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
    return _responses_event("response.completed", response=body)


def _responses_call(call_id: str, name: str, arguments: dict[str, Any]) -> Stream:
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "encrypted_content": _ENCRYPTED,
        "status": "completed",
    }
    item = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": call_id,
        "name": name,
        "arguments": "",
        "status": "in_progress",
    }
    return Stream(
        [
            _responses_event("response.output_item.done", output_index=0, item=reasoning),
            _responses_event("response.output_item.added", output_index=1, item=item),
            _responses_event(
                "response.function_call_arguments.delta",
                item_id="fc_1",
                output_index=1,
                delta=json.dumps(arguments),
            ),
            _responses_completed(),
        ]
    )


def _responses_answer(text: str) -> Stream:
    return Stream(
        [
            _responses_event(
                "response.output_text.delta",
                item_id="msg_1",
                output_index=0,
                content_index=0,
                delta=text,
                logprobs=[],
            ),
            _responses_completed(),
        ]
    )


def _responses_history(body: dict[str, Any]) -> list[Turn]:
    out: list[Turn] = []
    for item in body["input"]:
        kind = item.get("type", "message")
        if kind == "message" and item["role"] in ("user", "assistant"):
            out.append((item["role"], _text_of(item["content"])))
        elif kind == "function_call":
            out.append(("call", item["call_id"], item["name"]))
        elif kind == "function_call_output":
            out.append(("result", item["call_id"], _text_of(item["output"])))
    return out


OPENAI_RESPONSES = Dialect(
    name="openai_responses",
    model=lambda server: OpenAIResponsesModel(
        model="gpt-resp", base_url=f"{server.base_url}/v1", api_key="sk-test", replay_reasoning=True
    ),
    call=_responses_call,
    answer=_responses_answer,
    history=_responses_history,
    state_marker=_ENCRYPTED,
)

# ---------------------------------------------------------------- Gemini

_THOUGHT = "c2lnbmVkLWJ5LWdlbWluaQ"  # only Gemini's thought signatures hold it


def _gemini_frame(parts: list[dict[str, Any]]) -> tuple[str | None, str]:
    body = {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "index": 0, "finishReason": "STOP"}
        ],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 3},
    }
    return sse(body)


def _gemini_call(call_id: str, name: str, arguments: dict[str, Any]) -> Stream:
    part = {"functionCall": {"id": call_id, "name": name, "args": arguments}}
    return Stream([_gemini_frame([{**part, "thoughtSignature": _THOUGHT}])])


def _gemini_answer(text: str) -> Stream:
    return Stream([_gemini_frame([{"text": text}])])


def _gemini_history(body: dict[str, Any]) -> list[Turn]:
    out: list[Turn] = []
    for content in body.get("contents", []):
        for part in content.get("parts", []):
            if "text" in part:
                out.append(("user" if content["role"] == "user" else "assistant", part["text"]))
            elif "functionCall" in part:
                call = part["functionCall"]
                out.append(("call", call.get("id", ""), call["name"]))
            elif "functionResponse" in part:
                answer = part["functionResponse"]
                response = answer.get("response", {})
                text = response.get("output", response.get("error", ""))
                out.append(("result", answer.get("id", ""), _text_of(text)))
    return out


GEMINI = Dialect(
    name="gemini",
    model=lambda server: GeminiModel(model="gemini-test", base_url=server.base_url, api_key="k"),
    call=_gemini_call,
    answer=_gemini_answer,
    history=_gemini_history,
    state_marker=_THOUGHT,
)

DIALECTS = (OPENAI_CHAT, ANTHROPIC, OPENAI_RESPONSES, GEMINI)

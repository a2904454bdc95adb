"""The Vercel AI SDK's UI message stream over a session (``lodger.host.adapters.vercel``).

``POST /v1/sessions/{id}/ai-sdk/chat`` is what ``useChat``'s ``DefaultChatTransport``
sends (``{id, messages, trigger, messageId}``): a last user message starts a turn with
its text (keyed by the message's id: the same message again runs nothing twice and
streams the same turn); a last assistant message whose tool parts carry approval
responses (``addToolApprovalResponse``) answers those calls and streams the rest of the
turn. ``GET /v1/sessions/{id}/ai-sdk/stream`` streams the open turn (204 when none runs:
what a transport's ``reconnectToStream`` expects), or with ``start`` the first turn from
that offset.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from lodger.errors import CorruptLogError, LodgerError, UsageError
from lodger.host.adapters.turn import TurnMoves
from lodger.host.adapters.vercel import HEADERS, UIMessageChunks, sse_chunk, sse_done
from lodger.host.routes._deps import HostParts, Parts, Session
from lodger.host.routes._turns import (
    answer_approvals,
    continuation,
    message_started,
    open_turn_start,
    turn_moves,
)
from lodger.host.routes.events import MAX_OFFSET

__all__ = ["ChatRequest", "UIMessageIn", "router"]

_STREAM: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}
}


class UIMessageIn(BaseModel):
    """A ``UIMessage`` as the SDK sends it; parts are read where lodger needs them (text
    of a user message, approval responses of tool parts) and otherwise passed over."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1, max_length=200)
    role: Literal["system", "user", "assistant"]
    parts: list[dict[str, Any]] = Field(default_factory=list, max_length=2000)


class ChatRequest(BaseModel):
    """The body ``DefaultChatTransport`` posts (extra body fields are ignored)."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = Field(default=None, max_length=200)
    messages: list[UIMessageIn] = Field(min_length=1, max_length=10_000)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = Field(default=None, max_length=200)


router = APIRouter()


@router.post(
    "/v1/sessions/{session_id}/ai-sdk/chat",
    tags=["streams"],
    response_class=StreamingResponse,
    responses=_STREAM,
)
async def chat(
    session_id: Session, body: ChatRequest, request: Request, host: Parts
) -> StreamingResponse:
    """``useChat``'s request: start a turn with the last user message, or answer the
    approvals of the last assistant message; the turn's UI message stream."""
    if body.trigger == "regenerate-message":
        raise UsageError(
            "a lodger session does not regenerate a turn in place",
            hint="fork the session before the turn (POST .../fork) and send it there",
            code="usage",
            session_id=session_id,
        )
    last = body.messages[-1]
    if last.role == "user":
        text = "".join(str(p.get("text", "")) for p in last.parts if p.get("type") == "text")
        if not text.strip():
            raise UsageError("the last user message has no text", code="usage")
        sent, _ = await host.hub.send(session_id, key=f"ai-sdk:{last.id}", text=text)
        stream = _after_send(host, session_id, sent.id)
    else:
        answers = _approval_answers(last.parts)
        if not answers:
            raise UsageError(
                "the last message is neither a user message nor approval responses",
                hint="send a user message, or answer a tool-approval-request",
                code="usage",
            )
        where = await continuation(host, session_id, [call for call, _ in answers])
        await answer_approvals(host, request, session_id, answers)
        moves = TurnMoves(
            turn_id=where.turn_id, known=_call_ids(last.parts), settled=_settled(last.parts)
        )
        stream = _ui_stream(host, session_id, start=where.start, moves=moves)
    return StreamingResponse(stream, media_type="text/event-stream", headers=HEADERS)


@router.get(
    "/v1/sessions/{session_id}/ai-sdk/stream",
    tags=["streams"],
    response_class=StreamingResponse,
    responses={**_STREAM, 204: {"description": "no turn runs: nothing to stream"}},
)
async def ui_stream(
    session_id: Session,
    host: Parts,
    start: Annotated[int | None, Query(ge=0, le=MAX_OFFSET)] = None,
) -> Response:
    """The open turn as a UI message stream (from its start), or with ``start`` the
    first turn from that offset; 204 when no turn is open and no ``start`` is given."""
    if start is None:
        start = await open_turn_start(host, session_id)
        if start is None:
            return Response(status_code=204)
    stream = _ui_stream(host, session_id, start=start, moves=TurnMoves())
    return StreamingResponse(stream, media_type="text/event-stream", headers=HEADERS)


async def _after_send(host: HostParts, session_id: str, message_id: int) -> AsyncIterator[bytes]:
    yield b": lodger stream\n\n"  # open at once, however long the message waits to start
    started: int | LodgerError | None = None
    async for started in message_started(host, session_id, message_id):
        if started is None:
            yield b": ping\n\n"
    if not isinstance(started, int):
        assert started is not None
        for chunk in UIMessageChunks(session_id).failed(started.message, next_offset=0):
            yield sse_chunk(chunk)
        yield sse_done()
        return
    async for piece in _ui_stream(host, session_id, start=started, moves=TurnMoves()):
        yield piece


async def _ui_stream(
    host: HostParts, session_id: str, *, start: int, moves: TurnMoves
) -> AsyncIterator[bytes]:
    encoder = UIMessageChunks(session_id)
    try:
        async for found in turn_moves(host, session_id, start=start, moves=moves):
            if found is None:
                yield b": ping\n\n"
                continue
            for move in found:
                for chunk in encoder.chunks(move):
                    yield sse_chunk(chunk)
    except CorruptLogError as exc:
        for chunk in encoder.failed(exc.message, next_offset=moves.next_offset):
            yield sse_chunk(chunk)
    yield sse_done()


def _approval_answers(parts: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    """``(call id, approved)`` of the tool parts that carry an approval response."""
    found: list[tuple[str, bool]] = []
    for part in parts:
        approval = part.get("approval")
        if part.get("state") != "approval-responded" or not isinstance(approval, dict):
            continue
        approval_id, approved = approval.get("id"), approval.get("approved")
        if isinstance(approval_id, str) and isinstance(approved, bool):
            found.append((approval_id, approved))
    return found


def _call_ids(parts: list[dict[str, Any]]) -> set[str]:
    return {p["toolCallId"] for p in parts if isinstance(p.get("toolCallId"), str)}


def _settled(parts: list[dict[str, Any]]) -> set[str]:
    done = ("output-available", "output-error", "output-denied")
    return {
        p["toolCallId"]
        for p in parts
        if isinstance(p.get("toolCallId"), str) and p.get("state") in done
    }

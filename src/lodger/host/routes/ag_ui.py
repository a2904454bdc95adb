"""AG-UI over a session (``lodger.host.adapters.agui``): ``POST /v1/sessions/{id}/ag-ui``
takes AG-UI's ``RunAgentInput`` (what ``HttpAgent`` posts) and answers with the run's
events.

A run whose input has ``resume`` entries answers the interrupts they name (an interrupt
is a call waiting for approval; its id is the call's: ``status: "resolved"`` with a
payload of ``true``, ``{"approved": true}`` or ``{"decision": "allow"}`` allows it,
anything else denies it, ``cancelled`` denies it) and streams the rest of the turn.
Otherwise the last user message starts a turn with its text, keyed by the message's id
(the same message again runs nothing twice and streams the same turn). The input's
``threadId`` and ``runId`` are echoed; lodger's ids are in the ``lodger.turn`` custom
event. Tools, context and state of the input are not used: the session's tools are the
host's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from lodger.errors import CorruptLogError, LodgerError, UsageError
from lodger.host.adapters.agui import AguiEvents, sse_event
from lodger.host.adapters.turn import TurnMoves
from lodger.host.routes._deps import HostParts, Parts, Session
from lodger.host.routes._turns import (
    answer_approvals,
    continuation,
    message_started,
    turn_moves,
)

__all__ = ["ResumeEntry", "RunAgentInput", "router"]

_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class MessageIn(_Loose):
    """An AG-UI message; ``content`` is text or a list of parts (their text is read)."""

    id: str = Field(min_length=1, max_length=200)
    role: str = Field(max_length=40)
    content: Any = None
    toolCallId: str | None = Field(default=None, max_length=200)
    toolCalls: list[dict[str, Any]] | None = Field(default=None, max_length=2000)


class ResumeEntry(_Loose):
    interruptId: str = Field(min_length=1, max_length=200)
    status: Literal["resolved", "cancelled"]
    payload: Any = None


class RunAgentInput(_Loose):
    threadId: str = Field(min_length=1, max_length=200)
    runId: str = Field(min_length=1, max_length=200)
    messages: list[MessageIn] = Field(default_factory=list, max_length=10_000)
    resume: list[ResumeEntry] | None = Field(default=None, max_length=1000)


router = APIRouter()


@router.post(
    "/v1/sessions/{session_id}/ag-ui",
    tags=["streams"],
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
)
async def run(
    session_id: Session, body: RunAgentInput, request: Request, host: Parts
) -> StreamingResponse:
    """Run the agent (AG-UI): a turn of the last user message, or the rest of the open
    turn once ``resume`` answered its interrupts; the run's events."""
    encoder = AguiEvents(session_id=session_id, thread_id=body.threadId, run_id=body.runId)
    if body.resume:
        answers = [(entry.interruptId, _allows(entry)) for entry in body.resume]
        where = await continuation(host, session_id, [call for call, _ in answers])
        await answer_approvals(host, request, session_id, answers)
        known, settled = _client_calls(body.messages)
        moves = TurnMoves(turn_id=where.turn_id, known=known, settled=settled)
        stream = _events(host, session_id, encoder, start=where.start, moves=moves)
    else:
        last = next((m for m in reversed(body.messages) if m.role == "user"), None)
        text = _text(last.content) if last is not None else ""
        if last is None or not text.strip():
            raise UsageError(
                "the run's input has no user message with text, and nothing to resume",
                hint="add a user message, or resume entries answering the interrupts",
                code="usage",
            )
        sent, _ = await host.hub.send(session_id, key=f"ag-ui:{last.id}", text=text)
        stream = _after_send(host, session_id, encoder, sent.id)
    return StreamingResponse(stream, media_type="text/event-stream", headers=_HEADERS)


async def _after_send(
    host: HostParts, session_id: str, encoder: AguiEvents, message_id: int
) -> AsyncIterator[bytes]:
    for event in encoder.started():  # at once, however long the message waits to start
        yield sse_event(event)
    started: int | LodgerError | None = None
    async for started in message_started(host, session_id, message_id):
        if started is None:
            yield b": ping\n\n"
    if not isinstance(started, int):
        assert started is not None
        yield sse_event(encoder.error(started.message, code=started.code))
        return
    moves = TurnMoves()
    async for piece in _events(host, session_id, encoder, start=started, moves=moves, begun=True):
        yield piece


async def _events(
    host: HostParts,
    session_id: str,
    encoder: AguiEvents,
    *,
    start: int,
    moves: TurnMoves,
    begun: bool = False,
) -> AsyncIterator[bytes]:
    if not begun:
        for event in encoder.started():
            yield sse_event(event)
    try:
        async for found in turn_moves(host, session_id, start=start, moves=moves):
            if found is None:
                yield b": ping\n\n"
                continue
            for move in found:
                for event in encoder.events(move):
                    yield sse_event(event)
    except CorruptLogError as exc:
        yield sse_event(encoder.error(exc.message, code=exc.code))


def _allows(entry: ResumeEntry) -> bool:
    if entry.status != "resolved":
        return False
    payload = entry.payload
    if isinstance(payload, dict):
        return payload.get("approved") is True or payload.get("decision") == "allow"
    return payload is True


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _client_calls(messages: list[MessageIn]) -> tuple[set[str], set[str]]:
    """The calls the client knows of (its assistant messages' tool calls) and those it
    has results of (its tool messages)."""
    known: set[str] = set()
    settled: set[str] = set()
    for message in messages:
        for call in message.toolCalls or ():
            if isinstance(call.get("id"), str):
                known.add(call["id"])
        if message.role == "tool" and message.toolCallId is not None:
            settled.add(message.toolCallId)
    return known, settled

"""A session's committed facts: a page of them, or a live stream (server-sent events).

A stream's ``id`` is the fact's offset, ``event`` its kind, ``data`` the fact as JSON. A
client that reconnects with ``Last-Event-ID: N`` continues at offset ``N + 1`` with no gap
and no duplicate.

With ``?deltas=true`` the stream also carries the model's text as it streams in turns
this host runs (or, distributed, its workers run, relayed by the control plane):
``event: text_delta`` with no ``id`` line (so a reconnect's ``Last-Event-ID`` is always
a fact's offset) and data ``{"transient": true, "turn_id", "step_id", "text"}``. Deltas
are never facts and never in the log; a client that reads slowly loses deltas (a step's
rest, so what it got is a prefix of the step's text), never facts
(``lodger.host.feed``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from lodger.errors import CorruptLogError
from lodger.events import Event
from lodger.host.errors import error_body
from lodger.host.feed import DeltaBuffer, LiveText
from lodger.host.routes._deps import HostParts, Parts, Session
from lodger.storage.branches import current_branch

__all__ = ["MAX_OFFSET", "EventPage", "delta_json", "event_json", "live_items", "router"]

#: the largest offset (or message id) a request may name: 2**53 - 1, the largest integer
#: every JSON parser holds exactly (a float's 53 bits; JavaScript's MAX_SAFE_INTEGER), so a
#: client's tooling and the host agree on what is in range; far below the signed 64 bits
#: storage binds
MAX_OFFSET = 2**53 - 1


class EventPage(BaseModel):
    events: list[dict[str, Any]]
    next: int


def event_json(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = event.model_dump(mode="json")
    out["kind"] = event.kind
    return out


def delta_json(delta: LiveText) -> dict[str, Any]:
    """A text delta as the stream sends it: marked transient, never a fact."""
    return {
        "transient": True,
        "turn_id": delta.turn_id,
        "step_id": delta.step_id,
        "text": delta.text,
    }


router = APIRouter()


@router.get("/v1/sessions/{session_id}/events", tags=["events"])
async def events(
    session_id: Session,
    host: Parts,
    start: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> EventPage:
    """Committed facts ``[start, start + limit)``, verified (of the session's current
    branch once it was rewound: the newest ``S..rN``)."""
    log = host.sessions.storage.log
    page = await log.read(await current_branch(log, session_id), start=start, end=start + limit)
    return EventPage(events=[event_json(e) for e in page], next=start + len(page))


@router.get(
    "/v1/sessions/{session_id}/stream",
    tags=["events"],
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
)
async def stream(
    session_id: Session,
    host: Parts,
    start: Annotated[int | None, Query(ge=0, le=MAX_OFFSET)] = None,
    follow: bool = True,
    deltas: bool = False,
    last_event_id: Annotated[  # at most 18 digits: below 2**63, what storage binds
        str | None, Header(alias="Last-Event-ID", max_length=18, pattern=r"^[0-9]+$")
    ] = None,
) -> StreamingResponse:
    """The session's facts as server-sent events from ``start`` (or after
    ``Last-Event-ID``), then live as they commit (``follow=false``: up to now). A
    stream that cannot go on (a damaged log) ends with a ``stream_error`` event whose data
    is the error body. ``deltas=true``: the model's text as it streams is interleaved as
    ``text_delta`` events with no id (transient, never facts). A rewound session streams
    its current branch (as of the request)."""
    first = start if start is not None else 0
    session_id = await current_branch(host.sessions.storage.log, session_id)
    if last_event_id is not None:
        first = int(last_event_id) + 1
    return StreamingResponse(
        _sse(host, session_id, start=first, follow=follow, deltas=deltas),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def live_items(
    host: HostParts, session_id: str, *, start: int, follow: bool, deltas: bool
) -> AsyncGenerator[Event | LiveText | None, None]:
    """The session's facts (and with ``deltas``, its text deltas) from ``start``, with a
    None whenever nothing came for ``heartbeat_s`` (the caller sends a ping). A damaged
    log raises ``CorruptLogError``; counted as an active stream while it runs."""
    metrics = host.metrics
    metrics.active_streams += 1
    metrics.streams_total += 1
    buffer = DeltaBuffer() if deltas else None
    items = host.feeds.follow_live(session_id, start=start, follow=follow, deltas=buffer)
    pending: asyncio.Task[Event | LiveText] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(items))
            done, _ = await asyncio.wait({pending}, timeout=host.heartbeat_s)
            if not done:
                yield None
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None
            yield item
    finally:
        metrics.active_streams -= 1
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await items.aclose()


async def _sse(
    host: HostParts, session_id: str, *, start: int, follow: bool, deltas: bool
) -> AsyncIterator[bytes]:
    """The stream's bytes: a comment, then each fact (and delta), with a ping whenever
    nothing came for ``heartbeat_s``."""
    yield b": lodger stream\n\n"
    items = live_items(host, session_id, start=start, follow=follow, deltas=deltas)
    try:
        async for item in items:
            if item is None:
                yield b": ping\n\n"
            elif isinstance(item, LiveText):
                data = json.dumps(delta_json(item), ensure_ascii=False)
                yield f"event: text_delta\ndata: {data}\n\n".encode()
            else:
                data = json.dumps(event_json(item), ensure_ascii=False)
                yield f"id: {item.offset}\nevent: {item.kind}\ndata: {data}\n\n".encode()
    except CorruptLogError as exc:
        # the status line went out already: say why the stream ends (a damaged log, fail
        # closed) as a last event, not a cut connection; anything else (storage away for a
        # moment) cuts it: the client reconnects with Last-Event-ID
        error = json.dumps(error_body(exc), ensure_ascii=False)
        yield f"event: stream_error\ndata: {error}\n\n".encode()
    finally:
        await items.aclose()

"""Compacting a session's context by hand: a summary recorded as a fact, returned.

``POST /v1/sessions/{id}/compact`` asks the session's model (or its project's
``[compaction]`` model) for a summary of the context, as ``lodger compact`` does, and
answers with the fact it recorded: ``compacted``, or ``compaction_failed`` when no usable
summary came (the failure is a fact too: the answer is 200 either way, with ``compacted``
saying which). 409 while a turn of the session runs, after a failure with nothing
appended since (``compaction_refused``) and while a run is open (``session_running``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from lodger.errors import HostConflictError, ProviderError
from lodger.events import Compacted, CompactionFailed, Event
from lodger.host.routes._deps import HostParts, Input, Parts, Session
from lodger.host.routes.events import event_json

__all__ = ["CompactSession", "CompactionOut", "router"]


class CompactSession(Input):
    instructions: str | None = Field(
        default=None,
        max_length=20_000,
        description="extra text for the summarizer: what to keep, what matters next",
    )


class CompactionOut(BaseModel):
    #: whether a summary was recorded (``compacted``), or its failure (``compaction_failed``)
    compacted: bool
    offset: int
    #: the fact, as ``GET /v1/sessions/{id}/events`` returns it
    fact: dict[str, Any]


router = APIRouter()


@router.post("/v1/sessions/{session_id}/compact", tags=["sessions"])
async def compact(
    session_id: Session, host: Parts, body: CompactSession | None = None
) -> CompactionOut:
    """Compact the session's context now: the next request sends the pinned items, the
    summary and the facts after it, never a rewritten log (409 while a turn runs)."""
    hub = host.hub
    if await hub.busy(session_id):
        raise HostConflictError(
            f"session {session_id!r} is running a turn; nothing was compacted",
            hint="wait until its turn settles (follow the stream), then try again",
            code="session_busy",
            session_id=session_id,
        )
    instructions = body.instructions if body is not None else None
    async with hub.exclusive(session_id):
        binding = await hub.binding(session_id)  # its on_event publishes the fact
        try:
            await host.sessions.compact(session_id, instructions=instructions, binding=binding)
        except ProviderError as exc:
            if exc.code != "compaction_failed":
                raise
        finally:
            if not isinstance(binding.model, str):  # compose made a Model
                await binding.model.aclose()
    fact = await _recorded(host, session_id)
    return CompactionOut(
        compacted=isinstance(fact.body, Compacted), offset=fact.offset, fact=event_json(fact)
    )


async def _recorded(host: HostParts, session_id: str) -> Event:
    """The fact the compaction appended: the session's last (the fold the agent kept, or
    the log's tail when a failure dropped it)."""
    folded = host.sessions.cached(session_id)
    if folded is not None and folded.events:
        last = folded.events[-1]
        if isinstance(last.body, Compacted | CompactionFailed):
            return last
    log = host.sessions.storage.log
    head = await log.head(session_id)
    [last] = await log.read(session_id, start=head.high_water - 1)
    return last

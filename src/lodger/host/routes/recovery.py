"""Recovery: the open turn's plan, an operator's decision on a parked call, abandoning the
turn, resuming it, and forking a session from its verified prefix."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, field_validator

from lodger.host.auth import require_admin
from lodger.host.routes._deps import Grant, Input, Parts, Session, json_number
from lodger.host.routes.events import MAX_OFFSET
from lodger.host.routes.messages import Accepted, Key, message_out, stream_path

__all__ = [
    "AbandonTurn",
    "DecideCall",
    "Facts",
    "ForkSession",
    "Forked",
    "ResumeSession",
    "router",
]


class DecideCall(Input):
    call_id: str = Field(min_length=1, max_length=200)
    decision: Literal["completed", "not_applied", "abandon"]
    result: str | None = Field(default=None, max_length=200_000)


class ResumeSession(Input):
    idempotency_key: Key | None = None


class AbandonTurn(Input):
    reason: str | None = Field(default=None, max_length=2000)


class ForkSession(Input):
    at: int | None = Field(
        default=None,
        ge=1,
        le=MAX_OFFSET,
        description="how many of the parent's events the fork shares (at least its first; "
        "409 fork_beyond_head past the parent's head); left out: all of them",
    )
    session_id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
    )

    _numbers = field_validator("at", mode="before")(json_number)


class Facts(BaseModel):
    offsets: list[int]


class Forked(BaseModel):
    session_id: str
    parent: str
    high_water: int


router = APIRouter()


@router.get("/v1/sessions/{session_id}/recovery", tags=["recovery"])
async def recovery(session_id: Session, host: Parts) -> dict[str, Any]:
    """The recovery plan of the open turn (read-only)."""
    if not await host.sessions.storage.log.exists(session_id):
        return {"session_id": session_id, "open_turn": None, "calls": [], "blocked": False}
    return (await host.sessions.plan(session_id)).to_dict()


@router.post("/v1/sessions/{session_id}/decide", tags=["recovery"])
async def decide(session_id: Session, body: DecideCall, request: Request, host: Parts) -> Facts:
    """An operator decision on a parked call, appended as a fact that names the token
    (its public id) as the operator."""
    hub = host.hub
    async with hub.exclusive(session_id):
        made = await host.sessions.decide(
            session_id,
            body.call_id,
            body.decision,
            result=body.result,
            who=host.auth.who(request),
        )
        if body.decision == "abandon":
            await hub.abandoned(session_id)
        else:
            await hub.decided(session_id)
    hub.publish(session_id, made)
    return Facts(offsets=[e.offset for e in made])


@router.post("/v1/sessions/{session_id}/abandon", tags=["recovery"])
async def abandon(session_id: Session, body: AbandonTurn, request: Request, host: Parts) -> Facts:
    hub = host.hub
    async with hub.exclusive(session_id):
        made = await host.sessions.abandon(
            session_id, reason=body.reason, who=host.auth.who(request)
        )
        await hub.abandoned(session_id)
    hub.publish(session_id, made)
    return Facts(offsets=[e.offset for e in made])


@router.post("/v1/sessions/{session_id}/resume", status_code=202, tags=["recovery"])
async def resume(session_id: Session, body: ResumeSession, host: Parts) -> Accepted:
    """Continue the interrupted turn as a new run, in the background."""
    key = body.idempotency_key or f"resume:{uuid.uuid4()}"
    message, created = await host.hub.send(session_id, key=key, text="", kind="resume")
    return Accepted(message=message_out(message), created=created, stream=stream_path(session_id))


@router.post("/v1/sessions/{session_id}/fork", status_code=201, tags=["recovery"])
async def fork(session_id: Session, body: ForkSession, who: Grant, host: Parts) -> Forked:
    """A new session continuing from this one's verified prefix (admin only)."""
    require_admin(who)
    hub, sessions, control = host.hub, host.sessions, host.control
    if body.session_id is not None and await hub.known(body.session_id):
        await hub.create(session_id=body.session_id, model=None)  # raises: it exists
    made = await sessions.fork(session_id, at=body.at, session=body.session_id)
    model = await control.session_model(session_id) or hub.resolve_model(None)
    await control.bind_session(made.session_id, model=model, created_us=sessions.clock.now_us())
    await hub.forked(parent=session_id, child=made.session_id, model=model)
    hub.publish(made.session_id, (made.started,))
    return Forked(session_id=made.session_id, parent=session_id, high_water=made.parent.high_water)

"""Sessions: create one (admin only), list those a token can see, show one's state."""

from __future__ import annotations

import uuid

from fastapi import APIRouter
from pydantic import BaseModel, Field

from lodger.host.auth import require_admin
from lodger.host.routes._deps import Grant, Input, Parts, Session
from lodger.host.routes.messages import Key, MessageOut, message_out, stream_path

__all__ = ["CreateSession", "CreatedSession", "SessionList", "SessionOut", "router"]


class CreateSession(Input):
    session_id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        description="one of the models this host offers (404 model_not_allowed otherwise); "
        "left out: the host's default",
    )
    message: str | None = Field(default=None, max_length=200_000)
    idempotency_key: Key | None = None


class SessionOut(BaseModel):
    session_id: str
    model: str | None = None
    events: int
    turns: int
    open_turn: str | None = None
    last_turn_status: str | None = None
    workspace: str | None = None
    running: bool
    pending_approvals: int
    #: the log the session goes on in: its id, or the branch a rewind made current
    branch: str | None = None
    #: the session's permission mode (None: never switched; the policy alone decides)
    permission_mode: str | None = None


class CreatedSession(BaseModel):
    session_id: str
    model: str
    message: MessageOut | None = None
    stream: str


class SessionList(BaseModel):
    sessions: list[str]


router = APIRouter()


@router.post("/v1/sessions", status_code=201, tags=["sessions"])
async def create_session(body: CreateSession, who: Grant, host: Parts) -> CreatedSession:
    """Create a session (admin only), optionally with its first message."""
    require_admin(who)
    sid = await host.hub.create(session_id=body.session_id, model=body.model)
    spec = await host.control.session_model(sid) or host.hub.resolve_model(None)
    sent = None
    if body.message is not None:
        key = body.idempotency_key or f"create:{uuid.uuid4()}"
        sent, _ = await host.hub.send(sid, key=key, text=body.message)
    return CreatedSession(
        session_id=sid,
        model=spec,
        message=None if sent is None else message_out(sent),
        stream=stream_path(sid),
    )


@router.get("/v1/sessions", tags=["sessions"])
async def list_sessions(who: Grant, host: Parts) -> SessionList:
    """The sessions this token can see."""
    found = await host.hub.list_sessions()
    return SessionList(sessions=[s for s in found if who.allows(s)])


@router.get("/v1/sessions/{session_id}", tags=["sessions"])
async def show_session(session_id: Session, host: Parts) -> SessionOut:
    sessions = host.sessions
    state = (
        await sessions.state(session_id) if await sessions.storage.log.exists(session_id) else None
    )
    pending = await host.hub.approvals(session_id=session_id)
    return SessionOut(
        session_id=session_id,
        model=await host.control.session_model(session_id) or (state.last_model if state else None),
        events=len(state.events) if state else 0,
        turns=state.turns if state else 0,
        open_turn=state.open_turn if state else None,
        last_turn_status=state.last_turn_status if state else None,
        workspace=state.workspace if state else None,
        running=await host.hub.busy(session_id),
        pending_approvals=len(pending),
        branch=state.session_id if state else None,
        permission_mode=state.permission_mode if state else None,
    )

"""Session control while a session runs: cancel its running turn, switch its permission
mode. Each answer says what happened; asking again writes nothing twice."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from lodger.host.routes._deps import Input, Parts, Session

__all__ = ["CancelOut", "CancelTurn", "ModeOut", "SwitchMode", "router"]


class CancelTurn(Input):
    reason: str = Field(default="", max_length=2000)


class CancelOut(BaseModel):
    session_id: str
    #: ``cancelled`` (the turn ended cancelled), ``requested`` (the process or worker
    #: running it has the request and ends it at its next safe point),
    #: ``already_cancelling`` or ``not_running`` (nothing was written)
    status: Literal["cancelled", "requested", "already_cancelling", "not_running"]
    turn_id: str | None = None
    turn_status: str | None = None


class SwitchMode(Input):
    mode: Literal["plan", "ask", "accept_edits", "full_auto"]


class ModeOut(BaseModel):
    session_id: str
    #: ``unchanged``: the session was in that mode already (nothing was written)
    status: Literal["changed", "unchanged"]
    mode: str
    previous: str | None = None


router = APIRouter()


@router.post("/v1/sessions/{session_id}/cancel", tags=["control"])
async def cancel(session_id: Session, body: CancelTurn, request: Request, host: Parts) -> CancelOut:
    """Cancel the running turn: calls not started never start, running calls settle and
    are recorded, the turn ends ``cancelled``. The request is a fact naming the token."""
    done = await host.hub.cancel(session_id, who=host.auth.who(request), reason=body.reason)
    status = "not_running" if done.status == "unknown_session" else done.status
    return CancelOut(
        session_id=session_id, status=status, turn_id=done.turn_id, turn_status=done.turn_status
    )


@router.post("/v1/sessions/{session_id}/mode", tags=["control"])
async def mode(session_id: Session, body: SwitchMode, request: Request, host: Parts) -> ModeOut:
    """Switch the session's permission mode from its next step on (the project's deny
    rules hold in every mode); a session with no turn yet has nothing to switch (404)."""
    done = await host.hub.set_permission_mode(session_id, body.mode, who=host.auth.who(request))
    return ModeOut(**done.to_dict())

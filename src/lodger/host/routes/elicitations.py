"""Elicitations: MCP servers' questions to a person, open while their calls run."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from lodger.host.routes._deps import Grant, Input, Parts, Session

__all__ = ["ElicitationAnswer", "ElicitationList", "ElicitationOut", "router"]


class ElicitationAnswer(Input):
    action: Literal["accept", "decline", "cancel"]
    #: the form's values (``accept`` in form mode); checked against ``requested_schema``
    content: dict[str, Any] = Field(default_factory=dict)


class ElicitationOut(BaseModel):
    elicitation_id: str
    session_id: str
    call_id: str
    server: str
    mode: Literal["form", "url"]
    message: str
    requested_schema: dict[str, Any] = Field(default_factory=dict)
    #: url mode: where to send the person (shown to people only, never to the model)
    url: str | None = None


class ElicitationList(BaseModel):
    elicitations: list[ElicitationOut]


router = APIRouter()


@router.get("/v1/elicitations", tags=["elicitations"])
async def all_elicitations(who: Grant, host: Parts) -> ElicitationList:
    """Open questions of every session this token can see (runs of this host only)."""
    found = host.hub.elicitations.pending()
    return ElicitationList(
        elicitations=[
            ElicitationOut(**p.to_dict()) for p in found if who.allows(p.question.session_id)
        ]
    )


@router.get("/v1/sessions/{session_id}/elicitations", tags=["elicitations"])
async def elicitations(session_id: Session, host: Parts) -> ElicitationList:
    found = host.hub.elicitations.pending(session_id=session_id)
    return ElicitationList(elicitations=[ElicitationOut(**p.to_dict()) for p in found])


@router.post("/v1/sessions/{session_id}/elicitations/{elicitation_id}", tags=["elicitations"])
async def answer(
    session_id: Session,
    elicitation_id: Annotated[str, Path(min_length=1, max_length=300)],
    body: ElicitationAnswer,
    request: Request,
    host: Parts,
) -> ElicitationOut:
    """Answer an open question; the first answer wins, a later one gets 409, a form
    answer that does not match the schema gets 400 and the question stays open. The
    answer's fact records who answered (``token:tok_...``); values of fields the schema
    marks sensitive reach the server and never the log."""
    answered = host.hub.elicitations.answer(
        session_id, elicitation_id, action=body.action, content=body.content,
        by=host.auth.who(request),
    )  # fmt: skip
    return ElicitationOut(**answered.to_dict())

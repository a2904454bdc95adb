"""Approvals: the calls parked for a person's answer, and the answer (the first one wins)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel

from lodger.host.routes._deps import Grant, Input, Parts, Session

__all__ = ["Answer", "ApprovalList", "ApprovalOut", "router"]


class Answer(Input):
    decision: Literal["allow", "deny"]


class ApprovalOut(BaseModel):
    session_id: str
    call_id: str
    tool: str
    summary: str
    status: str
    answered_by: str | None = None


class ApprovalList(BaseModel):
    approvals: list[ApprovalOut]


router = APIRouter()


@router.get("/v1/approvals", tags=["approvals"])
async def all_approvals(who: Grant, host: Parts) -> ApprovalList:
    """Pending approvals of every session this token can see."""
    found = await host.hub.approvals()
    return ApprovalList(
        approvals=[ApprovalOut(**a.to_dict()) for a in found if who.allows(a.session_id)]
    )


@router.get("/v1/sessions/{session_id}/approvals", tags=["approvals"])
async def approvals(session_id: Session, host: Parts) -> ApprovalList:
    found = await host.hub.approvals(session_id=session_id)
    return ApprovalList(approvals=[ApprovalOut(**a.to_dict()) for a in found])


@router.post("/v1/sessions/{session_id}/approvals/{call_id}", tags=["approvals"])
async def answer(
    session_id: Session,
    call_id: Annotated[str, Path(min_length=1, max_length=200)],
    body: Answer,
    request: Request,
    host: Parts,
) -> ApprovalOut:
    """Answer a parked call; the first answer wins, a later one gets 409. The decision
    records who answered: the token's public id (``answered_by``: ``token:tok_...``)."""
    decided = await host.hub.answer(
        session_id, call_id, allow=body.decision == "allow", by=host.auth.who(request)
    )
    return ApprovalOut(**decided.to_dict())

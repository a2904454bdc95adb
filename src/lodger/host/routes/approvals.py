"""Approvals: the calls parked for a person's answer, and the answer (the first one wins)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel

from lodger.events import ModelOutput, PermissionRequested
from lodger.host.routes._deps import Grant, HostParts, Input, Parts, Session
from lodger.storage.control.host_index import Approval

__all__ = ["Answer", "ApprovalList", "ApprovalOut", "router"]


class Answer(Input):
    #: ``always``: allow it, and the tool for the rest of the session (an embedded host)
    decision: Literal["allow", "always", "deny"]


class ApprovalOut(BaseModel):
    session_id: str
    call_id: str
    tool: str
    summary: str
    status: str
    answered_by: str | None = None
    #: the call's arguments as the model proposed them (JSON text; a code cell's nested
    #: call: as its T1 would record them), read from the session's log
    arguments: str | None = None


class ApprovalList(BaseModel):
    approvals: list[ApprovalOut]


router = APIRouter()


@router.get("/v1/approvals", tags=["approvals"])
async def all_approvals(who: Grant, host: Parts) -> ApprovalList:
    """Pending approvals of every session this token can see."""
    found = [a for a in await host.hub.approvals() if who.allows(a.session_id)]
    return ApprovalList(approvals=await _with_arguments(host, found))


@router.get("/v1/sessions/{session_id}/approvals", tags=["approvals"])
async def approvals(session_id: Session, host: Parts) -> ApprovalList:
    found = await host.hub.approvals(session_id=session_id)
    return ApprovalList(approvals=await _with_arguments(host, found))


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
        session_id,
        call_id,
        allow=body.decision != "deny",
        by=host.auth.who(request),
        always=body.decision == "always",
    )
    return ApprovalOut(**decided.to_dict())


async def _with_arguments(host: HostParts, found: list[Approval]) -> list[ApprovalOut]:
    """Each approval with its call's arguments, so a person sees what they allow: one
    read of each session's log that has an approval pending."""
    log = host.sessions.storage.log
    arguments: dict[tuple[str, str], str] = {}
    for sid in sorted({a.session_id for a in found}):
        if not await log.exists(sid):
            continue
        for event in await log.read(sid):
            body = event.body
            if isinstance(body, ModelOutput):
                for call in body.calls:
                    arguments[(sid, call.call_id)] = call.arguments
            elif isinstance(body, PermissionRequested) and event.call_id is not None:
                arguments.setdefault((sid, event.call_id), body.summary)
    return [
        ApprovalOut(**a.to_dict(), arguments=arguments.get((a.session_id, a.call_id)))
        for a in found
    ]

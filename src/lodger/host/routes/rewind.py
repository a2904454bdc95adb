"""Rewind: take a session back to an earlier point, conversation and workspace files.

``POST /v1/sessions/{id}/rewind`` runs ``Sessions.rewind`` (:mod:`lodger.runtime.rewind`):
a new branch of the session becomes its current one and the workspace is restored. Files
changed outside lodger refuse it (409 ``workspace_changed``, naming them) unless ``force``;
a running turn refuses it (409 ``session_busy``). The session's messages go on in the new
branch; its events and timeline are read from the branch's id (``branch`` in the answer).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, StrictBool, field_validator

from lodger.errors import HostConflictError
from lodger.host.routes._deps import Input, Parts, Session, json_number
from lodger.host.routes.events import MAX_OFFSET

__all__ = ["RewindOut", "RewindSession", "ToBranch", "ToOffset", "ToTurn", "Undo", "router"]


_BRANCH = Field(
    default=None,
    min_length=1,
    max_length=128,
    pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    description="the branch of the session the point is in (default: its current one)",
)


class ToOffset(Input):
    """Keep events ``[0, offset)`` of the branch (an offset of its own log)."""

    kind: Literal["offset"]
    offset: int = Field(ge=1, le=MAX_OFFSET)
    branch: str | None = _BRANCH

    _numbers = field_validator("offset", mode="before")(json_number)


class ToTurn(Input):
    """Go back to just before turn ``turn`` (numbered from 1) of the branch started."""

    kind: Literal["turn"]
    turn: int = Field(ge=1, le=MAX_OFFSET)
    branch: str | None = _BRANCH

    _numbers = field_validator("turn", mode="before")(json_number)


class ToBranch(Input):
    """Go to the head of a branch of the session (a rewind's branch left behind)."""

    kind: Literal["branch"]
    branch: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class Undo(Input):
    """Undo the session's last rewind."""

    kind: Literal["undo"]


class RewindSession(Input):
    point: Annotated[ToOffset | ToTurn | ToBranch | Undo, Field(discriminator="kind")]
    force: StrictBool = Field(default=False, description="overwrite files changed outside lodger")


class RewindOut(BaseModel):
    session_id: str
    branch: str
    source: str
    left: dict[str, str | int]
    to: dict[str, str | int]
    restored: int
    removed: int
    forced: list[str]
    files: list[str]


router = APIRouter()


@router.post("/v1/sessions/{session_id}/rewind", tags=["recovery"])
async def rewind(
    session_id: Session, body: RewindSession, request: Request, host: Parts
) -> RewindOut:
    """Rewind the session (see above); the answer names its new current branch."""
    hub = host.hub
    if await hub.busy(session_id):
        raise HostConflictError(
            f"session {session_id!r} is running a turn",
            hint="cancel it or wait for it to end, then rewind",
            code="session_busy",
            session_id=session_id,
        )
    point = body.point
    done = await hub.rewind(
        session_id,
        to=point.offset if isinstance(point, ToOffset) else None,
        turn=point.turn if isinstance(point, ToTurn) else None,
        branch=None if isinstance(point, Undo) else point.branch,
        undo=isinstance(point, Undo),
        force=body.force,
        who=host.auth.who(request),
    )
    return RewindOut.model_validate(done.to_dict())

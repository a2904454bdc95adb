"""Steering a running turn and the session's follow-up queue (``lodger.engine.steering``).

``POST .../steer`` commits a message for the running turn, read by the model at its next
provider boundary; with no turn running it is queued as the session's next turn. The
queue holds follow-up messages, each with a policy: ``enqueue`` waits for the running
turn, ``reject`` is refused (409 ``session_busy``) while the session has work,
``interrupt`` stops the running turn once its calls in flight settle and runs next,
``rollback`` abandons it before its next calls start and runs next. Every change is a
fact naming the token that made it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from lodger.engine.queue import MAX_TEXT, QueuedMessage, check_message
from lodger.errors import UsageError
from lodger.events import QueuePolicy
from lodger.host.routes._deps import Input, Parts, Session, json_number
from lodger.host.routes.messages import stream_path
from lodger.storage.control.interface import QueuedRow

__all__ = [
    "ChangeQueued",
    "QueueOut",
    "QueuedOut",
    "SendFollowUp",
    "SteerOut",
    "SteerTurn",
    "router",
]

MessageId = Path(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")


class SteerTurn(Input):
    text: str = Field(min_length=1, max_length=MAX_TEXT)


class SteerOut(BaseModel):
    steer_id: str
    #: ``steer``: for the running turn; ``queued``: the session's next turn
    status: Literal["steer", "queued"]
    #: its fact's offset (null on a distributed host: the worker commits it)
    offset: int | None
    stream: str


class SendFollowUp(Input):
    text: str = Field(min_length=1, max_length=MAX_TEXT)
    policy: QueuePolicy = "enqueue"


def _text_or_position(schema: dict[str, Any]) -> None:
    """The schema a client reads: one field or both, neither of them null."""
    schema["minProperties"] = 1
    schema["properties"]["text"] = {"type": "string", "minLength": 1, "maxLength": MAX_TEXT}
    schema["properties"]["position"] = {
        "type": "integer",
        "minimum": 0,
        "maximum": 1_000_000,
        "description": "0: the front of the queue",
    }


class ChangeQueued(Input):
    """A new text, a new position in the queue, or both."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_text_or_position)
    text: str | None = Field(default=None, min_length=1, max_length=MAX_TEXT)
    position: int | None = Field(default=None, ge=0, le=1_000_000)

    _numbers = field_validator("position", mode="before")(json_number)


class QueuedOut(BaseModel):
    message_id: str
    text: str
    policy: QueuePolicy
    who: str | None
    #: its ``message_queued`` fact's offset (null on a distributed host until a worker
    #: commits it to the log: till then the control plane holds it)
    offset: int | None


class QueueOut(BaseModel):
    session_id: str
    busy: bool
    messages: list[QueuedOut]


def _out(message: QueuedMessage | QueuedRow) -> QueuedOut:
    return QueuedOut(
        message_id=message.message_id,
        text=message.text,
        policy=check_message(message.text, message.policy),
        who=message.who,
        offset=message.offset if isinstance(message, QueuedMessage) else None,
    )


async def _queue_out(
    host: Parts, session_id: str, queue: Sequence[QueuedMessage | QueuedRow]
) -> QueueOut:
    return QueueOut(
        session_id=session_id,
        busy=await host.hub.busy(session_id),
        messages=[_out(m) for m in queue],
    )


router = APIRouter()


@router.post("/v1/sessions/{session_id}/steer", status_code=202, tags=["steering"])
async def steer(session_id: Session, body: SteerTurn, request: Request, host: Parts) -> SteerOut:
    """A message for the running turn, delivered at its next provider boundary (its
    ``steer_delivered`` fact names the step); with no turn running, the next turn."""
    steered = await host.hub.steer(session_id, body.text, who=host.auth.who(request))
    return SteerOut(
        steer_id=steered.steer_id,
        status=steered.status,
        offset=steered.offset,
        stream=stream_path(session_id),
    )


@router.get("/v1/sessions/{session_id}/queue", tags=["steering"])
async def queue(session_id: Session, host: Parts) -> QueueOut:
    """The follow-up queue, in the order it runs."""
    return await _queue_out(host, session_id, await host.hub.queue(session_id))


@router.post("/v1/sessions/{session_id}/queue", status_code=202, tags=["steering"])
async def follow_up(
    session_id: Session, body: SendFollowUp, request: Request, host: Parts
) -> QueuedOut:
    """Queue a follow-up message with its policy (409 ``session_busy`` for ``reject``
    while the session has work)."""
    queued = await host.hub.enqueue(
        session_id, body.text, policy=body.policy, who=host.auth.who(request)
    )
    return _out(queued)


@router.patch("/v1/sessions/{session_id}/queue/{message_id}", tags=["steering"])
async def change(
    session_id: Session,
    body: ChangeQueued,
    request: Request,
    host: Parts,
    message_id: str = MessageId,
) -> QueueOut:
    """Edit a queued message's text and/or move it (404 ``not_queued`` once it has been
    delivered or retracted)."""
    if body.text is None and body.position is None:
        raise UsageError("nothing to change: give text, position or both", code="invalid_request")
    who = host.auth.who(request)
    found = await host.hub.queue(session_id)
    if body.text is not None:
        found = await host.hub.change_queued(
            session_id, message_id, "edit", text=body.text, who=who
        )
    if body.position is not None:
        found = await host.hub.change_queued(
            session_id, message_id, "move", position=body.position, who=who
        )
    return await _queue_out(host, session_id, found)


@router.delete("/v1/sessions/{session_id}/queue/{message_id}", tags=["steering"])
async def retract(
    session_id: Session, request: Request, host: Parts, message_id: str = MessageId
) -> QueueOut:
    """Take a message out of the queue before it is delivered."""
    found = await host.hub.change_queued(
        session_id, message_id, "retract", who=host.auth.who(request)
    )
    return await _queue_out(host, session_id, found)

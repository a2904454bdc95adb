"""Messages: what a client asks a session to do (a turn of text), run in the background.

A message is found again by its idempotency key: the same key returns the same message and
runs nothing again. Keys starting with ``hook:`` are the host's own (webhook deliveries).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BaseModel, Field

from lodger.engine.modelsettings import settings_from_mapping
from lodger.errors import UsageError
from lodger.host.routes._deps import Input, Parts, Session
from lodger.host.routes.events import MAX_OFFSET
from lodger.storage.control.host_index import Message

__all__ = [
    "HOOK_KEY",
    "Accepted",
    "Key",
    "MessageOut",
    "SendMessage",
    "message_out",
    "router",
    "stream_path",
]

#: the prefix of the keys the host gives webhook deliveries (``hook:NAME:DELIVERY``): a
#: client's key may not take one, or it could claim a delivery before it arrives
HOOK_KEY = "hook:"


def _not_a_hook_key(key: str) -> str:
    if key.startswith(HOOK_KEY):
        raise ValueError(f"keys starting with {HOOK_KEY!r} are the host's own (webhooks)")
    return key


Key = Annotated[
    str,
    Field(
        min_length=1,
        max_length=200,
        pattern=r"^[\x21-\x7e]+$",
        description=f"any printable ASCII, not starting with {HOOK_KEY!r}",
    ),
    AfterValidator(_not_a_hook_key),
]


class SendMessage(Input):
    text: str = Field(min_length=1, max_length=200_000)
    idempotency_key: Key | None = None
    #: the turn's model settings (temperature, max_tokens, ...) over the project's
    model_settings: dict[str, Any] | None = Field(
        default=None,
        description="temperature, top_p, max_tokens, stop, seed, parallel_tool_calls, "
        "reasoning_effort, extra: as lodger.toml's [model_settings]",
    )


class MessageOut(BaseModel):
    id: int
    session_id: str
    idempotency_key: str
    kind: str
    status: str
    start_offset: int | None = None
    result: dict[str, Any] | None = None


class Accepted(BaseModel):
    message: MessageOut
    created: bool
    stream: str


def message_out(message: Message) -> MessageOut:
    return MessageOut(**message.to_dict())


def stream_path(session_id: str) -> str:
    return f"/v1/sessions/{session_id}/stream"


router = APIRouter()


@router.post("/v1/sessions/{session_id}/messages", status_code=202, tags=["sessions"])
async def send(
    session_id: Session,
    body: SendMessage,
    host: Parts,
    idempotency_key: Annotated[
        str | None, Header(alias="Idempotency-Key", max_length=200, pattern=r"^[\x21-\x7e]+$")
    ] = None,
) -> Accepted:
    """Queue a turn of ``text``; the same idempotency key returns the same message
    and runs nothing again. The turn runs in the background: follow ``stream``."""
    if idempotency_key is not None and idempotency_key.startswith(HOOK_KEY):
        where = ("header", "Idempotency-Key")
        msg = f"keys starting with {HOOK_KEY!r} are the host's own (webhooks)"
        raise RequestValidationError([{"loc": where, "msg": msg, "type": "value_error"}])
    key = body.idempotency_key or idempotency_key or f"auto:{uuid.uuid4()}"
    settings = None
    if body.model_settings is not None:
        settings = settings_from_mapping(
            body.model_settings, where="model_settings", error=UsageError
        )
    message, created = await host.hub.send(session_id, key=key, text=body.text, settings=settings)
    return Accepted(message=message_out(message), created=created, stream=stream_path(session_id))


@router.get("/v1/sessions/{session_id}/messages/{message_id}", tags=["sessions"])
async def show_message(
    session_id: Session, message_id: Annotated[int, Path(ge=0, le=MAX_OFFSET)], host: Parts
) -> MessageOut:
    found = await host.hub.message(session_id, message_id)
    if found is None:
        raise UsageError(
            f"session {session_id!r} has no message {message_id}",
            code="not_found",
            session_id=session_id,
        )
    return message_out(found)

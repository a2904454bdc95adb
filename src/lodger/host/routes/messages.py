"""Messages: what a client asks a session to do (a turn of text), run in the background.

A message is found again by its idempotency key: the same key returns the same message and
runs nothing again. Keys starting with ``hook:`` are the host's own (webhook deliveries).
"""

from __future__ import annotations

import base64
import uuid
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union
from urllib.parse import urlsplit

from fastapi import APIRouter, Header, Path
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BaseModel, Field, create_model, field_validator

from lodger.engine.modelsettings import REASONING_EFFORTS, settings_from_mapping
from lodger.errors import UsageError
from lodger.events import QueuePolicy
from lodger.host.limits import MAX_MEDIA_REQUEST
from lodger.host.routes._deps import Input, Parts, Session, json_number
from lodger.host.routes.events import MAX_OFFSET
from lodger.media import (
    URL_EXTENSIONS,
    BinaryContent,
    DocumentUrl,
    ImageUrl,
    MediaItem,
    MediaLimits,
    split_input,
    url_media_type,
)
from lodger.storage.control.host_index import Message
from lodger.tools._mcp_content import MCP_INPUT_PREFIX
from lodger.tools.mcp import McpInput, PromptRef, ResourceRef

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


_B64 = "[A-Za-z0-9+/]"
_REST = f"({_B64}{{4}})*({_B64}{{2}}==|{_B64}{{3}}=)?"
#: the base64 of each media type's bytes: valid base64 that starts as the type's files do
#: (the library's own check, ``lodger.media.check_media``, as a schema a client can read)
_DATA_PATTERNS: dict[str, str] = {
    "image/png": f"^iVBORw0KGg(o=|[o-r]{_B64}{_REST})$",
    "image/jpeg": f"^/9j/{_REST}$",
    "image/gif": f"^R0lGOD[dl]h{_REST}$",
    "image/webp": f"^UklGR[g-v]{_B64}{{4}}[BFJNRVZdhlptx159]XRUJQ{_REST}$",
    "application/pdf": f"^JVBERi(0=|[0-3]{_B64}{_REST})$",
}
_TEXT_TYPES = ("text/plain", "text/markdown", "text/csv")


class _Inline(Input):
    """An image or document's bytes: ``data`` is their base64 (standard alphabet, padded)."""

    media_type: str
    data: str
    name: str = Field(default="", max_length=500)

    def item(self) -> MediaItem:
        return BinaryContent(base64.b64decode(self.data), self.media_type, self.name)


def _inline(media_types: tuple[str, ...], pattern: str, title: str) -> type[_Inline]:
    fields: dict[str, Any] = {
        "media_type": (Literal[media_types], ...),
        "data": (str, Field(pattern=pattern, description="the bytes, base64")),
    }
    made: type[_Inline] = create_model(title, __base__=_Inline, **fields)
    return made


_INLINE = (
    *(
        _inline((media_type,), pattern, "Attachment" + media_type.split("/")[1].title())
        for media_type, pattern in _DATA_PATTERNS.items()
    ),
    _inline(_TEXT_TYPES, f"^{_REST}$", "AttachmentText"),
)


# printable ASCII only (a client percent-encodes the rest): the same characters for every
# regex engine that reads the schema (``\s`` is not: U+0085 is space in Python's only)
_HOST = r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?"
_PATH = r"[\x21\x22\x24-\x3e\x40-\x7e]"  # a path's characters: no '#', no '?'
_NAME = r"[\x21\x22\x24-\x2e\x30-\x3e\x40-\x7e]"  # a path's last segment's: no '/' either
_EXTENSIONS = "|".join(URL_EXTENSIONS)


class AttachmentUrl(Input):
    """An image or document the provider fetches from ``url`` (lodger never does), of
    the given media type."""

    url: str = Field(pattern=_HOST + r"([/?#][\x21-\x7e]*)?$", max_length=8_000)
    media_type: Literal[
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/webp",
        "application/pdf",
        "text/plain",
        "text/markdown",
        "text/csv",
    ]
    name: str = Field(default="", max_length=500)

    def item(self) -> MediaItem:
        if self.media_type.startswith("image/"):
            return ImageUrl(self.url, media_type=self.media_type)
        return DocumentUrl(self.url, media_type=self.media_type)


class AttachmentNamedUrl(Input):
    """An image or document by ``url`` whose path names its type by its extension
    (``.png``, ``.jpg``, ``.pdf``, ``.txt`` ...)."""

    url: str = Field(
        pattern=_HOST + rf"/({_PATH}*/)?{_NAME}*\.({_EXTENSIONS})([?#][\x21-\x7e]*)?$",
        max_length=8_000,
    )
    name: str = Field(default="", max_length=500)

    def item(self) -> MediaItem:
        media_type = url_media_type(urlsplit(self.url).path) or ""
        if media_type.startswith("image/"):
            return ImageUrl(self.url)
        return DocumentUrl(self.url)


if TYPE_CHECKING:
    AttachmentIn = _Inline | AttachmentUrl | AttachmentNamedUrl
else:
    AttachmentIn = Union[  # noqa: UP007 - built from the tuple of models at run time
        Annotated[Union[_INLINE], Field(discriminator="media_type")],  # noqa: UP007
        AttachmentUrl,
        AttachmentNamedUrl,
    ]


class ModelSettingsIn(Input):
    """A turn's model settings as the schema states them: every key and range the host
    checks is in the schema, so a request the schema allows is one the host takes."""

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: list[Annotated[str, Field(min_length=1)]] | None = None
    seed: int | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: Literal[REASONING_EFFORTS] | None = None  # type: ignore[valid-type]
    #: provider-specific options merged into the request body as they are
    extra: dict[str, Any] | None = None

    _numbers = field_validator("max_tokens", "seed", mode="before")(json_number)


def _server() -> Any:
    return Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$", description="an MCP server's name")


class ResourceIn(Input):
    """A resource of one of the session's MCP servers, read into the turn's input."""

    server: str = _server()
    uri: str = Field(min_length=1, max_length=8_000)


class PromptIn(Input):
    """A prompt of one of the session's MCP servers: the turn starts from its messages."""

    server: str = _server()
    name: str = Field(min_length=1, max_length=500)
    arguments: dict[str, Annotated[str, Field(max_length=20_000)]] = Field(
        default_factory=dict, max_length=64
    )


class SendMessage(Input):
    text: str = Field(
        min_length=1,
        max_length=200_000,
        description="the turn's input (after the prompt's messages, when it names one)",
    )
    idempotency_key: Key | None = None
    attachments: list[AttachmentIn] = Field(
        default_factory=list,
        max_length=32,
        description="images and documents for the model with the text; the request body "
        f"may then hold up to {MAX_MEDIA_REQUEST} bytes",
    )
    resources: list[ResourceIn] = Field(
        default_factory=list,
        max_length=16,
        description="MCP resources read into the turn's input when it starts",
    )
    prompt: PromptIn | None = Field(
        default=None, description="an MCP prompt the turn starts from (the text follows it)"
    )
    policy: QueuePolicy = Field(
        default="enqueue",
        description="what to do while the session has work, as the follow-up queue's "
        "policies: enqueue (run after it), reject (409 session_busy), interrupt (stop the "
        "running turn once its calls settle, then run this first), rollback (abandon the "
        "running turn before its next calls, then run this first)",
    )
    #: the turn's model settings (temperature, max_tokens, ...) over the project's
    model_settings: ModelSettingsIn | None = Field(
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
    mcp = _mcp_input(body)
    media: tuple[MediaItem, ...] = ()
    if body.attachments:  # the schema checked types and bytes; the sizes are checked here
        _, media = split_input([body.text, *(a.item() for a in body.attachments)], MediaLimits())
    settings = None
    if body.model_settings is not None:
        settings = settings_from_mapping(
            body.model_settings.model_dump(exclude_none=True),
            where="model_settings",
            error=UsageError,
        )
    message, created = await host.hub.send(
        session_id,
        key=key,
        text=body.text,
        media=media,
        settings=settings,
        mcp=mcp,
        policy=body.policy,
    )
    return Accepted(message=message_out(message), created=created, stream=stream_path(session_id))


def _mcp_input(body: SendMessage) -> McpInput | None:
    """The message's MCP resources and prompt (None: a plain message); its text must then
    not look like one the host made, and one of them must say something."""
    if body.text.startswith(MCP_INPUT_PREFIX):
        raise UsageError(f"a message may not start with {MCP_INPUT_PREFIX!r}", code="usage")
    if body.prompt is None and not body.resources:
        return None
    p = body.prompt
    return McpInput(
        text=body.text,
        resources=[ResourceRef(server=r.server, uri=r.uri) for r in body.resources],
        prompt=None
        if p is None
        else PromptRef(server=p.server, name=p.name, arguments=dict(p.arguments)),
    )


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

"""Images and documents in a turn's input and in tool results.

    from lodger import Agent, BinaryContent, ImageUrl

    await agent.run(["What is in this picture?", BinaryContent.from_path("cat.png")])
    await agent.run(["Compare them", ImageUrl("https://example.com/a.jpg")])

A turn's input is text or a sequence of text and media items (the names are
pydantic-ai's): ``BinaryContent`` (bytes and their media type), ``ImageUrl`` and
``DocumentUrl``. The texts are joined as the turn's input text. Before the
``turn_started`` fact commits, the bytes go to the session's artifact store
(content-addressed) and the fact lists them as ``Attachment`` values; a URL is recorded
and never fetched by lodger (the provider fetches it). What is checked first, with a
clear ``UsageError`` (``MediaLimits``): the media type is one the runtime takes, the size
of each item and of the turn, the bytes of an image or a PDF start as the declared type
does (text is taken as it is), and a URL is http or https.
"""

from __future__ import annotations

import json
import mimetypes
import os
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias
from urllib.parse import urlsplit

from lodger.errors import CorruptLogError, StorageError, UsageError
from lodger.events import Attachment
from lodger.storage.artifacts import ArtifactStore

__all__ = [
    "DEFAULT_MEDIA_TYPES",
    "URL_EXTENSIONS",
    "WAKE_MEDIA_PREFIX",
    "BinaryContent",
    "DocumentUrl",
    "ImageUrl",
    "MediaItem",
    "MediaKind",
    "MediaLimits",
    "UserInput",
    "attached_input",
    "check_media",
    "load_artifact",
    "media_kind",
    "media_message",
    "parse_media_message",
    "split_input",
    "store_media",
    "url_media_type",
    "wake_input",
    "wake_message",
    "wake_text",
]

MediaKind = Literal["image", "document"]

DEFAULT_MEDIA_TYPES: frozenset[str] = frozenset(
    {
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/webp",
        "application/pdf",
        "text/plain",
        "text/markdown",
        "text/csv",
    }
)
"""The media types a turn or a tool result may carry unless ``MediaLimits`` says others."""

#: how the bytes of each type begin (a declared type the bytes do not start as is refused)
_MAGIC: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "application/pdf": (b"%PDF-",),
}

_MB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class MediaLimits:
    """What media a turn (and a tool result) may carry: ``max_bytes`` per item,
    ``max_turn_bytes`` for all the items of one turn's input, ``media_types`` allowed."""

    max_bytes: int = 20 * _MB
    max_turn_bytes: int = 50 * _MB
    media_types: frozenset[str] = DEFAULT_MEDIA_TYPES


@dataclass(frozen=True)
class BinaryContent:
    """Bytes of an image or a document, with their media type (``image/png``...)."""

    data: bytes
    media_type: str
    name: str = ""

    @classmethod
    def from_path(
        cls, path: str | os.PathLike[str], *, media_type: str | None = None
    ) -> BinaryContent:
        """The file at ``path``; its media type guessed from its name unless given."""
        where = Path(path)
        guessed = media_type or _guess(where.name)
        if guessed is None:
            raise UsageError(
                f"cannot tell the media type of {str(where)!r} from its name",
                hint="pass media_type=... (image/png, application/pdf, text/plain ...)",
            )
        try:
            data = where.read_bytes()
        except OSError as exc:
            raise UsageError(
                f"cannot read {str(where)!r}: {exc.strerror or exc}",
                hint="check the path and its permissions",
            ) from None
        return cls(data, guessed, where.name)

    @property
    def kind(self) -> MediaKind:
        return media_kind(self.media_type)


@dataclass(frozen=True)
class ImageUrl:
    """An image the provider fetches from ``url`` (http or https; lodger never does)."""

    url: str
    media_type: str = field(default="", kw_only=True)


@dataclass(frozen=True)
class DocumentUrl:
    """A document (a PDF, text) the provider fetches from ``url`` (http or https)."""

    url: str
    media_type: str = field(default="", kw_only=True)


MediaItem: TypeAlias = BinaryContent | ImageUrl | DocumentUrl
UserInput: TypeAlias = str | Sequence[str | MediaItem]
"""A turn's input: text, or text and media items in order (the texts are joined)."""


def media_kind(media_type: str) -> MediaKind:
    """``image`` for ``image/*``, ``document`` for everything else."""
    return "image" if media_type.startswith("image/") else "document"


def _guess(name: str) -> str | None:
    if name.lower().endswith(".md"):
        return "text/markdown"
    if name.lower().endswith(".webp"):
        return "image/webp"
    return mimetypes.guess_type(name, strict=False)[0]


def check_media(data: bytes, media_type: str, *, name: str, limits: MediaLimits) -> None:
    """Raise ``UsageError`` unless ``data`` may travel as ``media_type``."""
    label = f"{name!r} ({media_type})" if name else media_type
    if media_type not in limits.media_types:
        raise UsageError(
            f"media type {media_type!r} of {label} is not one lodger takes",
            hint="allowed: " + ", ".join(sorted(limits.media_types)) + " (MediaLimits.media_types)",
        )
    if len(data) > limits.max_bytes:
        raise UsageError(
            f"{label} holds {len(data)} bytes, more than the {limits.max_bytes} allowed a part",
            hint="send a smaller file, or raise MediaLimits.max_bytes",
        )
    if not _starts_as(data, media_type):
        raise UsageError(
            f"the bytes of {label} are not {media_type} data (they do not start as such a "
            "file does)",
            hint="declare the media type the bytes really have",
        )


def _starts_as(data: bytes, media_type: str) -> bool:
    if media_type == "image/webp":
        return data[:4] == b"RIFF" and data[8:12] == b"WEBP"
    magic = _MAGIC.get(media_type)
    # text is taken as it is: an adapter that sends it as text decodes it (replacing
    # what is not UTF-8)
    return magic is None or data.startswith(magic)


#: a URL's media type by its path's extension (what a URL names, not what it serves)
URL_EXTENSIONS: dict[str, str] = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
    "pdf": "application/pdf",
    "txt": "text/plain",
    "md": "text/markdown",
    "csv": "text/csv",
}


def url_media_type(path: str) -> str | None:
    """The media type a URL's path names by its extension (None: it names none)."""
    name = path.rsplit("/", 1)[-1]
    if "." not in name:
        return None
    return URL_EXTENSIONS.get(name.rsplit(".", 1)[1].lower())


def _url_item(item: ImageUrl | DocumentUrl, limits: MediaLimits) -> ImageUrl | DocumentUrl:
    shown = repr(item.url[:200])
    try:
        parts = urlsplit(item.url)
    except ValueError as exc:
        raise UsageError(f"URL {shown} cannot be read: {exc}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise UsageError(
            f"URL {shown} is not http or https; lodger records URLs and the provider "
            "fetches them, so only web URLs are taken",
            hint="read a local file with BinaryContent.from_path(...) instead",
        )
    media_type = item.media_type or url_media_type(parts.path)
    if not media_type:
        raise UsageError(
            f"cannot tell the media type of URL {shown} from its path",
            hint=f"pass it: {type(item).__name__}(url, media_type='image/png')",
        )
    if media_type not in limits.media_types:
        raise UsageError(
            f"media type {media_type!r} of URL {shown} is not one lodger takes",
            hint="allowed: " + ", ".join(sorted(limits.media_types)),
        )
    if isinstance(item, ImageUrl) and not media_type.startswith("image/"):
        raise UsageError(
            f"ImageUrl {shown} names {media_type}, not an image",
            hint="use DocumentUrl for documents",
        )
    return type(item)(item.url, media_type=media_type)


def split_input(
    value: UserInput, limits: MediaLimits | None = None
) -> tuple[str, tuple[MediaItem, ...]]:
    """A turn's input as its text (the texts joined by blank lines) and its checked
    media items; raises ``UsageError`` on anything else."""
    if isinstance(value, str):
        return value, ()
    limits = limits or MediaLimits()
    if not isinstance(value, Sequence):
        raise UsageError(
            f"a turn's input is text or a list of text and media, not {type(value).__name__}",
            hint="pass a str, or [str, BinaryContent(...), ImageUrl(...), ...]",
        )
    texts: list[str] = []
    items: list[MediaItem] = []
    total = 0
    for item in value:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, BinaryContent):
            if not isinstance(item.data, bytes):
                raise UsageError(
                    f"BinaryContent {item.name!r} holds {type(item.data).__name__}, not bytes"
                )
            check_media(item.data, item.media_type, name=item.name, limits=limits)
            total += len(item.data)
            items.append(item)
        elif isinstance(item, ImageUrl | DocumentUrl):
            items.append(_url_item(item, limits))
        else:
            raise UsageError(
                f"a turn's input holds a {type(item).__name__}; it takes text, "
                "BinaryContent, ImageUrl and DocumentUrl",
                hint="turn other values into text first",
            )
    if total > limits.max_turn_bytes:
        raise UsageError(
            f"the turn's media hold {total} bytes, more than the {limits.max_turn_bytes} "
            "allowed a turn",
            hint="send fewer or smaller files, or raise MediaLimits.max_turn_bytes",
        )
    return "\n\n".join(texts), tuple(items)


async def store_media(
    items: Sequence[MediaItem],
    artifacts: ArtifactStore,
    into: MutableMapping[str, bytes],
) -> tuple[Attachment, ...]:
    """The ``Attachment`` of each item, its bytes stored as an artifact first (and kept in
    ``into`` by sha256, where the projection reads them)."""
    out: list[Attachment] = []
    for item in items:
        if isinstance(item, BinaryContent):
            ref = await artifacts.put(item.data, media_type=item.media_type)
            into[ref.sha256] = item.data
            out.append(Attachment(media_type=item.media_type, artifact=ref, name=item.name))
        else:
            out.append(Attachment(media_type=item.media_type, url=item.url))
    return tuple(out)


async def load_artifact(
    sha256: str, artifacts: ArtifactStore, *, what: str, session_id: str
) -> bytes:
    """The bytes of an artifact the session's context needs; fails closed naming it."""
    try:
        return await artifacts.get(sha256)
    except StorageError as exc:
        raise StorageError(
            f"session {session_id!r}: {what} (artifact {sha256}) cannot be read: {exc.message}",
            hint="restore the artifact store the session was written with; the model "
            "cannot be given its context without it",
            code=exc.code,
            session_id=session_id,
        ) from exc


def media_message(text: str, attachments: Sequence[Attachment]) -> str:
    """A turn's input text and attachments as one JSON text (a queued message's)."""
    return json.dumps(
        {"text": text, "attachments": [a.model_dump(mode="json") for a in attachments]},
        ensure_ascii=False,
        sort_keys=True,
    )


def parse_media_message(message: str) -> tuple[str, tuple[Attachment, ...]]:
    """``media_message``'s inverse; a ``CorruptLogError`` for a text it did not make."""
    try:
        raw = json.loads(message)
        text = raw["text"]
        if type(text) is not str:
            raise TypeError("the text is not a string")
        return text, tuple(Attachment.model_validate(a) for a in raw["attachments"])
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptLogError(
            f"a queued message with media cannot be read ({exc})",
            hint="the host's index was changed outside lodger; send the message again",
        ) from None


#: how a wake's message (text for a worker) says it carries media: this line, then the
#: ``media_message`` JSON. A host refuses a client's text that starts with it.
WAKE_MEDIA_PREFIX = "lodger-media/1\n"


def wake_message(text: str, attachments: Sequence[Attachment]) -> str:
    """A turn with attachments as a wake's message (their bytes are artifacts already)."""
    return WAKE_MEDIA_PREFIX + media_message(text, attachments)


def wake_text(message: str) -> str:
    """The input text of a wake's message (what its ``turn_started`` records)."""
    if not message.startswith(WAKE_MEDIA_PREFIX):
        return message
    return parse_media_message(message[len(WAKE_MEDIA_PREFIX) :])[0]


async def attached_input(
    text: str,
    attachments: Sequence[Attachment],
    artifacts: ArtifactStore,
    *,
    session_id: str,
) -> UserInput:
    """A queued turn's input again: the text, then each attachment (its bytes read from
    the artifacts, failing closed naming it)."""
    items: list[str | MediaItem] = [text]
    for a in attachments:
        if a.artifact is None:
            url = a.url or ""
            is_image = a.media_type.startswith("image/")
            item: MediaItem = (
                ImageUrl(url, media_type=a.media_type)
                if is_image
                else DocumentUrl(url, media_type=a.media_type)
            )
        else:
            data = await load_artifact(
                a.artifact.sha256,
                artifacts,
                what=f"attachment {a.name!r} ({a.media_type}) of a queued turn",
                session_id=session_id,
            )
            item = BinaryContent(data, a.media_type, a.name)
        items.append(item)
    return items


async def wake_input(message: str, artifacts: ArtifactStore, *, session_id: str) -> UserInput:
    """A wake's message as a turn's input (``wake_message``'s, or plain text)."""
    if not message.startswith(WAKE_MEDIA_PREFIX):
        return message
    text, attachments = parse_media_message(message[len(WAKE_MEDIA_PREFIX) :])
    return await attached_input(text, attachments, artifacts, session_id=session_id)

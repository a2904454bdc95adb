"""A bound on request bodies that holds whatever the client declares.

The ``count`` middleware refuses a declared ``Content-Length`` over the limit before
anything is read. A body sent without one (``Transfer-Encoding: chunked``) has no size
to check up front, so this ASGI middleware reads it first, at most ``limit + 1`` bytes,
answers 413 as soon as it is over, and otherwise hands the application the same body
as if it had been sent in one piece. Nothing the host keeps in memory for one request
is larger than the limit.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from lodger.errors import UsageError
from lodger.host.errors import error_body

__all__ = ["MAX_MEDIA_REQUEST", "MAX_REQUEST", "BodyLimit", "body_limit"]

#: the largest request body the host reads (a declared Content-Length over it is refused)
MAX_REQUEST = 1024 * 1024
#: a session's message, which may carry attachments in base64 (about 24 MB of media: more
#: goes through the library or the command line, which read files without a body limit)
MAX_MEDIA_REQUEST = 32 * 1024 * 1024


def body_limit(method: str, path: str) -> int:
    """The largest body of a request: only a session's messages may carry media."""
    if method == "POST" and path.startswith("/v1/sessions/") and path.endswith("/messages"):
        return MAX_MEDIA_REQUEST
    return MAX_REQUEST


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimit:
    """Bounds bodies without a Content-Length by ``limit_for(method, path)``."""

    def __init__(self, app: App, *, limit_for: Callable[[str, str], int] = body_limit) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _declares_length(scope):
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("method", ""), scope.get("path", ""))
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([], message, receive), send)
                return
            chunk = bytes(message.get("body", b""))
            size += len(chunk)
            if size > limit:
                await _refuse(send, limit)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], None, receive), send)


def _declares_length(scope: Scope) -> bool:
    """Whether the body's size is the declared Content-Length: not when a Transfer-Encoding
    is sent too, for then the server reads the chunks whatever length was declared."""
    names = {name.lower() for name, _ in scope.get("headers", ())}
    return b"content-length" in names and b"transfer-encoding" not in names


def _replay(first: list[Message], last: Message | None, receive: Receive) -> Receive:
    queued = [*first, *([last] if last is not None else [])]

    async def replay() -> Message:
        if queued:
            return queued.pop(0)
        return await receive()  # e.g. http.disconnect, for a streaming response

    return replay


async def _refuse(send: Send, limit: int) -> None:
    error = UsageError(
        f"a request body may hold at most {limit} bytes",
        hint="send large inputs as several messages",
        code="payload_too_large",
    )
    payload = json.dumps(error_body(error)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload, "more_body": False})

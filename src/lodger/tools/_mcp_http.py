"""The HTTP client lodger gives the SDK's streamable-HTTP transport: every body bounded.

The SDK reads a JSON answer whole (``response.aread()``: a 50 MB answer is held, then
parsed) and stops a server-sent event at its own 1 MiB, as "SSE stream failed", which
lodger took for a lost connection. ``bounded_http_client`` is the SDK's default client
(30 s timeouts, 300 s to read a stream) with a response hook that bounds each body
before the SDK reads it:

- a body that is not an event stream is read up to ``limit`` bytes; a longer one is
  closed unread and replaced by a JSON-RPC error answering its request (``too_large``);
- an event stream goes on one event at a time, each of at most ``limit`` bytes; a longer
  event is dropped unread, and if the stream answers a request an error event answers it
  and the stream ends (a stream of the server's own skips the event and goes on);
- a long body or event is parsed by lodger and the SDK gets a stub for it
  (``_mcp_streams.Parsed``), so pydantic's costlier parsing never sees it;
- lodger asks for no compression (a few kilobytes of gzip can inflate to gigabytes past
  any count of the bytes on the wire); a body compressed anyway is refused the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from lodger._core.extras import require
from lodger.tools._mcp_limits import MESSAGE_TOO_LARGE, Noise, too_large
from lodger.tools._mcp_streams import Parsed

with require("mcp", "the MCP client (MCP servers as tools)"):
    import httpx2

__all__ = ["SSE_BACKSTOP", "bounded_http_client"]

#: added to the limit for the SDK's own bound on an event, which ours always meets first
SSE_BACKSTOP = 64 * 1024

_EVENT_END = re.compile(rb"\r?\n\r?\n")


@dataclass(frozen=True, slots=True)
class _Bounds:
    server: str
    limit: int
    noise: Noise
    parsed: Parsed


def bounded_http_client(
    *,
    server: str,
    headers: Mapping[str, str],
    limit: int,
    noise: Noise,
    parsed: Parsed,
    auth: httpx2.Auth | None = None,
) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` for server ``server`` whose every body is bounded (and
    parsed into ``parsed`` when long); ``auth`` signs its requests (an OAuth login)."""
    bounds = _Bounds(server=server, limit=limit, noise=noise, parsed=parsed)

    async def bound(response: httpx2.Response) -> None:
        await _bound(response, bounds)

    return httpx2.AsyncClient(
        headers={**headers, "Accept-Encoding": "identity"},
        timeout=httpx2.Timeout(30, read=300),
        event_hooks={"response": [bound]},
        auth=auth,
    )


def _asked(request: httpx2.Request) -> int | str | None:
    """The id of the JSON-RPC request ``request`` carries, if it carries one."""
    try:
        body = json.loads(request.content) if request.content else None
    except (httpx2.RequestNotRead, ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("method"), str):
        return None
    asked = body.get("id")
    if not isinstance(asked, int | str) or isinstance(asked, bool):
        return None  # a notification, or the client's answer to the server
    return asked


def _error(asked: int | str, message: str) -> bytes:
    error = {"code": MESSAGE_TOO_LARGE, "message": message}
    return json.dumps({"jsonrpc": "2.0", "id": asked, "error": error}).encode()


async def _bound(response: httpx2.Response, bounds: _Bounds) -> None:
    asked = _asked(response.request)
    raw = response.stream
    assert isinstance(raw, httpx2.AsyncByteStream)
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        await raw.aclose()
        bounds.noise.compressed += 1
        why = (
            f"MCP server {bounds.server!r} compressed its answer ({encoding}) though lodger "
            "asked for none, so lodger cannot bound its size and did not read it"
        )
        _replace(response, _error(asked, why) if asked is not None else b"")
        return
    if response.headers.get("content-type", "").lower().startswith("text/event-stream"):
        response.stream = _BoundedEvents(raw, bounds, asked=asked)
        return
    body = bytearray()
    async for chunk in raw:
        body += chunk
        if len(body) > bounds.limit:
            await raw.aclose()
            bounds.noise.message(len(body))
            message = too_large(bounds.server, None, bounds.limit)
            _replace(response, _error(asked, message) if asked is not None else b"")
            return
    await raw.aclose()
    content = bounds.parsed.stub(bytes(body))
    if len(content) != len(body):
        response.headers["content-length"] = str(len(content))
    response.stream = httpx2.ByteStream(content)


def _replace(response: httpx2.Response, body: bytes) -> None:
    """Make ``response`` a JSON answer of ``body`` (an error of lodger's, or nothing)."""
    for name in ("content-encoding", "transfer-encoding"):
        response.headers.pop(name, None)
    response.headers["content-type"] = "application/json"
    response.headers["content-length"] = str(len(body))
    response.stream = httpx2.ByteStream(body)


class _BoundedEvents(httpx2.AsyncByteStream):
    """An event stream passed on whole events at a time, none over the limit."""

    def __init__(
        self,
        raw: httpx2.AsyncByteStream,
        bounds: _Bounds,
        *,
        asked: int | str | None,
    ) -> None:
        self._raw, self._bounds, self._asked = raw, bounds, asked

    async def __aiter__(self) -> AsyncIterator[bytes]:
        limit = self._bounds.limit
        pending = bytearray()  # the event being read, not yet passed on
        skipping = False
        async for chunk in self._raw:
            scan = max(0, len(pending) - 3)  # a boundary may straddle two chunks
            pending += chunk
            while (end := _EVENT_END.search(pending, scan)) is not None:
                event = bytes(pending[: end.end()])
                del pending[: end.end()]
                scan = 0
                if skipping:
                    skipping = False  # the end of the event that was too large
                elif event.strip():
                    yield self._stubbed(event)
            if len(pending) > limit and not skipping:
                self._bounds.noise.message(len(pending))
                if self._asked is not None:
                    message = too_large(self._bounds.server, None, limit)
                    yield b"event: message\ndata: " + _error(self._asked, message) + b"\n\n"
                    return
                skipping = True
            if skipping:
                del pending[:-3]  # only what a boundary needs
        if pending.strip() and not skipping:
            yield bytes(pending)

    def _stubbed(self, event: bytes) -> bytes:
        """The event, its data a stub when it is long (its other fields as they were)."""
        if len(event) < Parsed.SMALL:
            return event
        lines = event.decode("utf-8", "replace").splitlines()
        data = [line[5:].removeprefix(" ") for line in lines if line.startswith("data:")]
        text = "\n".join(data).encode()
        stub = self._bounds.parsed.stub(text)
        if stub is text:
            return event
        others = [line for line in lines if line and not line.startswith("data:")]
        return "\n".join([*others, "data: " + stub.decode()]).encode() + b"\n\n"

    async def aclose(self) -> None:
        await self._raw.aclose()

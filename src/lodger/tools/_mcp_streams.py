"""The message streams between a server's transport and the SDK's ``Client``, watched.

``watched`` wraps both streams of a transport:

- the read stream reports its end (the server exited or hung up) while the connection
  is idle, so the next call starts the server again instead of failing on a dead one;
- an answer to ``tools/list`` is mended before the SDK validates it. The SDK refuses a
  whole listing when one tool in it is not valid MCP (an input schema that is not an
  object, a description that is a number): that server would not start. Each tool is
  checked on its own against the negotiated protocol version instead; one that fails is
  bound with an empty object schema and the reason (``Listing.unusable``: the call path
  refuses its calls and says why), one without a usable name is left out. A listing
  longer than ``keep`` tools is cut to ``keep`` before the SDK builds a model of each
  (``Listing.listed`` counts them all);
- a message lodger parsed itself (``Parsed``: over HTTP, where the SDK would parse the
  text again, at up to about four times the memory) takes the place of the stub the SDK
  parsed instead.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from pydantic import ValidationError

from lodger._core.extras import require

with require("mcp", "the MCP client (MCP servers as tools)"):
    import anyio
    import mcp_types
    from mcp.shared.message import SessionMessage
    from mcp_types import methods

__all__ = ["Listing", "Parsed", "watched"]


class Listing:
    """What lodger made of the server's ``tools/list`` answers."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        #: tools the server listed, before any cut
        self.listed = 0
        #: tools left out for having no usable name
        self.unnamed = 0
        #: why a bound tool cannot be called, by its name on the server
        self.unusable: dict[str, str] = {}
        self._version: str | None = None
        self._initialize: set[int | str] = set()
        self._listings: set[int | str] = set()

    def sent(self, message: SessionMessage) -> None:
        request = message.message
        if isinstance(request, mcp_types.JSONRPCRequest):
            if request.method == "initialize":
                self._initialize.add(request.id)
            elif request.method == "tools/list":
                self._listings.add(request.id)

    def received(self, item: object) -> None:
        if not isinstance(item, SessionMessage):
            return
        answer = item.message
        if not isinstance(answer, mcp_types.JSONRPCResponse):
            return
        if answer.id in self._initialize:
            self._initialize.discard(answer.id)
            version = answer.result.get("protocolVersion")
            self._version = version if isinstance(version, str) else None
        elif answer.id in self._listings:
            self._listings.discard(answer.id)
            tools = answer.result.get("tools")
            if isinstance(tools, list):
                answer.result["tools"] = self._mended(tools)

    def _mended(self, tools: list[Any]) -> list[Any]:
        self.listed += len(tools)
        kept: list[Any] = []
        for tool in tools[: self.keep]:
            problem = self._problem(tool)
            if problem is None:
                kept.append(tool)
                continue
            name = tool.get("name") if isinstance(tool, dict) else None
            if not isinstance(name, str) or not name:
                self.unnamed += 1
                continue
            self.unusable[name] = f"its definition is not valid MCP ({problem})"
            description = tool.get("description")
            kept.append(
                {
                    "name": name,
                    "description": description if isinstance(description, str) else "",
                    "inputSchema": {"type": "object"},
                }
            )
        return kept

    def _problem(self, tool: object) -> str | None:
        """Why the SDK would refuse ``tool`` (what is wrong, and where), or None."""
        try:
            if self._version is None:
                raise KeyError("no version")
            methods.validate_server_result("tools/list", self._version, {"tools": [tool]})
        except ValidationError as exc:
            return _first(exc, skip=2)  # the error's place starts at tools.0
        except (KeyError, ValueError):  # a version the SDK has no table for
            try:
                mcp_types.Tool.model_validate(tool, by_name=False)
            except ValidationError as exc:
                return _first(exc, skip=0)
        return None


def _first(exc: ValidationError, *, skip: int) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"][skip:]) or "the tool"
    return f"at {where}: {str(first['msg'])[:200]}"


_STUB = "_lodger_parsed"  # the one key of a stub's result, params or error data


class Parsed:
    """Messages lodger parsed from text the SDK would parse again, and the stubs it hands
    the SDK instead: pydantic's parsing of a message of many small values (a listing of
    50 000 tools, a list of empty objects) takes 50 to 110 times its size, Python's
    ``json`` and a model of the result 20 to 30 times."""

    SMALL = 64 * 1024  #: text shorter than this is left to the SDK: its cost is small
    _HELD = 16  # stubs the SDK dropped (a cancelled request) are forgotten past this many

    def __init__(self) -> None:
        self._held: dict[str, Any] = {}
        self._token = secrets.token_hex(8)  # a server cannot forge a stub
        self._count = 0

    def stub(self, text: bytes) -> bytes:
        """The stub the SDK parses in place of ``text`` (or ``text``, when it is short or
        not a JSON-RPC message: the SDK says what is wrong with it)."""
        if len(text) < self.SMALL:
            return text
        try:
            message = mcp_types.jsonrpc_message_adapter.validate_python(
                json.loads(text), by_name=False
            )
        except (ValueError, RecursionError):
            return text
        self._count += 1
        key = f"{self._token}-{self._count}"
        self._held[key] = message
        while len(self._held) > self._HELD:
            del self._held[next(iter(self._held))]
        stub: dict[str, Any] = {"jsonrpc": "2.0"}
        if isinstance(message, mcp_types.JSONRPCResponse):
            stub.update(id=message.id, result={_STUB: key})
        elif isinstance(message, mcp_types.JSONRPCError):
            error = {"code": message.error.code, "message": "", "data": {_STUB: key}}
            stub.update(id=message.id, error=error)
        else:  # a request or a notification of the server's own
            stub.update(method=message.method, params={_STUB: key})
            if isinstance(message, mcp_types.JSONRPCRequest):
                stub["id"] = message.id
        return json.dumps(stub).encode()

    def take(self, item: object) -> object:
        """``item`` with the message its stub stands for, if it is a stub."""
        if not isinstance(item, SessionMessage):
            return item
        message = item.message
        if isinstance(message, mcp_types.JSONRPCError):
            carrier = message.error.data
        elif isinstance(message, mcp_types.JSONRPCResponse):
            carrier = message.result
        else:
            carrier = message.params
        if not (isinstance(carrier, dict) and len(carrier) == 1 and _STUB in carrier):
            return item
        real = self._held.pop(str(carrier[_STUB]), None)
        if real is None:
            return item
        if not isinstance(message, mcp_types.JSONRPCNotification):
            real.id = message.id  # the SDK may have set the id of the request it answers
        return SessionMessage(real, metadata=item.metadata)


class _EndWatch:
    """A transport's read stream that reports its end and mends messages on the way."""

    def __init__(
        self, stream: Any, ended: Callable[[], None], listing: Listing, parsed: Parsed | None
    ) -> None:
        self._stream = stream
        self._ended = ended
        self._listing = listing
        self._parsed = parsed

    def __getattr__(self, name: str) -> Any:  # ``last_context`` and the like
        return getattr(self._stream, name)

    async def receive(self) -> Any:
        try:
            item = await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._ended()
            raise
        if self._parsed is not None:
            item = self._parsed.take(item)
        self._listing.received(item)
        return item

    def __aiter__(self) -> _EndWatch:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> _EndWatch:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        result: bool | None = await self._stream.__aexit__(*exc)
        return result


class _Sent:
    """A transport's write stream that notes which requests ask for what."""

    def __init__(self, stream: Any, listing: Listing) -> None:
        self._stream = stream
        self._listing = listing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def send(self, message: SessionMessage) -> None:
        self._listing.sent(message)
        await self._stream.send(message)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> _Sent:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        result: bool | None = await self._stream.__aexit__(*exc)
        return result


@asynccontextmanager
async def watched(
    transport: Any, ended: Callable[[], None], listing: Listing, parsed: Parsed | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """``transport`` with its streams watched: ``ended`` is called when the server's end
    closes, ``listing`` mends and records its listings, ``parsed`` replaces its stubs."""
    async with transport as (read, write):
        yield _EndWatch(read, ended, listing, parsed), _Sent(write, listing)

"""HTTP/1.1 message framing for the egress proxy: where a request's body ends, so that the
next request on the same connection is read as a request (and checked) rather than piped
as bytes, and where a response ends, so that the proxy knows whether the connection can
carry another request.

Bodies are re-framed, never copied blindly: a ``Content-Length`` body is copied to the
byte, a chunked one is read chunk by chunk and written out again in canonical form
(extensions and trailers dropped), so the proxy and the server behind it cannot read
different boundaries. A request whose framing is ambiguous (``Content-Length`` and
``Transfer-Encoding`` both, two different lengths, a coding other than ``chunked``) is
refused by the caller (``BadFraming``).
"""

from __future__ import annotations

import asyncio
from typing import Final

__all__ = [
    "CHUNKED",
    "UNTIL_CLOSE",
    "BadFraming",
    "copy_body",
    "read_head",
    "request_framing",
    "response_framing",
    "tokens",
]

#: a body sent in chunks (``Transfer-Encoding: chunked``)
CHUNKED: Final = -1
#: a response body that ends when the server closes the connection
UNTIL_CLOSE: Final = -2
_MAX_HEAD = 64 * 1024
_MAX_CHUNK_LINE = 1024
_MAX_TRAILERS = 64 * 1024
_HEX = frozenset(b"0123456789abcdefABCDEF")


class BadFraming(ValueError):
    """A message whose body boundaries could be read two ways."""


async def read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The next message head (through its blank line); None when the connection ends
    before a byte of it. Empty lines before a request line are skipped (RFC 9112 §2.2)."""
    for _ in range(8):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial.strip(b"\r\n"):
                return None
            raise
        if len(head) > _MAX_HEAD:
            raise ValueError("message head too large")
        head = head.lstrip(b"\r\n")
        if head:
            return head
    raise ValueError("only empty lines")


def tokens(headers: list[str], name: str) -> list[str]:
    """The comma-separated values of every ``name`` header, lowercased."""
    found: list[str] = []
    for line in headers:
        key, _, value = line.partition(":")
        if key.strip().lower() == name:
            found += [token.strip().lower() for token in value.split(",") if token.strip()]
    return found


def request_framing(headers: list[str]) -> int:
    """The length of a request's body, or ``CHUNKED``; ``BadFraming`` when it could be
    read two ways (a request smuggled behind it is how a checked connection is misused)."""
    codings = tokens(headers, "transfer-encoding")
    lengths = tokens(headers, "content-length")
    if codings:
        if lengths:
            raise BadFraming("both Content-Length and Transfer-Encoding")
        if codings != ["chunked"]:
            raise BadFraming(f"Transfer-Encoding {', '.join(codings)} (only chunked is served)")
        return CHUNKED
    return _length(lengths)


def response_framing(method: str, status: int, headers: list[str]) -> int:
    """The length of a response's body, ``CHUNKED`` or ``UNTIL_CLOSE`` (RFC 9112 §6.3)."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return 0
    codings = tokens(headers, "transfer-encoding")
    if codings:
        return CHUNKED if codings[-1] == "chunked" else UNTIL_CLOSE
    lengths = tokens(headers, "content-length")
    return UNTIL_CLOSE if not lengths else _length(lengths)


def _length(values: list[str]) -> int:
    if not values:
        return 0
    if len(set(values)) != 1 or not all(v.isascii() and v.isdigit() for v in values):
        raise BadFraming(f"Content-Length {', '.join(values)}")
    if len(values[0]) > 18:
        raise BadFraming("Content-Length too large")
    return int(values[0])


async def copy_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int) -> None:
    """Copy one body framed as ``size`` says (a length, ``CHUNKED`` or ``UNTIL_CLOSE``)."""
    if size == UNTIL_CLOSE:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    elif size == CHUNKED:
        await _copy_chunked(reader, writer)
    else:
        await _copy_exactly(reader, writer, size)


async def _copy_exactly(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int
) -> None:
    left = size
    while left:
        data = await reader.read(min(left, 65536))
        if not data:
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(data)
        writer.write(data)
        await writer.drain()


async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        line = await _line(reader, _MAX_CHUNK_LINE)
        text = line.split(b";", 1)[0].strip(b" \t")
        if not text or len(text) > 15 or not set(text) <= _HEX:
            raise BadFraming(f"bad chunk size line {line[:40]!r}")
        size = int(text, 16)
        if size == 0:
            break
        writer.write(b"%x\r\n" % size)
        await _copy_exactly(reader, writer, size)
        if await reader.readexactly(2) != b"\r\n":
            raise BadFraming("a chunk not followed by CRLF")
        writer.write(b"\r\n")
    trailers = 0
    while (line := await _line(reader, _MAX_TRAILERS)) != b"":
        trailers += len(line)
        if trailers > _MAX_TRAILERS:
            raise BadFraming("trailers too large")
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _line(reader: asyncio.StreamReader, limit: int) -> bytes:
    """One CRLF-ended line without its CRLF; a bare CR or LF in it is ``BadFraming``."""
    line = (await reader.readuntil(b"\r\n"))[:-2]
    if len(line) > limit or b"\r" in line or b"\n" in line:
        raise BadFraming("bad line in a chunked body")
    return line

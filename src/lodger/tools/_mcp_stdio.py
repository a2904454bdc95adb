"""The stdio transport to an MCP server, reading its stdout with a bound per line.

The SDK's ``stdio_client`` keeps a line of any length (a 50 MB line: 50 MB, built by
repeated concatenation, then parsed whole) and logs a traceback for every line that is
not JSON-RPC. ``bounded_stdio`` is the same transport (the process in a session of its
own, the SDK's default environment, newline-delimited JSON-RPC both ways, and the SDK's
shutdown: stdin closed, then SIGTERM to the process group, then SIGKILL) with its own
reading of stdout:

- a line is kept only up to ``limit`` bytes; past that the rest of it is counted and
  skipped to its newline, never held. If it was the answer to a request (its ``id`` is
  in its first or last bytes, and no ``method``), that request gets an error result
  saying so (``too_large``) instead of waiting out its timeout;
- a line that is not a JSON-RPC message is counted in the server's ``Noise`` and
  dropped: the session never sees it, nothing is logged for it;
- bytes that are not UTF-8 are replaced, as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, TextIO

from lodger._core.extras import require
from lodger.tools._mcp_limits import MESSAGE_TOO_LARGE, Noise, too_large

with require("mcp", "the MCP client (MCP servers as tools)"):
    import anyio
    import anyio.lowlevel
    import mcp_types
    from anyio.abc import Process
    from mcp.client.stdio import get_default_environment
    from mcp.os.posix.utilities import terminate_posix_process_tree
    from mcp.shared.message import SessionMessage

__all__ = ["bounded_stdio"]

_EXIT_GRACE_S = 2.0  # for the server to exit once its stdin is closed (the SDK's)
_KILL_GRACE_S = 2.0  # after SIGTERM, before SIGKILL
_FLUSH_S = 0.5  # for the writer to send what it accepted before stdin closes
_KEPT = 256  # bytes kept of each end of a skipped line, to find its id

_HEAD_ID = re.compile(
    rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,100}")'
)
_TAIL_ID = re.compile(
    rb'"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,100}")\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*$'
)


@dataclass(frozen=True, slots=True)
class _Skipped:
    """A line longer than the limit: its size and its two ends."""

    size: int
    head: bytes
    tail: bytes

    def answered(self) -> int | str | None:
        """The id of the request this line answered, if its ends show one."""
        if b'"method"' in self.head or b'"method"' in self.tail:
            return None  # a request or notification of the server's own
        found = _HEAD_ID.match(self.head) or _TAIL_ID.search(self.tail)
        if found is None:
            return None
        value = json.loads(found.group(1))
        return value if isinstance(value, int | str) else None


class _Lines:
    """Splits a byte stream into lines of at most ``limit`` bytes; a longer one comes out
    as ``_Skipped``, having held no more than ``limit`` bytes of it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._head: bytes | None = None  # set while skipping
        self._tail = b""

    def feed(self, chunk: bytes) -> list[bytes | _Skipped]:
        out: list[bytes | _Skipped] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            self._add(chunk[start:] if end < 0 else chunk[start:end])
            if end < 0:
                return out
            out.append(self._finish())
            start = end + 1

    def _add(self, piece: bytes) -> None:
        self._size += len(piece)
        if self._head is not None:
            if len(self._head) < _KEPT:
                self._head += piece[: _KEPT - len(self._head)]
            self._tail = (self._tail + piece[-_KEPT:])[-_KEPT:]
        elif self._size > self.limit:
            parts = [*self._parts, piece]  # not joined whole: that would be the limit again
            head = tail = b""
            for part in parts:
                head += part[: _KEPT - len(head)]
                if len(head) >= _KEPT:
                    break
            for part in reversed(parts):
                tail = part[-(_KEPT - len(tail)) :] + tail
                if len(tail) >= _KEPT:
                    break
            self._head, self._tail, self._parts = head, tail, []
        else:
            self._parts.append(piece)

    def _finish(self) -> bytes | _Skipped:
        line: bytes | _Skipped
        if self._head is not None:
            line = _Skipped(self._size, self._head, self._tail)
        else:
            line = b"".join(self._parts)
        self._parts, self._size, self._head, self._tail = [], 0, None, b""
        return line


def _message(line: bytes, noise: Noise) -> SessionMessage | None:
    if not line or line.isspace():
        return None  # a blank line is not worth a count
    try:
        try:
            value = json.loads(line)
        except UnicodeDecodeError:  # replaced, as the SDK's reader does
            value = json.loads(line.decode("utf-8", "replace"))
        # parsed to Python first: pydantic's own parsing of the text takes 3 to 4 times
        # the memory for a message of many small values (a listing of 50 000 tools)
        message = mcp_types.jsonrpc_message_adapter.validate_python(value, by_name=False)
    except (ValueError, RecursionError):  # not JSON, too deep, or no JSON-RPC message
        noise.line(line[:200].decode("utf-8", "replace").strip())
        return None
    return SessionMessage(message)


def _refusal(server: str, skipped: _Skipped, limit: int) -> SessionMessage | None:
    answered = skipped.answered()
    if answered is None:
        return None
    error = mcp_types.ErrorData(
        code=MESSAGE_TOO_LARGE, message=too_large(server, skipped.size, limit)
    )
    return SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=answered, error=error))


@asynccontextmanager
async def bounded_stdio(
    *,
    server: str,
    command: str,
    args: list[str],
    env: dict[str, str] | None,
    cwd: str | None,
    errlog: TextIO,
    limit: int,
    noise: Noise,
) -> AsyncIterator[tuple[Any, Any]]:
    """Start the server and yield the (read, write) message streams the SDK's ``Client``
    takes; leaving stops it."""
    process = await anyio.open_process(
        [command, *args],
        env=get_default_environment() | (env or {}),
        stderr=errlog,
        cwd=cwd,
        start_new_session=True,
    )
    # no await between the spawn and the task group: a cancellation there leaks the server
    to_session, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    async def reader() -> None:
        assert process.stdout is not None
        lines = _Lines(limit)
        try:
            async with to_session:
                async for chunk in process.stdout:
                    for line in lines.feed(chunk):
                        if isinstance(line, _Skipped):
                            noise.message(line.size)
                            message = _refusal(server, line, limit)
                        else:
                            message = _message(line, noise)
                        if message is not None:
                            await to_session.send(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
            pass  # the session or our own shutdown closed a stream under the read
        finally:
            await _drain(process)

    async def writer() -> None:
        assert process.stdin is not None
        try:
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode("utf-8", "replace"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await to_session.aclose()  # the session sees the end instead of hanging
        finally:
            writer_done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        group.start_soon(writer)
        try:
            yield read, write
        finally:
            with anyio.CancelScope(shield=True):  # every wait below is bounded
                read.close()
                write.close()
                with anyio.move_on_after(_FLUSH_S):
                    await writer_done.wait()
                await _stop(process)
                for stream in (read, write, to_session, from_session):
                    await stream.aclose()
                await anyio.lowlevel.checkpoint()
            group.cancel_scope.cancel()


async def _drain(process: Process) -> None:
    """Read and drop the rest of stdout, so a server blocked writing it can exit."""
    assert process.stdout is not None
    with (
        anyio.CancelScope(shield=True),
        suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError),
    ):
        while True:
            await process.stdout.receive()


async def _stop(process: Process) -> None:
    """Close stdin, wait for the exit, then end the process group (as the SDK does)."""
    assert process.stdin is not None and process.stdout is not None
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exited(process, _EXIT_GRACE_S):
        await terminate_posix_process_tree(process, _KILL_GRACE_S)
        await _exited(process, _KILL_GRACE_S)
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()
    # the asyncio transport stays open while a survivor holds a pipe: close it now
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    close = getattr(transport, "close", None)
    if callable(close):
        with suppress(PermissionError):
            close()


async def _exited(process: Process, seconds: float) -> bool:
    # polled, not process.wait(): that also waits for the pipes, which a child may hold
    with anyio.move_on_after(seconds):
        while process.returncode is None:  # noqa: ASYNC110 - no event says it exited
            await anyio.sleep(0.01)
    return process.returncode is not None

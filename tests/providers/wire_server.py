"""A real HTTP server on loopback that plays scripted provider replies.

Each test pushes the replies it wants (a Server-Sent Events stream, or an HTTP error with
a JSON body) and then calls the adapter, which talks to this server through the official
SDK over a real socket. Every request the server received is recorded with its parsed
JSON body, so tests can check the exact wire shape the adapter produced.

The server runs in its own thread (stdlib ``http.server``), so the event loop under test is
never blocked by it. Streams use chunked transfer encoding like the real APIs do; a stream
can be ``cut`` to drop the connection before the body is complete.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from lodger.events import ProposedCall
from lodger.providers.base import (
    AssistantMessage,
    ModelRequest,
    ToolResultMessage,
    ToolSchema,
    UserMessage,
)

__all__ = [
    "READ_SCHEMA",
    "SEARCH_SCHEMA",
    "Fail",
    "Recorded",
    "Stream",
    "WireServer",
    "closed_port",
    "history_request",
    "sse",
]


@dataclass(frozen=True)
class Recorded:
    """One request as the server saw it; header names are lower-case."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass(frozen=True)
class Stream:
    """A 200 response streamed as SSE frames, each ``(event name or None, data text)``.

    ``cut`` drops the connection after the frames; ``delay`` waits before answering;
    ``gap`` waits between frames (a model that writes slowly).
    """

    frames: Sequence[tuple[str | None, str]]
    cut: bool = False
    delay: float = 0.0
    gap: float = 0.0


@dataclass(frozen=True)
class Fail:
    """An HTTP error status with a JSON body (and extra headers, e.g. ``Retry-After``)."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


Reply = Stream | Fail


def sse(data: object, *, event: str | None = None) -> tuple[str | None, str]:
    """One SSE frame whose data is ``data`` encoded as JSON (a ``str`` is sent as is)."""
    return event, data if isinstance(data, str) else json.dumps(data)


def closed_port() -> int:
    """A loopback port with nothing listening on it (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class _QuietServer(ThreadingHTTPServer):
    """Clients that hang up mid-reply are part of the tests; don't print their tracebacks."""

    def handle_error(self, request: object, client_address: object) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError | TimeoutError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class WireServer:
    """Serve scripted replies in order; use as a context manager."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._httpd = _QuietServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def _next_reply(self) -> Reply:
        with self._lock:
            if self._replies:
                return self._replies.popleft()
        return Fail(599, {"error": {"message": "the test scripted no reply for this request"}})

    def _record(self, request: Recorded) -> None:
        with self._lock:
            self.requests.append(request)

    def __enter__(self) -> WireServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                server._record(
                    Recorded(
                        method="POST",
                        path=self.path,
                        headers={k.lower(): v for k, v in self.headers.items()},
                        body=json.loads(raw) if raw else None,
                    )
                )
                reply = server._next_reply()
                if isinstance(reply, Stream) and reply.delay:
                    time.sleep(reply.delay)  # this is the server's own thread, not the loop
                try:
                    if isinstance(reply, Fail):
                        self._send_json(reply.status, reply.body, reply.headers)
                    else:
                        self._send_stream(reply)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client went away; nothing to report

            def _send_json(
                self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _send_stream(self, reply: Stream) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for n, (event, data) in enumerate(reply.frames):
                    if n and reply.gap:
                        time.sleep(reply.gap)  # the server's own thread, not the loop
                    frame = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
                    self._chunk(frame.encode())
                if reply.cut:
                    # No terminating chunk: the client sees the body end mid-message.
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        return Handler


READ_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
    "additionalProperties": False,
}
SEARCH_SCHEMA = {
    "type": "object",
    "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
    "required": ["pattern"],
}


def history_request(*, max_output_tokens: int | None = None) -> ModelRequest:
    """A step after one round of two tool calls (the second failed) and a user follow-up.

    Results come in call order, as the context projection promises.
    """
    return ModelRequest(
        system="You are a careful assistant.",
        messages=(
            UserMessage(text="What is in a.txt, and where is TODO?"),
            AssistantMessage(
                text="Let me look.",
                calls=(
                    ProposedCall(call_id="call_a", name="read_file", arguments='{"path": "a.txt"}'),
                    ProposedCall(
                        call_id="call_b", name="search", arguments='{"pattern":"TODO","path":"."}'
                    ),
                ),
            ),
            ToolResultMessage(call_id="call_a", name="read_file", content="hello"),
            ToolResultMessage(call_id="call_b", name="search", content="no match", is_error=True),
            UserMessage(text="Thanks, go on."),
        ),
        tools=(
            ToolSchema(name="read_file", description="Read a text file.", parameters=READ_SCHEMA),
            ToolSchema(name="search", description="Search files.", parameters=SEARCH_SCHEMA),
        ),
        max_output_tokens=max_output_tokens,
    )

"""A fault-injecting HTTP proxy on loopback in front of the tests' S3 server (moto).

Every request is forwarded to the server unless the test's ``rule`` picks a fault for it:

- ``"lie"``: answer ``200 OK`` (with an ETag) without forwarding: a store that acknowledges
  a write it did not keep;
- ``"deny"``: answer ``403 AccessDenied`` without forwarding: a store made read-only;
- ``"cut"``: forward, then send the status and headers (the full ``Content-Length``) and
  only half of the body before closing the connection: a read cut mid-way;
- ``"cut_close"``: the same without a ``Content-Length`` (the body ends where the
  connection does, so the client cannot tell it is short);
- ``"short"``: half of the body, whole by its (rewritten) ``Content-Length``: a
  middlebox that cut the body and its length.

``requests`` records what came through and which fault each got, so a test can tell that
its fault was really injected.
"""

from __future__ import annotations

import contextlib
import http.client
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import urlsplit

Fault = Literal["lie", "deny", "cut", "cut_close", "short"]


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    body: bytes
    fault: Fault | None


Rule = Callable[[str, str, bytes], Fault | None]

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}
_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied (the store is read-only)</Message></Error>"
)


class FaultProxy:
    """``endpoint`` is the proxy's URL; ``rule(method, path, body)`` picks a fault."""

    def __init__(self, upstream: str, rule: Rule) -> None:
        self.upstream = urlsplit(upstream)
        self.rule = rule
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def faults(self, fault: Fault) -> list[Seen]:
        with self._lock:
            return [seen for seen in self.requests if seen.fault == fault]

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        with self._lock:
            fault = self.rule(handler.command, handler.path, body)
            self.requests.append(Seen(handler.command, handler.path, body, fault))
        if fault == "lie":
            self._answer(handler, 200, [("ETag", '"0123456789abcdef0123456789abcdef"')], b"")
            return
        if fault == "deny":
            self._answer(handler, 403, [("Content-Type", "application/xml")], _DENIED)
            return
        upstream = http.client.HTTPConnection(
            self.upstream.hostname or "127.0.0.1", self.upstream.port, timeout=30
        )
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP}
            if body or handler.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            upstream.request(handler.command, handler.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            passed = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP]
            size = response.getheader("Content-Length") if handler.command == "HEAD" else None
        finally:
            upstream.close()
        if fault in ("cut", "cut_close", "short") and len(data) > 1:
            handler.send_response(response.status)
            for key, value in passed:
                handler.send_header(key, value)
            if fault != "cut_close":
                handler.send_header(
                    "Content-Length", str(len(data) // 2 if fault == "short" else len(data))
                )
            handler.end_headers()
            handler.wfile.write(data[: len(data) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            return
        if size is not None:
            passed.append(("Content-Length", size))
        self._answer(handler, response.status, passed, data, head=handler.command == "HEAD")

    @staticmethod
    def _answer(
        handler: BaseHTTPRequestHandler,
        status: int,
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        head: bool = False,
    ) -> None:
        handler.send_response(status)
        for key, value in headers:
            handler.send_header(key, value)
        if not head:
            handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if body and not head:
            handler.wfile.write(body)


@contextlib.contextmanager
def fault_proxy(upstream: str, rule: Rule) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream, rule)
    thread = threading.Thread(target=proxy._server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy._server.shutdown()
        proxy._server.server_close()
        thread.join(10)

"""A hostile MCP server over streamable HTTP for lodger's audit tests: raw JSON-RPC, no SDK.

    python hostile_http_server.py MODE [MODE ...]

It listens on a free loopback port and prints ``PORT <n>`` on stdout once it does. Every
``tools/call`` answers ``{"tool": NAME, "arguments": ARGS}`` as text, in a JSON body, except
for what a MODE changes:

- ``big-json=MB``: ``tools/call`` of ``big`` answers with MB megabytes of text in one
  ``application/json`` body;
- ``big-sse=MB``: the same answer as one server-sent event of an ``text/event-stream``;
- ``gzip-bomb=MB``: the same answer gzip-compressed (a few kilobytes on the wire), though
  the client may have asked for no compression;
- ``many-tools=N``: ``tools/list`` answers with N tools in one body.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = dict(arg.partition("=")[::2] for arg in sys.argv[1:])


def tools() -> list[dict[str, Any]]:
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    names = ["echo", "big", *(f"tool_{i}" for i in range(int(MODES.get("many-tools") or 0)))]
    return [{"name": n, "description": f"the {n} tool", "inputSchema": schema} for n in names]


def result(request: dict[str, Any]) -> dict[str, Any] | None:
    method = request.get("method")
    if method == "initialize":
        return {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "hostile-http", "version": "0"},
        }
    if method == "tools/list":
        return {"tools": tools()}
    if method == "tools/call":
        name = request["params"]["name"]
        if name == "big":
            megabytes = next(
                v for k, v in MODES.items() if k in ("big-json", "big-sse", "gzip-bomb")
            )
            size = int(float(megabytes) * 1e6)
            return {"content": [{"type": "text", "text": "x" * size}]}
        text = json.dumps({"tool": name, "arguments": request["params"].get("arguments")})
        return {"content": [{"type": "text", "text": text}]}
    if method == "ping":
        return {}
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # no stream of server-initiated messages
        self._send(405, b"", "text/plain")

    def do_DELETE(self) -> None:
        self._send(200, b"", "text/plain")

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "id" not in request or "method" not in request:
            self._send(202, b"", "text/plain")  # a notification or an answer
            return
        answer = result(request)
        if answer is None:
            error = {"code": -32601, "message": "method not found"}
            message = {"jsonrpc": "2.0", "id": request["id"], "error": error}
        else:
            message = {"jsonrpc": "2.0", "id": request["id"], "result": answer}
        body = json.dumps(message).encode()
        big = request.get("method") == "tools/call" and request["params"]["name"] == "big"
        if big and "big-sse" in MODES:
            self._send(200, b"event: message\ndata: " + body + b"\n\n", "text/event-stream")
        elif big and "gzip-bomb" in MODES:
            self._send(200, gzip.compress(body), "application/json", encoding="gzip")
        else:
            self._send(200, body, "application/json")

    def _send(self, status: int, body: bytes, kind: str, *, encoding: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        if encoding is not None:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)  # a client that stops reading: what a bounded one does


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up (a bounded one does): nothing to report


def main() -> None:
    server = Server(("127.0.0.1", 0), Handler)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

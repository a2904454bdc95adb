"""A real HTTP server on loopback (``http.server`` in a thread) that honours
``Idempotency-Key`` the way payment APIs do: the first request with a key runs (counted),
a later one with the same key gets the stored answer and runs nothing. Jobs model a
long-running remote call: ``POST /jobs`` accepts one and answers its id at once;
``GET /jobs/<id>`` says ``running`` until the test finishes it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Ledger:
    """What the server saw, counted outside lodger."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: list[str | None] = []  # every request's key, in order
        self.executed: list[str] = []  # effects that ran (once per key)
        self.stored: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, str | None] = {}  # job id -> result (None: running)
        self.unknown_jobs: set[str] = set()  # jobs the server cannot tell about
        self.polls: list[str] = []  # every GET of a job, in order
        #: a job finishes by itself at its n-th poll (None: only when the test says)
        self.finish_at: int | None = None


def _handler(ledger: Ledger) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length", "0"))
            request = json.loads(self.rfile.read(size) or b"{}")
            key = self.headers.get("Idempotency-Key")
            with ledger.lock:
                ledger.keys.append(key)
                if key is not None and key in ledger.stored:
                    self._answer(200, {**ledger.stored[key], "replayed": True})
                    return
                ledger.executed.append(f"{self.path}:{request}")
                if self.path == "/jobs":
                    job = f"job-{len(ledger.jobs) + 1}"
                    ledger.jobs[job] = None
                    answer: dict[str, Any] = {"job": job, "state": "accepted"}
                else:
                    answer = {"charged": request.get("amount"), "n": len(ledger.executed)}
                if key is not None:
                    ledger.stored[key] = answer
            self._answer(200, answer)

        def do_GET(self) -> None:
            job = self.path.rpartition("/")[2]
            with ledger.lock:
                ledger.polls.append(job)
                if job in ledger.unknown_jobs or job not in ledger.jobs:
                    self._answer(404, {"error": f"no job {job}"})
                    return
                if ledger.finish_at is not None and ledger.polls.count(job) >= ledger.finish_at:
                    ledger.jobs[job] = ledger.jobs[job] or f"{job} built"
                result = ledger.jobs[job]
            if result is None:
                self._answer(200, {"job": job, "state": "running"})
            else:
                self._answer(200, {"job": job, "state": "done", "result": result})

    return Handler


@contextmanager
def serve() -> Iterator[tuple[str, Ledger]]:
    """The server's base URL and its ledger, for the block's length."""
    ledger = Ledger()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(ledger))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", ledger
    finally:
        server.shutdown()
        server.server_close()
        thread.join()

"""Fuzz the API with schemathesis against its committed OpenAPI document
(``docs/openapi.json``, which ``test_openapi`` holds equal to the app's): every built-in
check schemathesis enables by default, so no 5xx, every status, content type, header and
body matching the document, schema-valid requests accepted, schema-invalid ones refused,
undeclared methods answered 405 with ``Allow``, and a request without the token refused.

Against a real host (uvicorn on loopback, over a SQLite store on disk) holding a real
session with a finished turn; half of the generated session ids are that session's, so
fork, decide, abandon, resume and messages meet a log, not only 404s. Bounded: the
examples, coverage and fuzzing phases, a few examples per operation. The streams are left
out (they follow forever, or a turn to its end, by design; ``test_streams`` and
``test_protocol_streams`` cover them).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from lodger.host import HostConfig, SqliteHostControl, create_app
from lodger.host.auth import new_token
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage

COMMITTED = Path(__file__).parents[2] / "docs" / "openapi.json"
#: the host's one real session; half the generated session ids are this one
SESSION = "fuzz-session"
TOKEN = new_token()

# built here, not discovered: a schemathesis.toml lying around changes nothing
CONFIG = SchemathesisConfig.from_dict(
    {
        "phases": {
            "examples": {"enabled": True},
            "coverage": {"enabled": True},
            "fuzzing": {"enabled": True},
            "stateful": {"enabled": False},
        },
        "generation": {"max-examples": 8},
        # a body over the route's size limit is refused before it is parsed: 413 is how
        # the host rejects an oversized invalid body (documented on every such route)
        "checks": {
            "negative_data_rejection": {
                "expected-statuses": [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]
            }
        },
        "dictionaries": {"sessions": {"values": [SESSION]}},
        "parameters": {"path.session_id": {"dictionary": "sessions", "probability": 0.5}},
    }
)
schema = schemathesis.openapi.from_path(COMMITTED, config=CONFIG).exclude(
    # streams that follow a turn until it ends (test_streams, test_protocol_streams)
    path=[
        "/v1/sessions/{session_id}/stream",
        "/v1/sessions/{session_id}/ai-sdk/stream",
        "/v1/sessions/{session_id}/ai-sdk/chat",
        "/v1/sessions/{session_id}/ag-ui",
    ]
)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state: Path = tmp_path_factory.mktemp("fuzz") / "state"
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    ready, stop = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    async def main() -> None:
        control = SqliteHostControl(state / "host.sqlite3")
        sessions = Sessions(Storage.local(state))
        await control.add_token(TOKEN, scope="admin", session_id=None, label="fuzz")
        app = create_app(sessions, control, HostConfig(models=("test",)), poll_s=0.2)
        server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="on"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():  # noqa: ASYNC110 - uvicorn has no event
            await asyncio.sleep(0.01)
        await _real_session(f"http://127.0.0.1:{port}")
        ready.set()
        await asyncio.to_thread(stop.wait)
        server.should_exit = True
        await task
        await sessions.close()
        await control.close()

    def run() -> None:
        try:
            asyncio.run(main())
        except Exception as exc:  # noqa: BLE001 - reported by the fixture's teardown
            failure.append(exc)
            ready.set()

    thread = threading.Thread(target=run, name="fuzz-host")
    thread.start()
    ready.wait(60)
    try:
        assert not failure, failure
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(30)
        sock.close()
    assert not failure, failure


async def _real_session(url: str) -> None:
    """``SESSION`` with one finished turn: a log the session routes act on."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(base_url=url, headers=auth, timeout=30) as client:
        made = await client.post("/v1/sessions", json={"session_id": SESSION, "message": "hi"})
        assert made.status_code == 201, made.text
        message = made.json()["message"]["id"]
        for _ in range(300):
            shown = await client.get(f"/v1/sessions/{SESSION}/messages/{message}")
            if shown.json()["status"] in ("done", "failed"):
                assert shown.json()["status"] == "done", shown.text
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the first turn of {SESSION} did not finish")


@pytest.mark.slow
@schema.parametrize()
@settings(suppress_health_check=list(HealthCheck), deadline=None)
def test_api_fuzz(case: schemathesis.Case, host: str) -> None:
    # The generated bearer token is replaced by the real one, but only where the case has
    # one: a negative case that drops the header must reach the host without it (and be
    # refused 401), or it would pass as a schema-violating request the host accepted.
    headers = case.headers or {}
    auth = {"Authorization": f"Bearer {TOKEN}"} if "Authorization" in headers else {}
    case.call_and_validate(base_url=host, headers=auth)

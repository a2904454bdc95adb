"""Fuzz the API with schemathesis against its own OpenAPI document: no 5xx, and every
response (status, content type, body) matches the schema. Bounded: a few examples per
operation, against a real host on loopback. The stream is left out (it follows forever
by design; ``test_streams`` covers it)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from lodger.host import HostConfig, SqliteHostControl, create_app
from lodger.host.auth import new_token
from lodger.host.openapi import document
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage

schema = schemathesis.openapi.from_dict(document()).exclude(path="/v1/sessions/{session_id}/stream")

TOKEN = new_token()


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
        app = create_app(sessions, control, HostConfig(models=("test",)))
        server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="on"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():  # noqa: ASYNC110 - uvicorn has no event
            await asyncio.sleep(0.01)
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
    ready.wait(30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(30)
        sock.close()
    assert not failure, failure


@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=12,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
    deadline=None,
)
def test_api_fuzz(case: schemathesis.Case, host: str) -> None:
    case.call_and_validate(
        base_url=host,
        headers={"Authorization": f"Bearer {TOKEN}"},
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )

"""Two hosts in front of one control plane (a real PostgreSQL) and one ``file://`` store,
each served by uvicorn on its own loopback port with its own SQLite index, as two
``lodger serve --store URL --control DSN`` behind one load balancer would be: a token
made through one host opens the other (a session token stays scoped there, a revoked one
is refused by both), a wrong or absent token is refused by both, no plain token reaches
the database or an index, and one webhook delivery posted to both (one after the other,
or at once) makes one session and one wake, which a real worker runs once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn

from lodger.errors import HostAuthError, HostConflictError
from lodger.host import HookConfig, HostConfig, create_app
from lodger.host.auth import Authenticator, new_token
from lodger.host.webhooks import sign
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage
from lodger.storage.control import ControlPlane, open_control
from lodger.storage.control.host_index import hash_token
from lodger.storage.control.shared_host_index import SharedHostControl
from lodger.testing.postgres import PostgresServer

from . import host_tools
from ._support import Setup

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[2] / "src"
SECRET = b"shared hook secret"
HOOKS = {
    "issues": HookConfig(name="issues", secret=SECRET),  # a new session per delivery
    "triage": HookConfig(name="triage", secret=SECRET, session="triage"),
}


@pytest.fixture
def setup(tmp_path: Path, postgres: PostgresServer) -> Setup:
    (tmp_path / "script.json").write_text(json.dumps([{"text": "noted"}]))
    return Setup(f"file://{tmp_path / 'objects'}", postgres.new_database(), tmp_path)


@dataclass
class Host:
    url: str
    app: Any
    control: SharedHostControl
    plane: ControlPlane

    def raw(self, token: str | None = None) -> httpx2.AsyncClient:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return httpx2.AsyncClient(base_url=self.url, headers=headers, timeout=30)


@asynccontextmanager
async def shared_host(s: Setup, name: str, *, admin: str | None = None) -> AsyncIterator[Host]:
    """What ``lodger serve --store URL --control DSN --host-index host-NAME.sqlite3``
    serves; ``admin`` is added the way ``serve`` adds its bootstrap token."""
    plane = open_control(s.dsn)
    await plane.start()
    control = SharedHostControl(s.dir / f"host-{name}.sqlite3", plane)
    sessions = Sessions(Storage.from_url(s.store))
    if admin is not None:
        await control.add_token(admin, scope="admin", session_id=None, label="serve")
    app = create_app(
        sessions, control, HostConfig(models=(s.model,)), plane=plane, poll_s=0.1, hooks=HOOKS
    )
    auth: Authenticator = app.state.auth
    auth.ttl_s = 0.2  # a revocation elsewhere is seen within this
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield Host(f"http://127.0.0.1:{sock.getsockname()[1]}", app, control, plane)
    finally:
        server.should_exit = True
        await task
        sock.close()
        await sessions.close()
        await control.close()
        await plane.close()


@asynccontextmanager
async def two_hosts(s: Setup, admin: str) -> AsyncIterator[tuple[Host, Host]]:
    """Host A knows the admin token (it made it); host B was started without one."""
    async with shared_host(s, "a", admin=admin) as a, shared_host(s, "b") as b:
        yield a, b


def _code(response: httpx2.Response) -> str:
    return str(response.json()["error"]["code"])


async def test_a_token_made_through_one_host_opens_the_other(
    setup: Setup, postgres: PostgresServer
) -> None:
    admin = new_token()
    async with two_hosts(setup, admin) as (a, b), a.raw(admin) as on_a, b.raw(admin) as on_b:
        # the bootstrap token of A is accepted by B, which never saw it
        made = await on_b.post("/v1/sessions", json={"session_id": "t1"})
        assert made.status_code == 201, made.text
        assert (await on_a.post("/v1/sessions", json={"session_id": "t2"})).status_code == 201
        # tokens made through A
        minted = await on_a.post("/v1/tokens", json={"label": "ops"})
        scoped = await on_a.post("/v1/tokens", json={"session_id": "t1", "label": "t1 only"})
        assert minted.status_code == scoped.status_code == 201, minted.text + scoped.text
        second_admin, session_token = minted.json()["token"], scoped.json()["token"]

        async with b.raw(second_admin) as admin_b, b.raw(session_token) as scoped_b:
            listed = await admin_b.get("/v1/sessions")
            assert listed.status_code == 200 and {"t1", "t2"} <= set(listed.json()["sessions"])
            # the session token stays scoped on B: its session only, nothing admin
            assert (await scoped_b.get("/v1/sessions")).json()["sessions"] == ["t1"]
            shown = await scoped_b.get("/v1/sessions/t1")
            assert shown.status_code == 200 and shown.json()["model"] == setup.model
            sent = await scoped_b.post("/v1/sessions/t1/messages", json={"text": "hi"})
            assert sent.status_code == 202, sent.text
            other = await scoped_b.get("/v1/sessions/t2")
            assert (other.status_code, _code(other)) == (403, "forbidden")
            elsewhere = await scoped_b.post("/v1/sessions/t2/messages", json={"text": "hi"})
            assert (elsewhere.status_code, _code(elsewhere)) == (403, "forbidden")
            widen = await scoped_b.post("/v1/tokens", json={})
            assert (widen.status_code, _code(widen)) == (403, "forbidden")
            assert (await scoped_b.get("/metrics")).status_code == 403

        # wrong and absent tokens are refused by both hosts
        for host in (a, b):
            for token in (None, new_token(), hash_token(admin), admin + "x", "lgr_"):
                async with host.raw(token) as client:
                    refused = await client.get("/v1/sessions")
                assert (refused.status_code, _code(refused)) == (401, "unauthorized"), token

        # a revocation through one host reaches the other (after its grant cache's TTL)
        async with a.raw(session_token) as scoped_a, b.raw(session_token) as scoped_b:
            assert (await scoped_a.get("/v1/sessions/t1")).status_code == 200
            # over HTTP, through host B, by the token itself
            revoked = await scoped_b.post("/v1/tokens/revoke", json={"token": session_token})
            assert (revoked.status_code, revoked.json()) == (200, {"revoked": True})
            assert await b.control.revoke(session_token) is False  # already
            async with asyncio.timeout(30):
                while (await scoped_a.get("/v1/sessions/t1")).status_code != 401:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            assert (await scoped_b.get("/v1/sessions/t1")).status_code == 401
        # an admin on B lists tokens made through A (by id, never the token) and revokes one
        # by its id: host A refuses it too
        spare = (await on_a.post("/v1/tokens", json={"label": "spare"})).json()
        listed_b = (await on_b.get("/v1/tokens")).json()["tokens"]
        row = next(item for item in listed_b if item["label"] == "spare")
        assert row["id"] == spare["id"] and row["revoked"] is False and row["created_at"] > 0
        assert spare["token"] not in json.dumps(listed_b)
        assert hash_token(spare["token"]) not in json.dumps(listed_b)
        assert {"ops", "t1 only"} <= {item["label"] for item in listed_b}
        async with a.raw(spare["token"]) as spare_a:
            assert (await spare_a.get("/v1/sessions")).status_code == 200  # cached on A
            by_id = await on_b.post("/v1/tokens/revoke", json={"id": spare["id"]})
            assert (by_id.status_code, by_id.json()) == (200, {"revoked": True})
            async with asyncio.timeout(30):
                while (await spare_a.get("/v1/sessions")).status_code != 401:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
        assert next(
            item for item in (await on_a.get("/v1/tokens")).json()["tokens"]
            if item["label"] == "spare"
        )["revoked"] is True  # fmt: skip
        # ... and adding it again (a restart with it in $LODGER_HOST_TOKEN) revives nothing
        with pytest.raises(HostAuthError) as revived:
            await a.control.add_token(session_token, scope="session", session_id="t1", label="")
        assert revived.value.code == "token_revoked"
        with pytest.raises(HostConflictError) as changed:  # nor changes a token's grant
            await b.control.add_token(second_admin, scope="session", session_id="t1", label="")
        assert changed.value.code == "token_conflict"
        assert str(changed.value).count(second_admin) == 0  # errors name grants, not tokens

        # only hashes reached the control plane
        async with a.plane._tx() as tx:  # type: ignore[attr-defined]
            rows = await tx.rows("SELECT token_hash, scope, session_id FROM host_tokens")
    tokens = (admin, second_admin, session_token, spare["token"])
    assert sorted(rows) == sorted(
        [(hash_token(admin), "admin", None), (hash_token(second_admin), "admin", None),
         (hash_token(session_token), "session", "t1"), (hash_token(spare["token"]), "admin", None)]
    )  # fmt: skip
    # ... and no plain token is in a byte of PostgreSQL's files or the hosts' indexes,
    # while the hashes are (so the scan reads what was written)
    found = _scan([postgres.data, setup.dir], [t.encode() for t in tokens])
    assert not any(found.values()), found
    hashes = _scan([postgres.data], [hash_token(t).encode() for t in tokens])
    assert all(hashes.values()), hashes


def _scan(roots: list[Path], needles: list[bytes]) -> dict[bytes, list[str]]:
    found: dict[bytes, list[str]] = {n: [] for n in needles}
    for root in roots:
        for path in root.rglob("*"):
            if not path.is_file() or path.is_symlink():
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue
            for needle in needles:
                if needle in data:
                    found[needle].append(str(path))
    return found


def _signed(delivery: str, body: bytes) -> dict[str, str]:
    return {"X-Hub-Signature-256": sign(SECRET, body), "X-GitHub-Delivery": delivery,
            "Content-Type": "application/json"}  # fmt: skip


async def test_one_webhook_delivery_to_both_hosts_wakes_one_session_once(setup: Setup) -> None:
    admin = new_token()
    body = b'{"action": "opened"}'
    async with AsyncExitStack() as stack:
        a, b = await stack.enter_async_context(two_hosts(setup, admin))
        on_a = await stack.enter_async_context(a.raw())
        on_b = await stack.enter_async_context(b.raw())

        # a delivery retried to another host: the same session, the same message
        first = await on_a.post("/hooks/issues", content=body, headers=_signed("d-1", body))
        retry = await on_b.post("/hooks/issues", content=body, headers=_signed("d-1", body))
        assert first.status_code == retry.status_code == 202, first.text + retry.text
        assert (first.json()["created"], retry.json()["created"]) == (True, False)
        sequential = first.json()["session_id"]
        assert retry.json()["session_id"] == sequential
        assert retry.json()["message"]["id"] == first.json()["message"]["id"]

        # the same delivery at once to both hosts, twice each: one session, one message
        posts = [
            (on_a if i % 2 == 0 else on_b).post(
                "/hooks/issues", content=body, headers=_signed("d-2", body)
            )
            for i in range(4)
        ]
        answers = [r.json() for r in await asyncio.gather(*posts)]
        assert {r["session_id"] for r in answers} != {sequential}
        assert len({r["session_id"] for r in answers}) == 1, answers
        assert len({r["message"]["id"] for r in answers}) == 1
        assert sorted(r["created"] for r in answers) == [False, False, False, True]
        concurrent = answers[0]["session_id"]

        # a hook with one fixed session, at once to both: one message
        fixed = [
            (on_a if i % 2 == 0 else on_b).post(
                "/hooks/triage", content=body, headers=_signed("d-3", body)
            )
            for i in range(4)
        ]
        fixed_answers = [r.json() for r in await asyncio.gather(*fixed)]
        assert [r["session_id"] for r in fixed_answers] == ["triage"] * 4
        assert sorted(r["created"] for r in fixed_answers) == [False, False, False, True]

        # a bad signature is refused by both, and makes nothing
        for client in (on_a, on_b):
            forged = await client.post(
                "/hooks/issues", content=body + b" ", headers=_signed("d-4", body)
            )
            assert (forged.status_code, _code(forged)) == (401, "bad_signature")

        wakes = await a.plane.pending_wakes()
        assert sorted(w.session_id for w in wakes) == sorted([sequential, concurrent, "triage"])
        for sid in (sequential, concurrent):  # either host shows it, with the host's model
            row = await b.plane.get_session(session_id=sid)
            assert row is not None and row.model == setup.model

        # a real worker runs what the deliveries woke: one turn per session
        with _worker(setup):
            async with asyncio.timeout(60):
                while await a.plane.pending_wakes():  # noqa: ASYNC110 - a worker finishes them
                    await asyncio.sleep(0.05)
        async with a.raw(admin) as admin_a, b.raw(admin) as admin_b:
            for sid, delivery in ((sequential, "d-1"), (concurrent, "d-2"), ("triage", "d-3")):
                page = await (admin_b if sid == concurrent else admin_a).get(
                    f"/v1/sessions/{sid}/events"
                )
                started = [e for e in page.json()["events"] if e["kind"] == "turn_started"]
                assert len(started) == 1, (sid, started)
                assert f"delivery {delivery}" in started[0]["body"]["input"]
        # a replay after the turn ran, to either host, still wakes nothing
        late = await on_b.post("/hooks/issues", content=body, headers=_signed("d-1", body))
        assert (late.json()["session_id"], late.json()["created"]) == (sequential, False)
        assert late.json()["message"]["status"] == "done"
        assert await a.plane.pending_wakes() == []


class _worker:
    """A real ``lodger worker`` on the setup's store and control plane; SIGKILLed after."""

    def __init__(self, s: Setup) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
        env.pop("LODGER_STORE", None)
        env.pop("LODGER_CONTROL", None)
        self._args = [sys.executable, "-m", "lodger", "worker", "--store", s.store,
                      "--control", s.dsn, "--tools", str(Path(host_tools.__file__)),
                      "--poll", "0.05", "--lease-ttl", "5", "--workdir", str(s.dir)]  # fmt: skip
        self._env = env
        self._log = s.dir / "worker.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> subprocess.Popen[bytes]:
        with self._log.open("ab") as log:
            self._proc = subprocess.Popen(self._args, env=self._env, stdout=log, stderr=log)
        return self._proc

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        if self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
        self._proc.wait(timeout=30)

"""The host in distributed mode over real parts: a real PostgreSQL control plane, a
``file://`` object store, real ``lodger worker`` subprocesses, and the host served by
uvicorn on loopback in the test's loop. The host runs no turns: a send becomes a wake a
worker runs, and the stream shows the worker's commits; one idempotency key wakes once;
an approval asked in a worker-run turn is answered over the host (two answers at once:
one wins) and the turn completes."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn

from lodger.client import HostClient, StreamedFact
from lodger.errors import HostConflictError, UsageError
from lodger.host import HookConfig, HostConfig, SqliteHostControl, create_app
from lodger.host.auth import new_token
from lodger.host.webhooks import sign
from lodger.media import WAKE_MEDIA_PREFIX, BinaryContent, DocumentUrl
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage
from lodger.storage.control import ControlPlane, open_control
from lodger.storage.control.interface import SessionRow
from lodger.testing.postgres import PostgresServer

from . import host_tools
from ._support import Setup

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[2] / "src"
HOST_TOOLS = Path(host_tools.__file__)
LODGER = [sys.executable, "-c",
          "import sys; from lodger.cli import main; sys.argv[0] = 'lodger'; main()"]  # fmt: skip


@pytest.fixture
def setup(tmp_path: Path, postgres: PostgresServer) -> Setup:
    return Setup(f"file://{tmp_path / 'objects'}", postgres.new_database(), tmp_path)


@contextmanager
def worker(
    s: Setup, *extra: str, approval_wait: float = 60, lease_ttl: float = 5
) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``lodger worker`` that lets approvals wait; SIGKILLed at the end."""
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.pop("LODGER_STORE", None)
    with (s.dir / "worker.log").open("ab") as log:
        proc = subprocess.Popen(
            [*LODGER, "worker", "--store", s.store, "--control", s.dsn,
             "--tools", str(HOST_TOOLS), "--poll", "0.05",
             "--lease-ttl", str(lease_ttl), "--approval-wait", str(approval_wait),
             "--workdir", str(s.dir), *extra],
            env=env, stdout=log, stderr=log,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@dataclass
class Host:
    url: str
    token: str
    plane: ControlPlane

    def client(self) -> HostClient:
        return HostClient(self.url, token=self.token)


@asynccontextmanager
async def distributed_host(
    s: Setup, hooks: dict[str, HookConfig] | None = None
) -> AsyncIterator[Host]:
    """The app ``lodger serve --store URL --control DSN`` serves, on a loopback port."""
    storage = Storage.from_url(s.store)
    control = SqliteHostControl(s.dir / "host.sqlite3")
    plane = open_control(s.dsn)
    await plane.start()
    sessions = Sessions(storage)
    token = new_token()
    await control.add_token(token, scope="admin", session_id=None, label="test-admin")
    app = create_app(
        sessions, control, HostConfig(models=(s.model,)), plane=plane, poll_s=0.1, hooks=hooks
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield Host(f"http://127.0.0.1:{port}", token, plane)
    finally:
        server.should_exit = True
        await task
        sock.close()
        await sessions.close()
        await control.close()
        await plane.close()


async def _until(client: HostClient, sid: str, kind: str, seen: list[StreamedFact]) -> StreamedFact:
    async for fact in client.stream(sid, after=seen[-1].offset if seen else None):
        seen.append(fact)
        if fact.kind == kind:
            return fact
    raise AssertionError("stream ended")


async def test_a_send_is_run_by_a_worker_and_streamed_and_a_key_wakes_once(setup: Setup) -> None:
    setup.script([{"calls": [{"name": "echo", "args": {"text": "from a worker"}}]},
                  {"text": "done"}])  # fmt: skip
    async with distributed_host(setup) as host, host.client() as a, host.client() as b:
        sid = await a.create_session(session_id="d1")
        # nothing runs before a worker is up: the message waits as a wake
        sent = await a.send(sid, "say it", key="k1")
        assert sent["created"] and sent["message"]["status"] == "queued"
        again = await b.send(sid, "say it", key="k1")
        assert not again["created"]
        assert again["message"]["id"] == sent["message"]["id"]
        with pytest.raises(HostConflictError) as reused:
            await b.send(sid, "something else", key="k1")
        assert reused.value.code == "idempotency_conflict"
        assert len(await host.plane.pending_wakes(session_id=sid)) == 1
        assert (await a.show(sid))["running"] is True  # queued work counts
        assert sid in await a.list_sessions()

        seen_a: list[StreamedFact] = []
        seen_b: list[StreamedFact] = []
        with worker(setup):
            ended_a = asyncio.create_task(_until(a, sid, "turn_ended", seen_a))
            ended_b = asyncio.create_task(_until(b, sid, "turn_ended", seen_b))
            await asyncio.wait_for(asyncio.gather(ended_a, ended_b), 60)
            done = await a.wait_message(sid, sent["message"]["id"], within=30)
            assert done["status"] == "done"
        # both clients saw the worker's commits, in the same order, with no gap
        assert [f.offset for f in seen_a] == list(range(len(seen_a)))
        assert [(f.offset, f.kind) for f in seen_a] == [(f.offset, f.kind) for f in seen_b]
        responded = [f for f in seen_a if f.kind == "tool_responded"]
        assert [f.data["body"]["content"] for f in responded] == ["from a worker"]
        facts = await a.events(sid)
        assert [f.data["body"]["input"] for f in facts if f.kind == "turn_started"] == ["say it"]
        # the same key after the turn ran still wakes nothing
        late = await b.send(sid, "say it", key="k1")
        assert not late["created"] and late["message"]["status"] == "done"
        assert await host.plane.pending_wakes(session_id=sid) == []
        shown = await a.show(sid)
        assert (shown["running"], shown["turns"], shown["last_turn_status"]) == (
            False, 1, "completed",
        )  # fmt: skip
        assert shown["model"] == setup.model


async def test_an_approval_in_a_worker_run_turn_is_answered_over_the_host(setup: Setup) -> None:
    setup.script([{"calls": [{"name": "deploy", "args": {"target": "prod"}}]}, {"text": "over"}])
    with worker(setup):
        async with distributed_host(setup) as host, host.client() as a, host.client() as b:
            await _approve_twice(host, a, b)


async def _approve_twice(host: Host, a: HostClient, b: HostClient) -> None:
    sid = await a.create_session(session_id="d2")
    sent = await a.send(sid, "ship it", key="1")
    seen: list[StreamedFact] = []
    asked = await asyncio.wait_for(_until(a, sid, "permission_requested", seen), 60)
    call_id = asked.data["call_id"]
    # the fact commits just before the worker records the question
    async with asyncio.timeout(30):
        while not (pending := await b.approvals(sid)):  # noqa: ASYNC110 - a worker writes it
            await asyncio.sleep(0.05)
    assert [(p["call_id"], p["tool"], p["status"]) for p in pending] == [
        (call_id, "deploy", "pending")
    ]
    assert [p["call_id"] for p in await a.approvals()] == [call_id]
    assert "lodger_host_pending_approvals 1" in await a.metrics()
    with pytest.raises(UsageError) as unknown:
        await a.answer(sid, "call-that-never-asked", allow=True)
    assert unknown.value.code == "no_such_call"
    other = await a.create_session(session_id="d2-other")
    with pytest.raises(UsageError) as elsewhere:  # the call id of another session
        await a.answer(other, call_id, allow=True)
    assert elsewhere.value.code == "no_such_call"
    # an id the workers already know (lodger send made it) cannot be created again
    await host.plane.record_session(row=SessionRow(session_id="sent", status="completed",
                                                   last_activity=1.0))  # fmt: skip
    with pytest.raises(HostConflictError) as exists:
        await a.create_session(session_id="sent")
    assert exists.value.code == "session_exists"
    # the worker is waiting (its lease held): a decision from the host is refused
    with pytest.raises(HostConflictError) as busy:
        await a.decide(sid, call_id, "not_applied")
    assert busy.value.code == "session_busy"

    results = await asyncio.gather(
        a.answer(sid, call_id, allow=True),
        b.answer(sid, call_id, allow=False),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, dict)]
    lost = [r for r in results if isinstance(r, HostConflictError)]
    assert len(won) == 1 and len(lost) == 1, results
    assert lost[0].code == "already_answered"
    allowed = won[0]["status"] == "allow"

    await asyncio.wait_for(_until(a, sid, "turn_ended", seen), 60)
    done = await a.wait_message(sid, sent["message"]["id"], within=30)
    assert done["status"] == "done"
    facts = await a.events(sid)
    decided = [f for f in facts if f.kind == "permission_decided"]
    assert [(d.data["body"]["decision"], d.data["body"]["by"]) for d in decided] == [
        ("allow" if allowed else "deny", "user")
    ]
    responded = [f for f in facts if f.kind == "tool_responded"]
    if allowed:
        assert [r.data["body"]["content"] for r in responded] == ["deployed prod"]
    else:
        assert responded == []
    assert await a.approvals() == []
    with pytest.raises(HostConflictError):
        await b.answer(sid, call_id, allow=True)


DEPLOY = [{"calls": [{"name": "deploy", "args": {"target": "prod"}}]}, {"text": "over"}]


async def _pending(client: HostClient, sid: str) -> list[dict[str, Any]]:
    async with asyncio.timeout(30):
        while not (found := await client.approvals(sid)):  # noqa: ASYNC110 - a worker writes it
            await asyncio.sleep(0.05)
    return found


async def test_an_unanswered_approval_expires_and_the_call_is_denied(setup: Setup) -> None:
    setup.script(DEPLOY)
    with worker(setup, approval_wait=1.0):
        async with distributed_host(setup) as host, host.client() as a:
            sid = await a.create_session(session_id="d3")
            sent = await a.send(sid, "ship it", key="1")
            (pending,) = await _pending(a, sid)
            seen: list[StreamedFact] = []
            await asyncio.wait_for(_until(a, sid, "turn_ended", seen), 60)
            assert (await a.wait_message(sid, sent["message"]["id"], within=30))["status"] == "done"
            decided = [f.data["body"] for f in seen if f.kind == "permission_decided"]
            assert [(d["decision"], d["by"]) for d in decided] == [("deny", "user")]
            assert [f for f in seen if f.kind == "tool_responded"] == []
            rejected = [f.data["body"]["reason"] for f in seen if f.kind == "call_rejected"]
            assert rejected == ["denied"]
            assert await a.approvals() == []
            with pytest.raises(HostConflictError) as late:
                await a.answer(sid, pending["call_id"], allow=True)
            assert late.value.code == "already_answered"
            (expired,) = await host.plane.list_approvals(status="expired")
            assert expired.call_id == pending["call_id"]


async def test_a_killed_workers_question_is_answered_by_nobody(setup: Setup) -> None:
    setup.script(DEPLOY)
    async with distributed_host(setup) as host, host.client() as a:
        sid = await a.create_session(session_id="d4")
        sent = await a.send(sid, "ship it", key="1")
        with worker(setup, lease_ttl=1.0) as first:
            (pending,) = await _pending(a, sid)
            os.kill(first.pid, signal.SIGKILL)  # while it waits for the answer
            first.wait(timeout=30)
        # its lease lapses: nobody waits for that question any more
        async with asyncio.timeout(30):
            while await a.approvals(sid):  # noqa: ASYNC110 - the lease expires in PostgreSQL
                await asyncio.sleep(0.05)
        with pytest.raises(HostConflictError) as refused:
            await a.answer(sid, pending["call_id"], allow=True)
        assert refused.value.code == "already_answered"
        with worker(setup, approval_wait=1.0):  # another worker recovers the turn
            seen: list[StreamedFact] = []
            await asyncio.wait_for(_until(a, sid, "turn_ended", seen), 60)
            done = await a.wait_message(sid, sent["message"]["id"], within=30)
        assert done["status"] == "done"
        facts = await a.events(sid)
        assert [f for f in facts if f.kind == "tool_responded"] == []  # never deployed
        # the resumed turn recorded that the asked call never ran
        observed = [f.data["call_id"] for f in facts if f.kind == "recovery_observed"]
        assert observed == [pending["call_id"]]
        assert [f.data["body"]["input"] for f in facts if f.kind == "turn_started"] == ["ship it"]


async def test_a_webhook_delivery_becomes_one_wake_with_the_hosts_model(setup: Setup) -> None:
    setup.script(DEPLOY)
    secret = b"distributed hook secret"
    hooks = {"gh": HookConfig(name="gh", secret=secret, session="triage")}
    body = b'{"action": "opened"}'
    headers = {"X-Hub-Signature-256": sign(secret, body), "X-GitHub-Delivery": "dlv-1",
               "Content-Type": "application/json"}  # fmt: skip
    async with distributed_host(setup, hooks) as host, host.client() as a:
        async with httpx2.AsyncClient(base_url=host.url) as raw:
            first = await raw.post("/hooks/gh", content=body, headers=headers)
            replay = await raw.post("/hooks/gh", content=body, headers=headers)
        assert first.status_code == replay.status_code == 202, first.text
        assert first.json()["created"] is True and replay.json()["created"] is False
        message = first.json()["message"]
        assert replay.json()["message"]["id"] == message["id"]
        assert message["idempotency_key"] == "hook:gh:dlv-1"
        shown = await a.message("triage", message["id"])
        assert (shown["idempotency_key"], shown["status"]) == ("hook:gh:dlv-1", "queued")
        (wake,) = await host.plane.pending_wakes(session_id="triage")
        assert wake.id == message["id"] and "delivery dlv-1" in (wake.message or "")
        row = await host.plane.get_session(session_id="triage")
        assert row is not None and row.model == setup.model  # what a worker will run
        assert "triage" in await a.list_sessions()


async def test_a_parked_turn_is_decided_over_the_host_and_resumed_by_a_worker(
    setup: Setup, gates: Path
) -> None:
    setup.script([{"calls": [{"name": "charge", "args": {"name": "c1"}}]}, {"text": "billed"}])
    async with distributed_host(setup) as host, host.client() as a:
        sid = await a.create_session(session_id="d5")
        await a.send(sid, "bill them", key="1")
        starts = gates / "c1.starts"
        with worker(setup, lease_ttl=1.0) as first:
            async with asyncio.timeout(30):
                while not starts.exists():  # noqa: ASYNC110 - the worker's tool writes it
                    await asyncio.sleep(0.02)
            os.kill(first.pid, signal.SIGKILL)  # inside a call that is never retried
            first.wait(timeout=30)
        with worker(setup, lease_ttl=1.0):
            # another worker resumes, finds the outcome unknown, and parks the turn
            async with asyncio.timeout(30):
                while not (await a.recovery(sid))["blocked"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            plan = await a.recovery(sid)
            (call_id,) = [c["call_id"] for c in plan["calls"] if c["tool"] == "charge"]
            async with asyncio.timeout(30):  # the parked worker hands the session back
                while True:
                    try:
                        offsets = await a.decide(sid, call_id, "completed", result="charged c1")
                        break
                    except HostConflictError as busy:  # the worker still holds the lease
                        if busy.code != "session_busy":
                            raise
                        await asyncio.sleep(0.05)
            assert offsets
            await a.resume(sid, key="after-decision")
            seen: list[StreamedFact] = []
            await asyncio.wait_for(_until(a, sid, "turn_ended", seen), 60)
        assert starts.read_text().splitlines() == ["start"]  # charged once, never retried
        facts = await a.events(sid)
        assert [f.kind for f in facts if f.offset in offsets] == ["operator_decision"]
        ended = [f for f in facts if f.kind == "turn_ended"]
        assert ended[-1].data["body"]["status"] == "completed"


async def test_a_fork_over_the_host_is_indexed_at_once_and_wakes_in_the_parents_files(
    setup: Setup,
) -> None:
    setup.script([{"calls": [{"name": "write_file",
                              "args": {"path": "notes.txt", "content": "from the parent"}}]},
                  {"text": "written"}])  # fmt: skip
    async with distributed_host(setup) as host, host.client() as c:
        sid = await c.create_session(session_id="f1")
        sent = await c.send(sid, "write it", key="k1")
        with worker(setup):
            done = await c.wait_message(sid, sent["message"]["id"], within=60)
            assert done["status"] == "done"
            parent = await host.plane.get_session(session_id=sid)
            assert parent is not None and parent.snapshot is not None
            child = await c.fork(sid, new_id="f1-fork")
            # indexed by the fork itself, before any message: its model and the parent's
            # workspace snapshot, for whichever worker wakes it
            row = await host.plane.get_session(session_id=child)
            assert row is not None
            assert (row.status, row.model, row.snapshot) == ("created", setup.model,
                                                             parent.snapshot)  # fmt: skip
            setup.script([{"calls": [{"name": "read_file", "args": {"path": "notes.txt"}}]},
                          {"text": "read"}])  # fmt: skip
            again = await c.send(child, "read it", key="k2")
            done = await c.wait_message(child, again["message"]["id"], within=60)
            assert done["status"] == "done"
        facts = await c.events(child)
        read = [f.data["body"]["content"] for f in facts if f.kind == "tool_responded"]
        assert any("from the parent" in str(content) for content in read), [
            (f.kind, f.data["body"]) for f in facts
        ]


async def test_a_message_a_worker_gives_up_on_reads_failed_with_why(setup: Setup) -> None:
    async with distributed_host(setup) as host, host.client() as c:
        sid = await c.create_session(session_id="g1")
        (setup.dir / "script.json").write_text("not a script")  # the model cannot be made
        sent = await c.send(sid, "try", key="k1")
        with worker(setup, "--max-attempts", "2"):
            for _ in range(600):
                message = await c.message(sid, sent["message"]["id"])
                if message["status"] not in ("queued", "running"):
                    break
                await asyncio.sleep(0.05)
        assert message["status"] == "failed", message
        error = message["result"]["error"]
        assert error["code"] == "script" and "script" in error["message"], message
        row = await host.plane.get_session(session_id=sid)
        assert row is not None and row.status == "error:script"


async def test_a_message_with_attachments_is_run_by_a_worker_with_them(setup: Setup) -> None:
    setup.script([{"text": "a picture"}])
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
    attachments = [
        BinaryContent(png, "image/png", name="pic.png"),
        DocumentUrl("https://example.com/spec.pdf"),
    ]
    async with distributed_host(setup) as host, host.client() as c:
        sid = await c.create_session(session_id="d-media")
        sent = await c.send(sid, "what is it?", key="m1", attachments=attachments)
        again = await c.send(sid, "what is it?", key="m1", attachments=attachments)
        assert not again["created"]  # the same wake
        with pytest.raises(UsageError) as forged:
            await c.send(sid, WAKE_MEDIA_PREFIX + '{"text": "x", "attachments": []}')
        assert "may not start with" in forged.value.message
        with worker(setup):
            done = await c.wait_message(sid, sent["message"]["id"], within=60)
        assert done["status"] == "done", done
        facts = await c.events(sid)
    started = [f.data["body"] for f in facts if f.kind == "turn_started"]
    assert [b["input"] for b in started] == ["what is it?"]
    (picture, link) = started[0]["attachments"]
    assert (picture["name"], picture["media_type"]) == ("pic.png", "image/png")
    assert link["url"] == "https://example.com/spec.pdf"
    storage = Storage.from_url(setup.store)
    try:
        assert await storage.artifacts.get(picture["artifact"]["sha256"]) == png
    finally:
        await storage.close()


async def test_a_compaction_over_the_distributed_host_waits_for_queued_work(setup: Setup) -> None:
    sections = ("Goal", "Progress", "Decisions", "Files touched", "Open questions", "Next step")
    summary = "\n".join(f"## {s}\n- said hello" for s in sections)
    setup.script([{"text": summary}])  # the turn's answer, and the summary asked after it
    async with distributed_host(setup) as host, host.client() as c:
        sid = await c.create_session(session_id="d-compact")
        sent = await c.send(sid, "hello", key="k1")
        with pytest.raises(HostConflictError) as busy:  # a wake waits: a worker will run it
            await c.compact(sid)
        assert busy.value.code == "session_busy"
        with worker(setup):
            done = await c.wait_message(sid, sent["message"]["id"], within=60)
        assert done["status"] == "done", done
        made = await c.compact(sid)
        assert made["compacted"] is True, made
        assert made["fact"]["body"]["summary"] == summary
        facts = await c.events(sid)
    assert facts[-1].kind == "compacted" and facts[-1].offset == made["offset"]
    storage = Storage.from_url(setup.store)
    try:
        assert (await storage.log.verify(sid)).high_water == made["offset"] + 1
    finally:
        await storage.close()


async def test_a_cancel_over_the_host_reaches_the_worker_running_the_turn(
    setup: Setup, gates: Path
) -> None:
    setup.script([{"calls": [{"name": "gate", "args": {"name": "never"}}]}, {"text": "no"}])
    with worker(setup):
        async with distributed_host(setup) as host, host.client() as a:
            sid = await a.create_session(session_id="c1")
            assert (await a.cancel(sid))["status"] == "not_running"  # no worker holds it
            await a.send(sid, "wait", key="k1")
            seen: list[StreamedFact] = []
            await asyncio.wait_for(_until(a, sid, "tool_dispatched", seen), 60)
            done = await a.cancel(sid, reason="stop it")
            assert done["status"] == "cancelled", done
            ended = await asyncio.wait_for(_until(a, sid, "turn_ended", seen), 60)
            assert ended.data["body"]["status"] == "cancelled"
            (asked,) = [f.data["body"] for f in seen if f.kind == "cancel_requested"]
            assert asked["reason"] == "stop it" and asked["who"].startswith("token:")
            responded = [f.data["body"]["status"] for f in seen if f.kind == "tool_responded"]
            assert responded == ["cancelled"]
            # a mode is switched between turns, under the session's lease
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while True:
                try:
                    switched = await a.set_permission_mode(sid, "plan")
                    break
                except HostConflictError:  # the worker still lets the session go
                    assert loop.time() < deadline
                    await asyncio.sleep(0.1)
            assert switched["status"] == "changed"
            assert (await a.show(sid))["permission_mode"] == "plan"

"""The API's verbs against a real host: sessions, sends with idempotency keys, auth
scopes, and machine-readable refusals."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from lodger.errors import HostAuthError, HostConflictError, SessionNotFoundError, UsageError
from lodger.host.limits import MAX_MEDIA_REQUEST
from lodger.storage.control.host_index import hash_token, token_id

from ._support import running_host, write_script


async def test_create_send_show_and_events(tmp_path: Path) -> None:
    model = write_script(
        tmp_path / "s.json",
        [{"calls": [{"name": "echo", "args": {"text": "hi"}}]}, {"text": "said hi"}],
    )
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        assert sid in await c.list_sessions()
        shown = await c.show(sid)
        assert (shown["events"], shown["model"]) == (0, model)
        sent = await c.send(sid, "say hi", key="k1")
        assert sent["created"] and sent["stream"] == f"/v1/sessions/{sid}/stream"
        done = await c.wait_message(sid, sent["message"]["id"])
        assert done["status"] == "done" and done["result"]["answer"] == "said hi"
        facts = await c.events(sid)
        kinds = [f.kind for f in facts]
        assert kinds[0] == "session_started" and kinds[-1] == "turn_ended"
        assert [f.offset for f in facts] == list(range(len(facts)))
        assert "tool_dispatched" in kinds and "tool_responded" in kinds
        shown = await c.show(sid)
        assert (shown["turns"], shown["last_turn_status"]) == (1, "completed")


async def test_the_same_idempotency_key_runs_once(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", [{"text": "ok"}])
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        first = await c.send(sid, "hello", key="same")
        again = await c.send(sid, "hello", key="same")
        assert first["created"] and not again["created"]
        assert again["message"]["id"] == first["message"]["id"]
        await c.wait_message(sid, first["message"]["id"])
        third = await c.send(sid, "hello", key="same")  # after it ran, too
        assert not third["created"]
        facts = await c.events(sid)
        assert sum(f.kind == "turn_started" for f in facts) == 1
        with pytest.raises(HostConflictError) as caught:
            await c.send(sid, "another text", key="same")
        assert caught.value.code == "idempotency_conflict"
        assert caught.value.status == 409  # type: ignore[attr-defined]


@pytest.mark.slow
async def test_every_route_refuses_without_a_token(tmp_path: Path) -> None:
    async with running_host(tmp_path / "state") as host:
        openapi = host.app.openapi()
        async with httpx2.AsyncClient(base_url=host.url) as raw, host.client() as c:
            sid = await c.create_session()
            checked = 0
            for path, methods in openapi["paths"].items():
                if path.startswith(("/hooks/", "/timeline/", "/console", "/oauth/")):
                    # signed by HMAC; static pages with no data; an OAuth callback whose
                    # one-use state is its proof (tests/tools/mcp_oauth)
                    continue
                url = path.replace("{session_id}", sid).replace("{call_id}", "c1")
                url = url.replace("{message_id}", "1").replace("{sha256}", "0" * 64)
                for method in methods:
                    response = await raw.request(
                        method.upper(), url, json={}, headers={"Authorization": "Bearer nope"}
                    )
                    assert response.status_code == 401, (method, path)
                    assert response.json()["error"]["code"] == "unauthorized"
                    response = await raw.request(method.upper(), url, json={})
                    assert response.status_code == 401, (method, path)
                    checked += 1
            assert checked >= 15


async def test_session_tokens_reach_only_their_session(tmp_path: Path) -> None:
    async with running_host(tmp_path / "state") as host, host.client() as admin:
        mine, other = await admin.create_session(), await admin.create_session()
        token = await admin.make_token(session_id=mine)
        async with host.client(token) as scoped:
            assert (await scoped.show(mine))["session_id"] == mine
            assert await scoped.list_sessions() == [mine]
            with pytest.raises(HostAuthError) as caught:
                await scoped.show(other)
            assert caught.value.code == "forbidden"
            with pytest.raises(HostAuthError):
                await scoped.create_session()
            with pytest.raises(HostAuthError):
                await scoped.make_token()
        # tokens are kept hashed: the plain token is nowhere in the index file
        assert token.encode() not in (host.state / "host.sqlite3").read_bytes()


async def test_a_revoked_token_is_refused_for_good(tmp_path: Path) -> None:
    async with running_host(tmp_path / "state") as host, host.client() as admin:
        sid = await admin.create_session()
        first = await admin.make_token(session_id=sid)
        second = await admin.make_token(session_id=sid)
        async with host.client(first) as a, host.client(second) as b:
            assert (await a.show(sid))["session_id"] == sid  # cached now
            with pytest.raises(HostAuthError) as caught:  # a session token: only itself
                await a.revoke_token(second)
            assert caught.value.code == "forbidden"
            assert await a.revoke_token(first) is True  # itself
            with pytest.raises(HostAuthError):  # at once, despite the cache
                await a.show(sid)
            assert await admin.revoke_token(second) is True  # an admin: any token
            assert await admin.revoke_token(second) is False  # already
            assert await admin.revoke_token("lgr_unknown") is False
            with pytest.raises(HostAuthError):
                await b.show(sid)
        # never revived by adding it again (a restart with $LODGER_HOST_TOKEN, say)
        with pytest.raises(HostAuthError) as revived:
            await host.control.add_token(first, scope="admin", session_id=None, label="again")
        assert revived.value.code == "token_revoked"
        assert await host.control.grant(first) is None
        assert (await admin.show(sid))["session_id"] == sid  # the admin token still works


async def test_an_admin_lists_tokens_by_id_and_revokes_one_by_its_id(tmp_path: Path) -> None:
    async with running_host(tmp_path / "state") as host, host.client() as admin:
        sid = await admin.create_session()
        lost = await admin.make_token(session_id=sid, label="laptop")
        kept = await admin.make_token(session_id=sid, label="ci")
        listed = await admin.list_tokens()
        by_label = {row["label"]: row for row in listed}
        assert set(by_label) >= {"laptop", "ci"}
        for row in listed:  # an id, never the token or its whole hash
            assert row["id"].startswith("tok_") and len(row["id"]) == 20
            assert lost not in str(row) and hash_token(lost) not in str(row)
        assert by_label["laptop"]["id"] == token_id(hash_token(lost))
        assert by_label["laptop"]["scope"] == "session" and by_label["laptop"]["session_id"] == sid
        async with host.client(lost) as a, host.client(kept) as b:
            assert (await a.show(sid))["session_id"] == sid  # its grant is cached now
            with pytest.raises(HostAuthError) as listing:
                await b.list_tokens()
            assert listing.value.code == "forbidden"
            with pytest.raises(HostAuthError) as by_id:  # by id: admin only, even itself
                await b.revoke_token(id=by_label["ci"]["id"])
            assert by_id.value.code == "forbidden"
            # the admin revokes the lost token without having it
            assert await admin.revoke_token(id=by_label["laptop"]["id"]) is True
            assert await admin.revoke_token(id=by_label["laptop"]["id"]) is False
            assert await admin.revoke_token(id="tok_" + "0" * 16) is False  # unknown
            with pytest.raises(HostAuthError):  # at once, despite the cache
                await a.show(sid)
            assert (await b.show(sid))["session_id"] == sid  # only that one
        after = {row["label"]: row["revoked"] for row in await admin.list_tokens()}
        assert after["laptop"] is True and after["ci"] is False
        async with httpx2.AsyncClient(
            base_url=host.url, headers={"Authorization": f"Bearer {host.token}"}
        ) as raw:
            for body in (
                {},
                {"token": kept, "id": by_label["ci"]["id"]},
                {"id": "tok_XYZ"},
                {"id": by_label["ci"]["id"][:-1]},
            ):
                refused = await raw.post("/v1/tokens/revoke", json=body)
                assert refused.status_code == 422, (body, refused.text)
        assert await host.control.grant(kept) is not None  # none of those revoked it


@pytest.mark.slow
async def test_bad_input_is_a_4xx_with_the_engines_code(tmp_path: Path) -> None:
    async with running_host(tmp_path / "state") as host, host.client() as c:
        with pytest.raises(SessionNotFoundError) as missing:
            await c.show("no-such-session")
        assert missing.value.code == "session_not_found"
        sid = await c.create_session(session_id="fixed-id")
        with pytest.raises(HostConflictError) as exists:
            await c.create_session(session_id="fixed-id")
        assert exists.value.code == "session_exists"
        with pytest.raises(UsageError) as model:
            await c.create_session(model="openai:gpt-4.1")
        assert model.value.code == "model_not_allowed"
        with pytest.raises(UsageError) as nothing:
            await c.decide(sid, "call-1", "completed")
        assert nothing.value.code in ("nothing_to_decide", "no_such_call", "session_not_found")
        async with httpx2.AsyncClient(
            base_url=host.url, headers={"Authorization": f"Bearer {host.token}"}
        ) as raw:
            for response in (
                await raw.post(f"/v1/sessions/{sid}/messages", json={"text": ""}),
                await raw.post(f"/v1/sessions/{sid}/messages", content=b"{not json"),
                await raw.post(f"/v1/sessions/{sid}/messages", json={"text": "x", "evil": 1}),
                await raw.get(f"/v1/sessions/{sid}/events", params={"start": -1}),
                await raw.get("/v1/sessions/..%2F..%2Fetc"),
                await raw.get("/v1/nowhere"),
            ):
                assert 400 <= response.status_code < 500, response.text
                error = response.json()["error"]
                assert error["code"] and error["message"]


@pytest.mark.slow
async def test_recover_decide_resume_and_fork(tmp_path: Path) -> None:
    model = write_script(
        tmp_path / "s.json",
        [{"calls": [{"name": "echo", "args": {"text": "one"}}]}, {"text": "done"}],
    )
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        sent = await c.send(sid, "go", key="a")
        await c.wait_message(sid, sent["message"]["id"])
        plan = await c.recovery(sid)
        assert plan["open_turn"] is None and plan["calls"] == []
        with pytest.raises(HostConflictError) as nothing:
            await c.abandon(sid)
        assert nothing.value.code == "nothing_to_abandon"
        child = await c.fork(sid, at=3)
        assert child in await c.list_sessions()
        forked = await c.events(child)
        assert forked[0].kind == "session_started"
        assert forked[0].data["body"]["parent"]["session_id"] == sid
        # a turn on the fork runs with the parent's model
        again = await c.send(child, "go again", key="b")
        result = await c.wait_message(child, again["message"]["id"])
        assert result["status"] == "done", result


async def _chunked_post(url: str, token: str, sid: str, size: int) -> tuple[int, bytes]:
    """POST ``size`` bytes of chunked body (no Content-Length, no closing chunk: the server
    must answer once it has seen too much) through a raw socket; the status and body."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            f"POST /v1/sessions/{sid}/messages HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        sent = 0
        while sent < size:
            piece = min(65536, size - sent)
            writer.write(b"%x\r\n%s\r\n" % (piece, b"x" * piece))
            sent += piece
            await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        status = int(head.split(b" ", 2)[1])
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return status, await asyncio.wait_for(reader.readexactly(length), 10)
    finally:
        writer.close()


async def test_hostile_requests_are_refused_cleanly(tmp_path: Path) -> None:
    async with running_host(tmp_path / "state") as host, host.client() as c:
        sid = await c.create_session()
        async with httpx2.AsyncClient(
            base_url=host.url, headers={"Authorization": f"Bearer {host.token}"}
        ) as raw:
            # a message may carry attachments: its limit is the larger one
            over = MAX_MEDIA_REQUEST + 1
            huge = await raw.post(f"/v1/sessions/{sid}/messages", content=b"x" * over)
            assert huge.status_code == 413
            assert huge.json()["error"]["code"] == "payload_too_large"
            assert str(MAX_MEDIA_REQUEST) in huge.json()["error"]["message"]
            decide = await raw.post(f"/v1/sessions/{sid}/decide", content=b"x" * (2 << 20))
            assert decide.status_code == 413  # any other route: the 1 MB one

            # chunked: no Content-Length to refuse up front; read bounded, still 413
            status, body = await _chunked_post(host.url, host.token, sid, over + 10)
            assert status == 413
            assert json.loads(body)["error"]["code"] == "payload_too_large"

            async def small() -> AsyncIterator[bytes]:
                yield b'{"text": "chunked '
                yield b'hello", "idempotency_key": "chunked"}'

            other = await c.create_session()  # a body that fits still arrives whole
            fits = await raw.post(
                f"/v1/sessions/{other}/messages",
                content=small(),
                headers={"Content-Type": "application/json"},
            )
            assert fits.status_code in (200, 201, 202), fits.text
            assert fits.json()["message"]["idempotency_key"] == "chunked", fits.json()
            bad_id = await raw.get(
                f"/v1/sessions/{sid}/stream", headers={"Last-Event-ID": "12; DROP"}
            )
            assert bad_id.status_code == 422
            assert bad_id.json()["error"]["code"] == "invalid_request"
            long_key = await raw.post(
                f"/v1/sessions/{sid}/messages", json={"text": "x", "idempotency_key": "k" * 500}
            )
            assert long_key.status_code == 422
        # nothing of it reached the log or the queue
        assert (await c.show(sid))["events"] == 0
        assert await host.control.messages(session_id=sid) == []

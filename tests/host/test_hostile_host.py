"""Adversarial checks of the HTTP host (an audit): offsets past what storage can hold,
streams a client walks away from, cookies, webhook signatures and replays. Every answer
is a clean 4xx with the documented error body, and nothing committed is lost."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx2
import pytest

from lodger.errors import ConfigError, CorruptLogError, LodgerError
from lodger.events import Event, EventDraft, TurnStarted
from lodger.host import HookConfig
from lodger.host.feed import Feeds
from lodger.host.routes.events import MAX_OFFSET
from lodger.host.webhooks import load_hooks, sign
from lodger.storage import EventLog, SqliteLogStore, Storage

from ._support import running_host, write_script


async def test_offsets_past_what_storage_holds_are_a_4xx_not_a_500(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", [{"text": "ok"}])
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        sent = await c.send(sid, "go", key="1")
        await c.wait_message(sid, sent["message"]["id"])
        stored = await c.events(sid)
        async with httpx2.AsyncClient(
            base_url=host.url, headers={"Authorization": f"Bearer {host.token}"}, timeout=30
        ) as raw:
            for start in (MAX_OFFSET + 1, 2**63, 10**30):
                page = await raw.get(f"/v1/sessions/{sid}/events", params={"start": start})
                assert page.status_code == 422, page.text
                assert page.json()["error"]["code"] == "invalid_request"
                streamed = await raw.get(
                    f"/v1/sessions/{sid}/stream", params={"start": start, "follow": "false"}
                )
                assert streamed.status_code == 422, streamed.text
                assert streamed.json()["error"]["code"] == "invalid_request"
            # a browser's Last-Event-ID past 2**63 (20 digits): refused, not a stream
            # that breaks after its first line with a traceback in the host's log
            for last in ("9" * 20, str(2**63 - 1)):
                resumed = await raw.get(
                    f"/v1/sessions/{sid}/stream",
                    params={"follow": "false"},
                    headers={"Last-Event-ID": last},
                )
                assert resumed.status_code == 422, resumed.text
                assert resumed.json()["error"]["code"] == "invalid_request"
            # the largest offsets still accepted read as "nothing there yet", cleanly
            edge = await raw.get(f"/v1/sessions/{sid}/events", params={"start": MAX_OFFSET})
            assert edge.status_code == 200 and edge.json()["events"] == []
            tail = await raw.get(
                f"/v1/sessions/{sid}/stream",
                params={"follow": "false"},
                headers={"Last-Event-ID": "9" * 18},
            )
            assert tail.status_code == 200
            assert tail.text == ": lodger stream\n\n"
        assert [f.data for f in await c.events(sid)] == [f.data for f in stored]


async def test_the_cookie_trade_keeps_the_token_that_authenticated(tmp_path: Path) -> None:
    async with running_host(tmp_path / "state") as host, host.client() as c:
        sid = await c.create_session()
        async with httpx2.AsyncClient(base_url=host.url, timeout=30) as browser:
            traded = await browser.post(
                "/v1/auth/cookie", headers={"Authorization": f"Bearer {host.token}"}
            )
            assert traded.status_code == 204
            assert (await browser.get(f"/v1/sessions/{sid}")).status_code == 200
            # authenticated by the cookie, with another scheme's header alongside (a proxy's
            # Basic auth): the cookie must stay the bearer token, not become that header
            again = await browser.post(
                "/v1/auth/cookie", headers={"Authorization": "Basic dXNlcjpwYXNz"}
            )
            assert again.status_code == 204
            assert browser.cookies.get("lodger_token") == host.token
            assert (await browser.get(f"/v1/sessions/{sid}")).status_code == 200
            # a scheme-less header is no bearer token either
            third = await browser.post("/v1/auth/cookie", headers={"Authorization": "x y"})
            assert third.status_code == 204
            assert (await browser.get(f"/v1/sessions/{sid}")).status_code == 200


def test_a_hooks_file_naming_an_invalid_session_is_refused_when_loaded(tmp_path: Path) -> None:
    path = tmp_path / "hooks.toml"
    for session in ('"../evil"', '"a b"', '""', "7", '"x\\n"'):
        path.write_text(f'[hooks.gh]\nsecret = "0123456789"\nsession = {session}\n')
        with pytest.raises(ConfigError, match="names session"):
            load_hooks(path, {})
    path.write_text('[hooks.gh]\nsecret = "0123456789"\nsession = "triage-1.a_b"\n')
    assert load_hooks(path, {})["gh"].session == "triage-1.a_b"


async def test_a_stream_over_a_damaged_log_ends_with_an_error_event(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", [{"text": "ok"}])
    state = tmp_path / "state"
    async with running_host(state, models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        sent = await c.send(sid, "go", key="1")
        await c.wait_message(sid, sent["message"]["id"])
    with sqlite3.connect(state / "log.sqlite3") as db:  # changed outside lodger
        db.execute("UPDATE events SET data = replace(data, 'go', 'GO') WHERE \"offset\" = 1")
    async with (
        running_host(state, models=(model,)) as host,
        httpx2.AsyncClient(
            base_url=host.url, headers={"Authorization": f"Bearer {host.token}"}, timeout=30
        ) as raw,
    ):
        for params in ({"follow": "false"}, {}):  # up to now, and live
            async with raw.stream("GET", f"/v1/sessions/{sid}/stream", params=params) as got:
                assert got.status_code == 200
                text = (await got.aread()).decode()
            blocks = [b for b in text.split("\n\n") if b.strip()]
            # a read that fails verification hands out none of its facts
            assert [b.splitlines()[0] for b in blocks[1:]] == ["event: stream_error"], text
            error = json.loads(blocks[-1].splitlines()[1].removeprefix("data: "))
            assert error["error"]["code"] == "digest_mismatch"
            assert error["error"]["session_id"] == sid and error["error"]["offset"] == 1
        # the client raises it (it used to reconnect and read the same cut stream forever)
        async with host.client() as c:

            async def drain() -> None:
                async with asyncio.timeout(20):
                    async for _ in c.stream(sid):
                        pass

            with pytest.raises(LodgerError) as raised:
                await drain()
            assert raised.value.code == "digest_mismatch" and raised.value.offset == 1


@pytest.mark.slow
async def test_the_timeline_stops_and_says_why_on_a_damaged_log(tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    from .test_timeline import ARGS, CHROMIUM

    hostile = '<img src=x onerror="document.title=1">'
    model = write_script(tmp_path / "s.json", [{"text": hostile}])
    state = tmp_path / "state"
    async with running_host(state, models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        sent = await c.send(sid, hostile, key="1")
        await c.wait_message(sid, sent["message"]["id"])
    requests: list[str] = []
    async with running_host(state, models=(model,)) as host, async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = await browser.new_page()
            page.on("request", lambda r: requests.append(r.url))
            await page.goto(f"{host.url}/timeline/{sid}#token={host.token}")
            await page.locator(".end").first.wait_for(timeout=20_000)
            assert await page.locator("img").count() == 0  # hostile input stays text
            assert await page.title() != "1"
            with sqlite3.connect(state / "log.sqlite3") as db:  # damaged under the page
                db.execute(
                    "UPDATE events SET data = replace(data, 'img', 'IMG') WHERE \"offset\" = 1"
                )
            await page.reload()  # the cookie holds the token now
            status = page.locator("#status", has_text="stopped")
            await status.wait_for(timeout=20_000)
            assert "digest_mismatch" in await status.inner_text()
            streams = len([u for u in requests if u.endswith("/stream")])
            await asyncio.sleep(4)  # EventSource's own retry is ~3 s: it must not reconnect
            assert len([u for u in requests if u.endswith("/stream")]) == streams
        finally:
            await browser.close()


async def test_a_bounded_read_while_a_turn_appends_is_no_gap(tmp_path: Path) -> None:
    # GET /events (always bounded) and a stream's pages read while a turn appends: an
    # event committed between the read and its end-of-log check is not a damaged log
    storage = Storage.local(tmp_path / "state")
    writer = await storage.log.open_writer("s1")
    refused: list[str] = []

    async def append() -> None:
        for offset in range(300):
            draft = EventDraft(
                id=f"e{offset}", ts=1_700_000_000_000_000 + offset, body=TurnStarted(input="x")
            )
            await writer.append([draft], expected_offset=offset)

    async def read() -> int:
        reads = 0
        while not appending.done():
            head = (await storage.log.head("s1")).high_water
            try:
                await storage.log.read("s1", start=max(head - 1, 0), end=head + 500)
            except CorruptLogError as exc:
                refused.append(f"{exc.code} at {exc.offset}")
            reads += 1
            await asyncio.sleep(0)
        return reads

    appending = asyncio.create_task(append())
    _, reads = await asyncio.gather(appending, read())
    await writer.close()
    assert reads > 50 and refused == []
    # a real gap is still one: a record gone from the middle, read up to it
    await storage.close()
    with sqlite3.connect(tmp_path / "state" / "log.sqlite3") as db:
        db.execute('DELETE FROM events WHERE "offset" >= 100 AND "offset" < 200')
    storage = Storage.local(tmp_path / "state")
    with pytest.raises(CorruptLogError) as gap:
        await storage.log.read("s1", start=50, end=150)
    assert gap.value.code == "gap" and gap.value.offset == 100
    await storage.close()


class _CountingLog(EventLog):
    """A real log that records the range of each read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ranges: list[tuple[int, int | None]] = []

    async def read(self, session_id: str, *, start: int = 0, end: int | None = None) -> list[Event]:
        self.ranges.append((start, end))
        return await super().read(session_id, start=start, end=end)


async def test_a_stream_reads_a_long_log_a_page_at_a_time(tmp_path: Path) -> None:
    # a stream used to read the whole log at once and hold it until its client read it
    # all: ten streams nobody reads over a 20,000-event log held 1.1 GB in the host
    log = _CountingLog(SqliteLogStore(tmp_path / "state"))
    writer = await log.open_writer("long")
    total = 1234
    for first in range(0, total, 200):
        drafts = [
            EventDraft(id=f"e{n}", ts=1_700_000_000_000_000 + n, body=TurnStarted(input="x"))
            for n in range(first, min(first + 200, total))
        ]
        await writer.append(drafts, expected_offset=first)
    await writer.close()
    log.ranges.clear()  # the writer's own reads
    feeds = Feeds(log, page=100)
    got = [e.offset async for e in feeds.follow("long", start=7, follow=False)]
    assert got == list(range(7, total))  # across pages: no gap, no repeat
    assert log.ranges and all(end is not None and end - start <= 100 for start, end in log.ranges)
    # live: a stream started from 0 reads pages too, then waits for new facts
    log.ranges.clear()
    live = feeds.follow("long", start=0)
    seen = [await anext(live) for _ in range(total)]
    assert [e.offset for e in seen] == list(range(total))
    assert all(end is not None and end - start <= 100 for start, end in log.ranges)
    await live.aclose()
    await log.close()


async def test_made_up_methods_add_no_metric_series(tmp_path: Path) -> None:
    async with running_host(tmp_path / "state") as host, host.client() as c:
        port = int(host.url.rsplit(":", 1)[1])
        for n in range(40):  # no token needed: every request is counted
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"M{n:04d} /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n".encode())
            await writer.drain()
            assert (await reader.readline()).startswith(b"HTTP/1.1 404")
            writer.close()
            await writer.wait_closed()
        text = await c.metrics()
        counted = [line for line in text.splitlines() if 'route="unmatched"' in line]
        assert counted == [
            'lodger_host_requests_total{method="other",route="unmatched",status="404"} 40'
        ]


def _fact(session_id: str, offset: int) -> Event:
    return Event(
        offset=offset,
        session_id=session_id,
        id=f"{session_id}-{offset}",
        ts=1_700_000_000_000_000 + offset,
        body=TurnStarted(input="x" * 100),
        digest="0" * 64,
    )


async def test_windows_of_sessions_nobody_follows_are_not_kept_forever(tmp_path: Path) -> None:
    # each session a host runs published its facts into a window kept for the host's life
    log = EventLog(SqliteLogStore(tmp_path / "state"))
    feeds = Feeds(log, poll_s=3600, keep=8)  # a follower that misses a publish hangs
    followed = feeds.follow("watched", start=0)
    first = asyncio.ensure_future(anext(followed))
    await asyncio.sleep(0.05)  # the follower is waiting on its feed now
    for n in range(2000):  # sessions that ran here once, each with a few facts
        feeds.publish(f"s{n}", [_fact(f"s{n}", k) for k in range(5)])
    held = sum(len(f.recent) for f in feeds._feeds.values())
    assert len(feeds._feeds) <= 8 and held <= 8 * 5, (len(feeds._feeds), held)
    # the followed session's feed survived: a fact published to it reaches its follower
    feeds.publish("watched", [_fact("watched", 0)])
    got = await asyncio.wait_for(first, 5)
    assert got.offset == 0 and got.session_id == "watched"
    await followed.aclose()
    await log.close()


async def test_a_chunked_body_with_a_small_content_length_is_still_bounded(
    tmp_path: Path,
) -> None:
    # Content-Length and Transfer-Encoding together: the server reads the chunked body
    # (RFC 9112), so a small declared length must not switch the bounded read off
    async with running_host(tmp_path / "state") as host, host.client() as c:
        sid = await c.create_session()
        port = int(host.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                # (decide: a route of the 1 MB limit; a message's is larger, for media)
                f"POST /v1/sessions/{sid}/decide HTTP/1.1\r\nHost: h\r\n"
                f"Authorization: Bearer {host.token}\r\nContent-Type: application/json\r\n"
                "Content-Length: 13\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
            )
            sent, size = 0, 1024 * 1024 + 10  # no closing chunk: it must answer when over
            while sent < size:
                piece = min(65536, size - sent)
                writer.write(b"%x\r\n%s\r\n" % (piece, b"x" * piece))
                sent += piece
                await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        finally:
            writer.close()
        assert head.startswith(b"HTTP/1.1 413"), head
        assert await host.control.messages(session_id=sid) == []


async def test_a_client_cannot_claim_a_webhook_deliverys_key(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", [{"text": "ok"}])
    secret = b"0123456789abcdef"
    hooks = {"ci": HookConfig(name="ci", secret=secret, session="triage")}
    async with (
        running_host(tmp_path / "state", models=(model,), hooks=hooks) as host,
        host.client() as c,
        httpx2.AsyncClient(base_url=host.url, timeout=30) as raw,
    ):
        body = b'{"build": 1}'
        signed = {"X-Hub-Signature-256": sign(secret, body)}
        first = await raw.post("/hooks/ci", content=body, headers={**signed, "X-Delivery-Id": "1"})
        assert first.status_code == 202, first.text
        # the session's own token tries to take the next delivery's key, every way it can
        auth = {"Authorization": f"Bearer {await c.make_token(session_id='triage')}"}
        path = "/v1/sessions/triage"
        for made in (
            await raw.post(
                f"{path}/messages",
                json={"text": "x", "idempotency_key": "hook:ci:2"},
                headers=auth,
            ),
            await raw.post(
                f"{path}/messages",
                json={"text": "x"},
                headers={**auth, "Idempotency-Key": "hook:ci:2"},
            ),
            await raw.post(f"{path}/resume", json={"idempotency_key": "hook:ci:2"}, headers=auth),
        ):
            assert made.status_code == 422, made.text
            assert made.json()["error"]["code"] == "invalid_request"
        # so the real delivery still runs
        second = await raw.post("/hooks/ci", content=body, headers={**signed, "X-Delivery-Id": "2"})
        assert second.status_code == 202 and second.json()["created"], second.text
        keys = [m.key for m in await host.control.messages(session_id="triage")]
        assert keys == ["hook:ci:1", "hook:ci:2"]


async def test_held_facts_cannot_forge_sse_lines_and_tokens_never_ride_in_urls(
    tmp_path: Path,
) -> None:
    hostile = "a\n\nid: 999\nevent: turn_ended\ndata: {}\r\rb\u2028c\u0085d\x00e"
    model = write_script(tmp_path / "s.json", [{"text": hostile}])
    async with (
        running_host(tmp_path / "state", models=(model,)) as host,
        host.client() as c,
        httpx2.AsyncClient(base_url=host.url, timeout=30) as raw,
    ):
        sid = await c.create_session()
        sent = await c.send(sid, hostile, key="1")
        await c.wait_message(sid, sent["message"]["id"])
        stored = await c.events(sid)
        auth = {"Authorization": f"Bearer {host.token}"}
        got = await raw.get(f"/v1/sessions/{sid}/stream?follow=false", headers=auth)
        # one id line per fact, and each data line parses back to the stored fact
        lines = got.text.split("\n")
        assert [int(x[4:]) for x in lines if x.startswith("id: ")] == [f.offset for f in stored]
        datas = [json.loads(x[6:]) for x in lines if x.startswith("data: ")]
        assert datas == [f.data for f in stored]
        assert datas[1]["body"]["input"] == hostile
        # a token in the query string opens nothing (it would end up in access logs)
        for name in ("token", "access_token", "lodger_token"):
            leaked = await raw.get(f"/v1/sessions?{name}={host.token}")
            assert leaked.status_code == 401, leaked.text
        # another origin (a DNS-rebinding page) gets no CORS grant to read answers
        rebound = await raw.get(
            "/v1/sessions",
            headers={**auth, "Host": "evil.example", "Origin": "http://evil.example"},
        )
        assert "access-control-allow-origin" not in rebound.headers
        preflight = await raw.options(
            "/v1/sessions",
            headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 405
        assert "access-control-allow-origin" not in preflight.headers


async def test_a_message_sent_while_another_writer_holds_the_session_runs(
    tmp_path: Path,
) -> None:
    # a decide or abandon over the host (or `lodger decide`) holds the session's writer
    # for a moment; a message whose run starts then used to fail for good: session_locked
    model = write_script(tmp_path / "s.json", {"turns": [[{"text": "one"}], [{"text": "two"}]]})
    state = tmp_path / "state"
    async with running_host(state, models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        first = await c.send(sid, "one", key="1")
        assert (await c.wait_message(sid, first["message"]["id"]))["status"] == "done"
        other = Storage.local(state)
        writer = await other.log.open_writer(sid)
        sent = await c.send(sid, "two", key="2")
        await asyncio.sleep(0.6)  # the run finds the session locked, maybe more than once
        await writer.close()
        done = await c.wait_message(sid, sent["message"]["id"])
        assert done["status"] == "done", done
        assert done["result"]["answer"] == "two"
        await other.close()


async def test_an_artifact_of_hostile_tool_output_is_served_inert(tmp_path: Path) -> None:
    # a tool's long output (a fetched web page, say) is kept as an artifact and served on
    # the API's origin, where the page's cookie opens the API: it must never run as a page
    page = "<html><script>fetch('/v1/tokens',{method:'POST',body:'{}'})</script>" + "x" * 20_000
    model = write_script(
        tmp_path / "s.json",
        [{"calls": [{"name": "echo", "args": {"text": page}}]}, {"text": "done"}],
    )
    async with (
        running_host(tmp_path / "state", models=(model,)) as host,
        host.client() as c,
        httpx2.AsyncClient(
            base_url=host.url, headers={"Authorization": f"Bearer {host.token}"}, timeout=30
        ) as raw,
    ):
        sid = await c.create_session()
        sent = await c.send(sid, "go", key="1")
        await c.wait_message(sid, sent["message"]["id"])
        facts = await c.events(sid)
        responded = [f.data["body"] for f in facts if f.kind == "tool_responded"]
        (ref,) = [a for body in responded for a in body["artifacts"]]
        got = await raw.get(f"/v1/sessions/{sid}/artifacts/{ref['sha256']}")
        assert got.status_code == 200 and got.content == page.encode()
        assert got.headers["x-content-type-options"] == "nosniff"
        assert got.headers["content-security-policy"].startswith("sandbox")
        assert got.headers["content-disposition"].startswith("attachment")

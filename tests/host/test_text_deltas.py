"""Text deltas on the host's stream: transient, labelled with their turn and step, never
facts (never in the log, never an ``id``, so ``Last-Event-ID`` counts facts only), given
out after the facts published before them, and bounded per follower (a slow follower
loses deltas, never facts)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from lodger.events import Event, EventDraft, TurnStarted
from lodger.host.feed import DeltaBuffer, Feeds, LiveText
from lodger.storage import EventLog, SqliteLogStore

from ._support import running_host, write_script


@dataclass
class Frame:
    """One server-sent event as it came: its ``id`` line (None: it had none)."""

    id: str | None
    event: str
    data: dict[str, Any]


async def _frames(response: httpx2.Response) -> AsyncIterator[Frame]:
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line.startswith(":"):
            continue
        if line == "":
            if "data" in fields:
                yield Frame(
                    fields.get("id"), fields.get("event", "message"), json.loads(fields["data"])
                )
            fields = {}
            continue
        name, _, value = line.partition(":")
        fields[name] = value.removeprefix(" ")


async def _read_turn(
    url: str, token: str, sid: str, *, deltas: bool, last_id: str | None = None
) -> list[Frame]:
    """The stream's frames up to the first ``turn_ended``."""
    headers = {"Authorization": f"Bearer {token}"}
    if last_id is not None:
        headers["Last-Event-ID"] = last_id
    params = {"deltas": "true"} if deltas else {}
    seen: list[Frame] = []
    async with (
        httpx2.AsyncClient(base_url=url, timeout=httpx2.Timeout(30, read=None)) as http,
        http.stream("GET", f"/v1/sessions/{sid}/stream", params=params, headers=headers) as r,
    ):
        assert r.status_code == 200
        async for frame in _frames(r):
            seen.append(frame)
            if frame.event == "turn_ended":
                return seen
    raise AssertionError("the stream ended before the turn")


async def _wait_for(path: Path) -> None:
    async with asyncio.timeout(30):
        while not await asyncio.to_thread(path.exists):  # noqa: ASYNC110 - a tool's file
            await asyncio.sleep(0.02)


async def test_deltas_come_labelled_before_their_fact_and_never_reach_the_log(
    tmp_path: Path, gates: Path
) -> None:
    model = write_script(
        tmp_path / "s.json",
        [
            {
                "text": "Let me wait <b>here</b>.",
                "calls": [{"name": "gate", "args": {"name": "d1"}}],
            },
            {"text": "Done: the gate is open."},
        ],
    )
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        with_deltas = asyncio.create_task(_read_turn(host.url, host.token, sid, deltas=True))
        plain = asyncio.create_task(_read_turn(host.url, host.token, sid, deltas=False))
        # both streams follow the session before the turn starts
        async with asyncio.timeout(10):
            feed = host.app.state.host.feeds.feed(sid)
            while feed.followers < 2 or not feed.listeners:  # noqa: ASYNC110 - no signal
                await asyncio.sleep(0.01)
        sent = await c.send(sid, "go", key="k1")
        await _wait_for(gates / "d1.starts")
        (gates / "d1").touch()
        frames, plain_frames = await asyncio.wait_for(asyncio.gather(with_deltas, plain), 60)
        await c.wait_message(sid, sent["message"]["id"])

        deltas = [f for f in frames if f.event == "text_delta"]
        facts = [f for f in frames if f.event != "text_delta"]
        assert [d.data["text"] for d in deltas] == [
            "Let me wait <b>here</b>.",
            "Done: the gate is open.",
        ]
        assert all(d.id is None and d.data["transient"] is True for d in deltas)
        assert set(deltas[0].data) == {"transient", "turn_id", "step_id", "text"}
        # every fact has its offset as its id; the plain stream has the same facts, no delta
        assert [f.id for f in facts] == [str(f.data["offset"]) for f in facts]
        assert [(f.id, f.event) for f in plain_frames] == [(f.id, f.event) for f in facts]
        # each delta names its turn and step, and comes before the step's model output
        turn_id = next(f.data["turn_id"] for f in facts if f.event == "turn_started")
        outputs = [(n, f) for n, f in enumerate(frames) if f.event == "model_output"]
        assert len(outputs) == 2
        for delta, (where, output) in zip(deltas, outputs, strict=True):
            assert delta.data["turn_id"] == turn_id
            assert delta.data["step_id"] == output.data["step_id"]
            assert frames.index(delta) < where
            assert output.data["body"]["text"] == delta.data["text"]
        # the log holds the facts the stream sent, nothing else
        stored = await c.events(sid)
        assert [f.data for f in stored] == [f.data for f in facts]
        assert "transient" not in json.dumps([f.data for f in stored])

        # a reconnect after a delta: the client's last id is the fact before it, so it
        # continues with the fact after that, no gap and no repeat
        last_before = next(
            frames[n - 1].id for n, f in enumerate(frames) if f.event == "text_delta" and n > 0
        )
        assert last_before is not None
        again = await _read_turn(host.url, host.token, sid, deltas=True, last_id=last_before)
        assert [f.id for f in again] == [f.id for f in facts if int(f.id or 0) > int(last_before)]
        assert all(f.event != "text_delta" for f in again)  # the turn no longer runs


async def _facts(tmp_path: Path, session_id: str, count: int) -> tuple[EventLog, list[Event]]:
    log = EventLog(SqliteLogStore(tmp_path / "state"))
    writer = await log.open_writer(session_id)
    drafts = [
        EventDraft(id=f"e{n}", ts=1_700_000_000_000_000 + n, body=TurnStarted(input=f"m{n}"))
        for n in range(count)
    ]
    await writer.append(drafts, expected_offset=0)
    await writer.close()
    return log, await log.read(session_id)


async def test_a_delta_waits_for_the_facts_published_before_it(tmp_path: Path) -> None:
    log, facts = await _facts(tmp_path, "s", 6)
    feeds = Feeds(log, poll_s=3600)
    feeds.publish("s", facts[:4])  # four facts, then a delta, then two more facts
    buffer = DeltaBuffer()
    # a follower from offset 0 reads the first facts from the log first
    live = feeds.follow_live("s", start=0, deltas=buffer)
    first = await anext(live)
    assert isinstance(first, Event) and first.offset == 0
    feeds.publish_text("s", "t1", "step1", "hel")
    feeds.publish_text("s", "t1", "step1", "lo")
    feeds.publish("s", facts[4:])
    got: list[Event | LiveText] = [first]
    while len(got) < 7:
        got.append(await asyncio.wait_for(anext(live), 5))
    shape = [i.offset if isinstance(i, Event) else i.text for i in got]
    # joined while it waited; after facts 0..3, before fact 4
    assert shape == [0, 1, 2, 3, "hello", 4, 5]
    await live.aclose()
    assert not feeds.feed("s").listeners  # a closed follower takes no more deltas
    await log.close()


async def test_a_slow_follower_loses_deltas_never_facts(tmp_path: Path) -> None:
    log, facts = await _facts(tmp_path, "s", 40)
    feeds = Feeds(log, poll_s=3600)
    buffer = DeltaBuffer(max_chars=1000, max_items=8)
    live = feeds.follow_live("s", start=0, deltas=buffer)
    first = await anext(live)  # following now; then it reads nothing for a while
    texts: dict[str, str] = {}
    for n, fact in enumerate(facts[1:], start=1):
        step = f"step{n % 5}"  # five steps' deltas interleaved with the facts
        for k in range(30):
            piece = f"<{n}.{k}>"
            texts[step] = texts.get(step, "") + piece
            feeds.publish_text("s", "t1", step, piece)
            assert buffer.chars <= 1000 and len(buffer.items) <= 8  # bounded all along
        feeds.publish("s", [fact])
    got: list[Event | LiveText] = [first]
    while sum(isinstance(i, Event) for i in got) < 40 or buffer.items:
        got.append(await asyncio.wait_for(anext(live), 5))
    offsets = [i.offset for i in got if isinstance(i, Event)]
    assert offsets == list(range(40))  # every fact, in order
    assert buffer.dropped > 0
    given: dict[str, str] = {}
    for item in got:
        if isinstance(item, LiveText):
            given[item.step_id] = given.get(item.step_id, "") + item.text
    # what a step's follower got is a prefix of the step's text, and not all of it
    assert given and all(texts[step].startswith(text) for step, text in given.items())
    assert sum(map(len, given.values())) < sum(map(len, texts.values()))
    await live.aclose()
    await log.close()


async def test_nobody_taking_deltas_costs_nothing(tmp_path: Path) -> None:
    log, facts = await _facts(tmp_path, "s", 2)
    feeds = Feeds(log, poll_s=3600)
    feeds.publish_text("s", "t", "p", "no feed: dropped at once")
    assert "s" not in feeds._feeds
    live = feeds.follow("s", start=0)  # follows without deltas
    assert (await anext(live)).offset == 0
    feeds.publish("s", facts)
    feeds.publish_text("s", "t", "p", "nobody asked")
    assert (await asyncio.wait_for(anext(live), 5)).offset == 1
    await live.aclose()
    await log.close()

"""Text deltas and the protocol streams in distributed mode, over real parts: a real
PostgreSQL control plane (deltas travel from the worker to the host by ``NOTIFY``), a
``file://`` store, a real ``lodger worker`` subprocess, the host on loopback; and the
AI SDK's own chat client through an approval a worker-run turn asks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from lodger.storage.control.interface import TextPiece

from ._support import Setup
from .test_distributed import distributed_host, setup, worker
from .test_protocol_streams import DEPLOY, _node, _parts
from .test_text_deltas import _read_turn

pytestmark = pytest.mark.slow

__all__ = ["setup"]  # the fixture, used by name


async def test_a_workers_text_deltas_reach_the_hosts_stream(setup: Setup, gates: Path) -> None:
    setup.script(
        [
            {"text": "Waiting on the gate.", "calls": [{"name": "gate", "args": {"name": "w1"}}]},
            {"text": "The gate is open: done."},
        ]
    )
    with worker(setup):
        async with distributed_host(setup) as host, host.client() as c:
            sid = await c.create_session(session_id="dd1")
            reading = asyncio.create_task(_read_turn(host.url, host.token, sid, deltas=True))
            await asyncio.sleep(0)  # the request is made; the listener joins on its start
            await c.send(sid, "go", key="1")
            async with asyncio.timeout(60):
                while not (gates / "w1.starts").exists():  # noqa: ASYNC110 - a worker's tool
                    await asyncio.sleep(0.05)
            (gates / "w1").touch()
            frames = await asyncio.wait_for(reading, 60)
            deltas = [f for f in frames if f.event == "text_delta"]
            outputs = [f for f in frames if f.event == "model_output"]
            assert [d.data["text"] for d in deltas] == [
                "Waiting on the gate.",
                "The gate is open: done.",
            ]
            assert all(d.id is None for d in deltas)
            for delta, output in zip(deltas, outputs, strict=True):
                assert delta.data["step_id"] == output.data["step_id"]
                assert frames.index(delta) < frames.index(output)
            facts = [f for f in frames if f.event != "text_delta"]
            assert [f.data for f in await c.events(sid)] == [f.data for f in facts]


async def test_a_malformed_notice_on_the_text_channel_is_dropped(setup: Setup) -> None:
    from lodger.storage.control import open_control

    plane = open_control(setup.dsn)
    await plane.start()
    got: list[TextPiece] = []
    text = "é" * 4000  # more than one notification holds
    try:
        listening = asyncio.create_task(plane.listen_text(got.append))  # type: ignore[attr-defined]
        attempt = 0
        async with asyncio.timeout(30):
            while not got:  # until the listener is connected: a notice nobody hears is lost
                attempt += 1
                # anyone with the database can notify: junk first, then a real piece
                async with plane._pool.connection() as conn:  # type: ignore[attr-defined]
                    for junk in ("not json", json.dumps({"s": 1}), json.dumps([1, 2])):
                        await conn.execute("SELECT pg_notify('lodger_text', %s)", (junk,))
                piece = TextPiece(
                    session_id="s", turn_id="t", step_id="p", after=attempt, text=text
                )
                await plane.notify_text(pieces=[piece])  # type: ignore[attr-defined]
                await asyncio.sleep(0.2)
            heard = got[0].after
            while sum(len(p.text) for p in got if p.after == heard) < len(text):  # noqa: ASYNC110
                await asyncio.sleep(0.02)  # (the listener has no event to wait on)
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        pieces = [p for p in got if p.after == heard]
        # split to fit a notification, in order, every piece well formed; junk dropped
        assert len(pieces) == 3 and "".join(p.text for p in pieces) == text
        assert all((p.session_id, p.turn_id, p.step_id) == ("s", "t", "p") for p in got)
    finally:
        await plane.close()


async def test_use_chat_through_an_approval_a_worker_asks(setup: Setup) -> None:
    setup.script(DEPLOY)
    with worker(setup):
        async with distributed_host(setup) as host:
            async with host.client() as c:
                sid = await c.create_session(session_id="dd2")
            config = {"url": host.url, "token": host.token, "session": sid}
            got = await _node(
                "ai_sdk_client.mjs", {**config, "mode": "chat", "text": "ship it", "approve": True}
            )
            assert got["errors"] == []
            (call,) = _parts(got["messages"][-1], "tool-deploy")
            assert call["state"] == "output-available" and call["output"] == "deployed web"
            texts = [p["text"] for p in _parts(got["messages"][-1], "text")]
            assert texts == ["I will deploy <web> now.", "Deployed web; all done."]
            assert [f["finishReason"] for f in got["finishes"]] == ["tool-calls", "stop"]

"""The alternate stream endpoints, read by each protocol's own client library against a
real host and store: the Vercel AI SDK (``ai``: ``AbstractChat``, what ``useChat``
wraps, over ``DefaultChatTransport``; and ``readUIMessageStream``) and AG-UI
(``@ag-ui/client``'s ``HttpAgent``). Node scripts in ``tests/js_clients`` drive them and
print what the library rendered; the tests assert on that and on the log."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tests.providers.wire_server import Stream, WireServer, sse

from lodger.client import HostClient

from ._support import Host, running_host, write_script
from .test_text_deltas import _read_turn

CLIENTS = Path(__file__).parents[1] / "js_clients"

DEPLOY = [
    {"text": "I will deploy <web> now.", "calls": [{"name": "deploy", "args": {"target": "web"}}]},
    {"text": "Deployed web; all done."},
]


async def _node(script: str, config: dict[str, Any]) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(CLIENTS / script),
        json.dumps(config),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    found: dict[str, Any] = json.loads(out)
    return found


def _config(host: Host, sid: str, **more: Any) -> dict[str, Any]:
    return {"url": host.url, "token": host.token, "session": sid, **more}


def _parts(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [p for p in message["parts"] if p["type"] == kind]


async def test_use_chat_renders_a_turn_with_an_approval(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", DEPLOY)
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        got = await _node(
            "ai_sdk_client.mjs", _config(host, sid, mode="chat", text="ship it", approve=True)
        )
        assert got["errors"] == [] and got["status"] == "ready"
        # the first answer stopped at the approval, with the call's input in view
        first = got["first"][-1]
        (asked,) = _parts(first, "tool-deploy")
        assert asked["state"] == "approval-requested" and asked["input"] == {"target": "web"}
        assert asked["approval"]["id"] == asked["toolCallId"]
        # the continuation went on in the same assistant message
        user, answer = got["messages"]
        assert user["role"] == "user" and answer["role"] == "assistant"
        assert answer["id"] == first["id"]
        (call,) = _parts(answer, "tool-deploy")
        assert call["state"] == "output-available" and call["output"] == "deployed web"
        assert call["approval"]["approved"] is True
        texts = [p["text"] for p in _parts(answer, "text")]
        assert texts == ["I will deploy <web> now.", "Deployed web; all done."]
        assert [f["finishReason"] for f in got["finishes"]] == ["tool-calls", "stop"]
        meta = got["finishes"][-1]["metadata"]["lodger"]
        assert meta["status"] == "completed" and meta["session_id"] == sid
        # the log: one turn, its id the message's; the answer recorded who gave it
        events = [f.data for f in await c.events(sid)]
        assert meta["next_offset"] == len(events)
        assert [e["turn_id"] for e in events if e["kind"] == "turn_started"] == [answer["id"]]
        decided = [e for e in events if e["kind"] == "permission_decided"]
        assert [d["body"]["decision"] for d in decided] == ["allow"]
        assert decided[0]["body"]["who"].startswith("token:tok_")


async def test_use_chat_shows_a_denied_call_as_denied(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", DEPLOY)
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        got = await _node(
            "ai_sdk_client.mjs", _config(host, sid, mode="chat", text="ship it", approve=False)
        )
        assert got["errors"] == []
        (call,) = _parts(got["messages"][-1], "tool-deploy")
        assert call["state"] == "output-denied"
        events = [f.data for f in await c.events(sid)]
        assert not [e for e in events if e["kind"] == "tool_dispatched"]  # it never ran


async def test_read_ui_message_stream_renders_a_live_turn(tmp_path: Path, gates: Path) -> None:
    model = write_script(
        tmp_path / "s.json",
        [
            {"text": "Looking.", "calls": [{"name": "gate", "args": {"name": "u1"}}]},
            {"text": "The gate opened.", "calls": [{"name": "echo", "args": {"text": 'x"y'}}]},
            {"text": "Finished."},
        ],
    )
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        assert (await _node("ai_sdk_client.mjs", _config(host, sid, mode="read"))) == {
            "none": True
        }  # no turn runs: 204, which the transport reads as nothing to resume
        reader = asyncio.create_task(
            _node("ai_sdk_client.mjs", _config(host, sid, mode="read", start=0))
        )
        feed = host.app.state.host.feeds.feed(sid)
        async with asyncio.timeout(30):
            while not feed.listeners:  # noqa: ASYNC110 - the reader is another process
                await asyncio.sleep(0.02)
        await c.send(sid, "go", key="k")
        async with asyncio.timeout(30):
            while not (gates / "u1.starts").exists():  # noqa: ASYNC110 - a tool's file
                await asyncio.sleep(0.02)
        # a reconnect while the turn runs (no start): the open turn from its start
        rejoined = asyncio.create_task(_node("ai_sdk_client.mjs", _config(host, sid, mode="read")))
        async with asyncio.timeout(30):
            while len(feed.listeners) < 2:  # noqa: ASYNC110 - the reader is another process
                await asyncio.sleep(0.02)
        (gates / "u1").touch()
        got = await reader
        again = await rejoined
        assert again["errors"] == [] and again["message"] == got["message"]
        assert got["errors"] == []
        types = [chunk["type"] for chunk in got["chunks"]]
        assert types[0] == "start" and types[-1] == "finish"
        assert types.count("start-step") == 3 and types.count("finish-step") == 3
        for kind in ("text-start", "text-delta", "text-end"):
            assert types.count(kind) == 3
        message = got["message"]
        assert [p["text"] for p in _parts(message, "text")] == [
            "Looking.",
            "The gate opened.",
            "Finished.",
        ]
        gate, echo = _parts(message, "tool-gate"), _parts(message, "tool-echo")
        assert gate[0]["output"] == "gate u1 open" and echo[0]["input"] == {"text": 'x"y'}
        assert echo[0]["state"] == "output-available" and echo[0]["output"] == 'x"y'
        # rendered as it arrived: the text grew over several snapshots
        assert len(set(got["texts"])) >= 3
        assert got["chunks"][-1]["finishReason"] == "stop"


async def test_ag_ui_http_agent_sees_a_denied_call_refused(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", DEPLOY)
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        got = await _node("ag_ui_client.mjs", _config(host, sid, text="ship it", approve=False))
        first, second = got["runs"]
        assert first["finished"]["outcome"]["type"] == "interrupt"
        assert second["failures"] == [] and second["finished"]["outcome"] == {"type": "success"}
        (result,) = [m for m in got["messages"] if m["role"] == "tool"]
        assert result["content"].startswith("denied")
        events = [f.data for f in await c.events(sid)]
        assert not [e for e in events if e["kind"] == "tool_dispatched"]


async def test_ag_ui_http_agent_renders_a_turn_with_an_interrupt(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", DEPLOY)
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        got = await _node("ag_ui_client.mjs", _config(host, sid, text="ship it", approve=True))
        first, second = got["runs"]
        assert first["failures"] == [] and second["failures"] == []
        outcome = first["finished"]["outcome"]
        assert outcome["type"] == "interrupt"
        (interrupt,) = outcome["interrupts"]
        assert interrupt["reason"] == "tool_approval"
        assert first["finished"]["runId"] == "run-1" and first["finished"]["threadId"] == sid
        types = [e["type"] for e in first["events"]]
        assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
        for kind in ("TEXT_MESSAGE_START", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"):
            assert kind in types
        assert second["finished"]["outcome"] == {"type": "success"}
        assert second["finished"]["result"] == "Deployed web; all done."
        custom = [e for e in second["events"] if e["type"] == "CUSTOM"]
        assert custom[-1]["name"] == "lodger.turn" and custom[-1]["value"]["status"] == "completed"
        # what the agent assembled: the user's message, the assistant's text and call,
        # the call's result, the final text
        messages = got["messages"]
        assert messages[0]["role"] == "user"
        assistants = [m for m in messages if m["role"] == "assistant"]
        calls = [call for m in assistants for call in m.get("toolCalls") or []]
        assert [(k["function"]["name"], json.loads(k["function"]["arguments"])) for k in calls] == [
            ("deploy", {"target": "web"})
        ]
        assert calls[0]["id"] == interrupt["toolCallId"] == interrupt["id"]
        (result,) = [m for m in messages if m["role"] == "tool"]
        assert result["toolCallId"] == calls[0]["id"] and result["content"] == "deployed web"
        texts = [m["content"] for m in assistants if m.get("content")]
        assert texts == ["I will deploy <web> now.", "Deployed web; all done."]
        events = [f.data for f in await c.events(sid)]
        assert [e["body"]["decision"] for e in events if e["kind"] == "permission_decided"] == [
            "allow"
        ]


PIECES = ["Stream", "ing ", "<b>live</b>", " text", "\n\ndata: [DONE]\n\n", "."]


def _chat_chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[str | None, str]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return sse({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                "model": "gpt-test", "choices": [choice]})  # fmt: skip


async def test_a_providers_streamed_text_arrives_in_pieces_on_every_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    frames = [_chat_chunk({"role": "assistant", "content": p}) for p in PIECES]
    with WireServer() as server:  # an OpenAI-compatible server that writes slowly
        server.push(Stream([*frames, _chat_chunk({}, "stop"), sse("[DONE]")], gap=0.15))
        model = f"openai-compatible:{server.base_url}/v1#gpt-test"
        async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
            sid = await c.create_session()
            raw = asyncio.create_task(_read_turn(host.url, host.token, sid, deltas=True))
            ui = asyncio.create_task(
                _node("ai_sdk_client.mjs", _config(host, sid, mode="read", start=0))
            )
            feed = host.app.state.host.feeds.feed(sid)
            async with asyncio.timeout(30):
                while len(feed.listeners) < 2:  # noqa: ASYNC110 - one reader is another process
                    await asyncio.sleep(0.02)
            # the turn is started by AG-UI's client: three clients render one live turn
            agui = await _node("ag_ui_client.mjs", _config(host, sid, text="go", approve=True))
            frames_seen, got = await asyncio.wait_for(asyncio.gather(raw, ui), 60)
    whole = "".join(PIECES)
    deltas = [f.data["text"] for f in frames_seen if f.event == "text_delta"]
    # the model wrote slowly: its text came in pieces (a reader that lags gets pieces
    # joined), in order, before the fact that holds it all
    assert "".join(deltas) == whole and len(deltas) >= 2 and _joins_of(deltas, PIECES)
    (output,) = [f for f in frames_seen if f.event == "model_output"]
    assert output.data["body"]["text"] == whole
    assert got["errors"] == []
    ui_deltas = [c["delta"] for c in got["chunks"] if c["type"] == "text-delta"]
    assert "".join(ui_deltas) == whole and len(ui_deltas) >= 2 and _joins_of(ui_deltas, PIECES)
    assert [p["text"] for p in _parts(got["message"], "text")] == [whole]
    (run,) = agui["runs"]
    contents = [e["delta"] for e in run["events"] if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert "".join(contents) == whole and run["finished"]["result"] == whole
    assert [m["content"] for m in agui["messages"] if m["role"] == "assistant"] == [whole]
    # readUIMessageStream rendered the text growing: each snapshot a longer prefix
    grown = [t for t in got["texts"] if t]
    assert len(set(grown)) >= 2 and grown[-1] == whole
    assert all(whole.startswith(t) for t in grown)


def _joins_of(got: list[str], pieces: list[str]) -> bool:
    """Whether each of ``got`` is some consecutive ``pieces`` joined, in order."""
    n = 0
    for text in got:
        joined = ""
        while n < len(pieces) and len(joined) < len(text):
            joined += pieces[n]
            n += 1
        if joined != text:
            return False
    return n == len(pieces)


@pytest.mark.slow
async def test_use_chat_against_lodger_serve_on_an_object_store(tmp_path: Path) -> None:
    # the CLI's door (`lodger serve`, a process of its own) over `--store` (an object
    # store) rather than `--state`: the same chat, approval and continuation
    from .test_serve_tokens import _printed_token, _serve

    model = write_script(tmp_path / "s.json", DEPLOY)
    store = f"file://{tmp_path / 'objects'}"
    args = [
        "--store",
        store,
        "--model",
        model,
        "--tools",
        str(Path(__file__).parent / "host_tools.py"),
    ]
    with _serve(args, tmp_path / "out") as (proc, port):
        token = await _printed_token(proc, tmp_path / "out")
        url = f"http://127.0.0.1:{port}"
        async with HostClient(url, token=token) as c:
            sid = await c.create_session()
            config = {"url": url, "token": token, "session": sid}
            got = await _node(
                "ai_sdk_client.mjs", {**config, "mode": "chat", "text": "go", "approve": True}
            )
            assert got["errors"] == []
            (call,) = _parts(got["messages"][-1], "tool-deploy")
            assert call["state"] == "output-available" and call["output"] == "deployed web"
            assert [f["finishReason"] for f in got["finishes"]] == ["tool-calls", "stop"]
            kinds = [f.kind for f in await c.events(sid)]
            assert kinds.count("permission_decided") == 1 and kinds[-1] == "turn_ended"

"""The protocol stream routes under hostile or mistaken use, read at the wire: another
session's token, a retried message, answers to questions never asked, regenerate, a
failed turn, arguments that are not JSON, text that looks like SSE framing, a damaged
log."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx2

from ._support import Host, running_host, write_script

HOSTILE = 'line one\n\ndata: [DONE]\n\nevent: finish\r\n"quoted" </script> \u2028 end'


def _chunks(text: str) -> list[Any]:
    """The JSON of every ``data:`` line of an SSE body (``[DONE]`` as the string)."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                raw = line.removeprefix("data: ")
                out.append(raw if raw == "[DONE]" else json.loads(raw))
    return out


def _http(host: Host, token: str | None = None) -> httpx2.AsyncClient:
    auth = {"Authorization": f"Bearer {token or host.token}"}
    return httpx2.AsyncClient(base_url=host.url, headers=auth, timeout=httpx2.Timeout(60))


def _user(message_id: str, text: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


async def _post(raw: httpx2.AsyncClient, path: str, body: dict[str, Any]) -> tuple[int, str]:
    async with raw.stream("POST", path, json=body) as got:
        return got.status_code, (await got.aread()).decode()


async def test_a_retried_message_runs_once_and_streams_the_same_turn(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", [{"text": HOSTILE}])
    async with running_host(tmp_path / "state", models=(model,)) as host, _http(host) as raw:
        sid = (await raw.post("/v1/sessions", json={})).json()["session_id"]
        body = {"id": sid, "messages": [_user("m1", "hi")], "trigger": "submit-message"}
        path = f"/v1/sessions/{sid}/ai-sdk/chat"
        first = await _post(raw, path, body)
        again = await _post(raw, path, body)
        assert first[0] == again[0] == 200
        one, two = _chunks(first[1]), _chunks(again[1])
        assert one == two  # the same turn, told the same way
        assert one[-1] == "[DONE]" and one[0]["type"] == "start"
        text = "".join(c["delta"] for c in one if isinstance(c, dict) and c["type"] == "text-delta")
        assert text == HOSTILE  # framing inside text stays text
        events = (await raw.get(f"/v1/sessions/{sid}/events")).json()["events"]
        assert [e["kind"] for e in events].count("turn_started") == 1
        # the same through AG-UI: its own key space, one more turn, once
        agui = {
            "threadId": sid,
            "runId": "r",
            "messages": [{"id": "m1", "role": "user", "content": "hi"}],
        }
        for _ in range(2):
            status, text = await _post(raw, f"/v1/sessions/{sid}/ag-ui", agui)
            assert status == 200
            types = [e["type"] for e in _chunks(text)]
            assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
        events = (await raw.get(f"/v1/sessions/{sid}/events")).json()["events"]
        assert [e["kind"] for e in events].count("turn_started") == 2


async def test_requests_that_cannot_be_served_are_refused_before_any_stream(
    tmp_path: Path,
) -> None:
    model = write_script(tmp_path / "s.json", [{"text": "ok"}])
    async with running_host(tmp_path / "state", models=(model,)) as host, _http(host) as raw:
        sid = (await raw.post("/v1/sessions", json={})).json()["session_id"]
        other = (await raw.post("/v1/sessions", json={})).json()["session_id"]
        scoped = (await raw.post("/v1/tokens", json={"session_id": other})).json()["token"]
        chat = f"/v1/sessions/{sid}/ai-sdk/chat"
        cases: list[tuple[str, dict[str, Any], int, str]] = [
            (chat, {"messages": [_user("m", "x")], "trigger": "regenerate-message"}, 400, "usage"),
            (chat, {"messages": [_user("m", "  ")]}, 400, "usage"),
            (chat, {"messages": []}, 422, "invalid_request"),
            (
                chat,  # an approval response for a call that never asked
                {
                    "messages": [
                        _user("m", "x"),
                        {
                            "id": "a",
                            "role": "assistant",
                            "parts": [
                                {
                                    "type": "tool-deploy",
                                    "toolCallId": "nope",
                                    "state": "approval-responded",
                                    "approval": {"id": "nope", "approved": True},
                                }
                            ],
                        },
                    ]
                },
                404,
                "not_found",
            ),
            (
                f"/v1/sessions/{sid}/ag-ui",
                {"threadId": sid, "runId": "r", "messages": []},
                400,
                "usage",
            ),
            (
                f"/v1/sessions/{sid}/ag-ui",
                {
                    "threadId": sid,
                    "runId": "r",
                    "resume": [{"interruptId": "nope", "status": "resolved"}],
                },
                404,
                "not_found",
            ),
        ]
        for path, body, status, code in cases:
            got = await raw.post(path, json=body)
            assert (got.status_code, got.json()["error"]["code"]) == (status, code), (
                body,
                got.text,
            )
        async with _http(host, scoped) as elsewhere:  # a token of another session
            for method, path, body in (
                ("POST", chat, {"messages": [_user("m", "x")]}),
                ("POST", f"/v1/sessions/{sid}/ag-ui", {"threadId": sid, "runId": "r"}),
                ("GET", f"/v1/sessions/{sid}/ai-sdk/stream", None),
            ):
                got = await elsewhere.request(method, path, json=body)
                assert got.status_code == 403, (path, got.text)
        events = (await raw.get(f"/v1/sessions/{sid}/events")).json()["events"]
        assert events == []  # nothing above started a turn


async def test_a_failed_turn_and_a_malformed_call_reach_the_front_end(tmp_path: Path) -> None:
    # the model proposes a call whose arguments are not JSON, then the script runs out
    model = write_script(
        tmp_path / "s.json", [{"calls": [{"name": "echo", "arguments": "{not json"}]}]
    )
    async with running_host(tmp_path / "state", models=(model,)) as host, _http(host) as raw:
        sid = (await raw.post("/v1/sessions", json={})).json()["session_id"]
        status, text = await _post(
            raw, f"/v1/sessions/{sid}/ai-sdk/chat", {"messages": [_user("m1", "go")]}
        )
        assert status == 200
        chunks = [c for c in _chunks(text) if isinstance(c, dict)]
        bad = [c for c in chunks if c["type"] == "tool-input-error"]
        assert len(bad) == 1 and bad[0]["input"] == "{not json" and bad[0]["toolName"] == "echo"
        assert [c["type"] for c in chunks if c.get("toolCallId") == bad[0]["toolCallId"]] == [
            "tool-input-error",
            "tool-output-error",
        ]
        error, finish = chunks[-2], chunks[-1]
        assert error["type"] == "error" and "script" in error["errorText"]
        assert finish["type"] == "finish" and finish["finishReason"] == "error"
        assert finish["messageMetadata"]["lodger"]["status"] == "failed"
        # AG-UI: the same kind of turn ends with RUN_ERROR, and nothing after it
        body = {
            "threadId": sid,
            "runId": "r",
            "messages": [{"id": "m2", "role": "user", "content": "go"}],
        }
        status, text = await _post(raw, f"/v1/sessions/{sid}/ag-ui", body)
        events = _chunks(text)
        assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "failed"
        assert [e["type"] for e in events].count("RUN_FINISHED") == 0


async def test_a_damaged_log_ends_the_ui_stream_with_an_error(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", [{"text": "ok"}])
    state = tmp_path / "state"
    async with running_host(state, models=(model,)) as host, _http(host) as raw:
        sid = (await raw.post("/v1/sessions", json={})).json()["session_id"]
        status, _ = await _post(
            raw, f"/v1/sessions/{sid}/ai-sdk/chat", {"messages": [_user("m", "go")]}
        )
        assert status == 200
    with sqlite3.connect(state / "log.sqlite3") as db:  # changed outside lodger
        db.execute("UPDATE events SET data = replace(data, 'go', 'GO') WHERE \"offset\" = 1")
    async with running_host(state, models=(model,)) as host, _http(host) as raw:
        async with raw.stream(
            "GET", f"/v1/sessions/{sid}/ai-sdk/stream", params={"start": 0}
        ) as got:
            assert got.status_code == 200
            assert got.headers["x-vercel-ai-ui-message-stream"] == "v1"
            chunks = _chunks((await got.aread()).decode())
        assert [c if c == "[DONE]" else c["type"] for c in chunks] == [
            "start",
            "error",
            "finish",
            "[DONE]",
        ]
        assert "digest" in chunks[1]["errorText"]


async def test_a_message_queued_behind_a_turn_streams_its_own_turn(
    tmp_path: Path, gates: Path
) -> None:
    script = {
        "turns": [
            [{"calls": [{"name": "gate", "args": {"name": "q1"}}]}, {"text": "first"}],
            [{"text": "second"}],
        ]
    }
    (tmp_path / "s.json").write_text(json.dumps(script))
    model = f"script:{tmp_path / 's.json'}"
    async with running_host(tmp_path / "state", models=(model,)) as host, _http(host) as raw:
        sid = (await raw.post("/v1/sessions", json={})).json()["session_id"]
        await raw.post(f"/v1/sessions/{sid}/messages", json={"text": "one"})
        async with asyncio.timeout(30):
            while not (gates / "q1.starts").exists():  # noqa: ASYNC110 - a tool's file
                await asyncio.sleep(0.02)
        body = {"messages": [_user("m2", "two")]}
        async with raw.stream("POST", f"/v1/sessions/{sid}/ai-sdk/chat", json=body) as got:
            lines = got.aiter_lines()
            # open at once, while the message waits behind the running turn
            assert await asyncio.wait_for(anext(lines), 10) == ": lodger stream"
            (gates / "q1").touch()
            text = "\n".join([line async for line in lines])
        chunks = [c for c in _chunks(text) if isinstance(c, dict)]
        events = (await raw.get(f"/v1/sessions/{sid}/events")).json()["events"]
        turns = [e["turn_id"] for e in events if e["kind"] == "turn_started"]
        assert len(turns) == 2 and chunks[0] == {
            "type": "start",
            "messageId": turns[1],
            "messageMetadata": {"lodger": {"session_id": sid, "turn_id": turns[1]}},
        }
        deltas = [c["delta"] for c in chunks if c["type"] == "text-delta"]
        assert deltas == ["second"]

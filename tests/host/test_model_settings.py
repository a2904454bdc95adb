"""A host turn's ``model_settings`` reach the model over a real socket, are recorded
with each step, and a bad one is refused before anything is queued."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lodger.errors import LodgerError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
from wire_server import Stream, WireServer, sse

from ._support import running_host


def answer(text: str) -> Stream:
    def chunk(delta: dict[str, object], finish: str | None = None) -> tuple[str | None, str]:
        return sse(
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "gpt-test",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    return Stream([chunk({"role": "assistant", "content": text}), chunk({}, "stop"), sse("[DONE]")])


async def test_a_turns_model_settings_reach_the_request_and_step_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with WireServer() as server:
        server.push(answer("hi"))
        model = f"openai-compatible:{server.base_url}/v1#gpt-test"
        async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
            sid = await c.create_session()
            sent = await c.send(sid, "hello", model_settings={"max_tokens": 33, "seed": 2})
            done = await c.wait_message(sid, sent["message"]["id"])
            assert done["status"] == "done", done
            facts = await c.events(sid)
            with pytest.raises(
                LodgerError, match=r"model_settings\.warmth: Extra inputs are not permitted"
            ):
                await c.send(sid, "again", model_settings={"warmth": 1})
        body = server.requests[0].body
    assert body["max_tokens"] == 33
    steps = [f.data["body"] for f in facts if f.kind == "step_started"]
    assert [s["settings"] for s in steps] == [{"max_tokens": 33, "seed": 2}]


async def test_an_index_made_before_settings_gains_the_column(tmp_path: Path) -> None:
    import sqlite3

    from lodger.host import SqliteHostControl

    path = tmp_path / "host.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,"
        " key TEXT NOT NULL, kind TEXT NOT NULL, text TEXT NOT NULL, text_sha256 TEXT NOT NULL,"
        " status TEXT NOT NULL, start_offset INTEGER, result TEXT, created_us INTEGER NOT NULL,"
        " UNIQUE (session_id, key));"
    )
    old.close()
    control = SqliteHostControl(path)
    try:
        made, created = await control.submit(
            "s", key="k", kind="message", text="hi", created_us=1, settings={"seed": 1}
        )
        assert created and made.settings == {"seed": 1}
        found = await control.next_message("s")
        assert found is not None and found.settings == {"seed": 1}
    finally:
        await control.close()

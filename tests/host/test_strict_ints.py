"""Integers in request bodies are JSON numbers only: pydantic's lax mode would read
``true`` as 1 and ``"2"`` as 2, so a fork at ``true`` once made a one-event fork. Each
such body is refused with a 422 naming the field, and nothing is written; the same
request with a number is taken."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest

from ._support import running_host

LOOKALIKES: tuple[Any, ...] = (True, False, "1", "2")


async def _post(host: Any, path: str, body: dict[str, Any], method: str = "POST") -> Any:
    async with httpx2.AsyncClient(
        base_url=host.url, headers={"Authorization": f"Bearer {host.token}"}
    ) as http:
        return await http.request(method, path, json=body)


@pytest.mark.parametrize("value", LOOKALIKES)
async def test_lookalike_integers_are_refused(tmp_path: Path, value: Any) -> None:
    async with running_host(tmp_path / "state") as host, host.client() as c:
        sid = await c.create_session(session_id="s1")
        sent = await c.send(sid, "hello")
        assert (await c.wait_message(sid, sent["message"]["id"]))["status"] == "done"
        before = len(await c.events(sid))
        cases = [
            ("POST", f"/v1/sessions/{sid}/fork", {"at": value}, "at"),
            (
                "POST",
                f"/v1/sessions/{sid}/rewind",
                {"point": {"kind": "offset", "offset": value}},
                "offset",
            ),
            (
                "POST",
                f"/v1/sessions/{sid}/rewind",
                {"point": {"kind": "turn", "turn": value}},
                "turn",
            ),
            (
                "PATCH",
                f"/v1/sessions/{sid}/queue/m1",  # the body is checked before the id
                {"position": value},
                "position",
            ),
            (
                "POST",
                f"/v1/sessions/{sid}/messages",
                {"text": "x", "model_settings": {"max_tokens": value}},
                "max_tokens",
            ),
        ]
        for method, path, body, field in cases:
            answer = await _post(host, path, body, method)
            assert answer.status_code == 422, (path, body, answer.text)
            assert f"{field}:" in answer.json()["error"]["message"], answer.text
        assert len(await c.events(sid)) == before  # nothing was written
        assert await c.list_sessions() == ["s1"]  # no fork was made


async def test_numbers_are_still_taken(tmp_path: Path) -> None:
    async with running_host(tmp_path / "state") as host, host.client() as c:
        sid = await c.create_session(session_id="s1")
        sent = await c.send(sid, "hello")
        assert (await c.wait_message(sid, sent["message"]["id"]))["status"] == "done"
        forked = await _post(host, f"/v1/sessions/{sid}/fork", {"at": 1, "session_id": "f1"})
        assert forked.status_code == 201, forked.text
        assert len(await c.events("f1")) == 1
        sent = await _post(
            host, f"/v1/sessions/{sid}/messages", {"text": "x", "model_settings": {"seed": 7}}
        )
        assert sent.status_code == 202, sent.text

"""``GET /v1/sessions/{id}/replay-report`` on a real host: the report of a replay made with
the library on the host's storage, the same as the library's; a session that is no replay
is 404, and a token that does not reach the source session is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lodger.errors import HostAuthError, SessionNotFoundError
from lodger.host.auth import new_token
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.replay import replay
from lodger.runtime.sessions import Binding, Sessions

from ._support import TOOLS, running_host

pytestmark = pytest.mark.slow


def echo(text: str) -> dict[str, object]:
    return {"calls": [{"name": "echo", "args": {"text": text}}]}


async def test_the_replay_report_through_the_host(tmp_path: Path) -> None:
    model = tmp_path / "source.json"
    model.write_text(json.dumps([echo("a"), echo("b"), {"text": "source"}]))
    async with running_host(tmp_path / "state", models=(f"script:{model}",)) as host:
        async with host.client() as c:
            sid = await c.create_session(session_id="s1")
            sent = await c.send(sid, "go")
            assert (await c.wait_message(sid, sent["message"]["id"]))["status"] == "done"
            sessions: Sessions = host.app.state.host.sessions
            other = ScriptedModel([echo("a"), echo("c"), {"text": "replayed"}])
            done = await replay(
                sessions, sid, binding=Binding(model=other, tools=TOOLS), session="s1-replay"
            )
            report = await c.replay_report("s1-replay")
            assert report == json.loads(json.dumps(done.report.to_dict()))
            assert report["diverged_at"]["step"] == 2
            assert report["answers"] == [{"turn": 1, "source": "source", "replay": "replayed"}]
            assert report["answered"]["recorded"] == 1
            with pytest.raises(SessionNotFoundError, match="not a replay"):
                await c.replay_report(sid)

        # a token made for the replay alone does not reach the source it reports on
        scoped = new_token()
        await host.control.add_token(scoped, scope="session", session_id="s1-replay", label="r")
        async with host.client(scoped) as c:
            with pytest.raises(HostAuthError):
                await c.replay_report("s1-replay")

"""An MCP server's question during a hosted call waits in the host's inbox: a client
lists it and answers it (the first answer wins), a wrong form answer is refused and the
question stays open, and the password the person typed reaches the server, never the log."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from lodger.client import HostClient
from lodger.errors import HostConflictError, UsageError

from ._support import running_host, write_script

ASKING = Path(__file__).parent.parent / "mcp_servers" / "asking_server.py"
SCRIPT = [{"calls": [{"name": "ask__sign_in", "args": {}}]}, {"text": "signed in"}]


def _project(workspaces: Path, sid: str) -> None:
    workspace = workspaces / sid
    workspace.mkdir(parents=True)
    (workspace / "lodger.toml").write_text(
        "[mcp.servers.ask]\n"
        f"command = {str(sys.executable)!r}\n"
        f"args = [{str(ASKING)!r}]\n"
        "deferred = false\n"
    )


async def _open(client: HostClient, sid: str) -> list[dict[str, object]]:
    for _ in range(400):
        found = await client.elicitations(sid)
        if found:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError("no elicitation was opened")


@pytest.mark.slow
async def test_a_hosted_elicitation_is_answered_over_the_api(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", SCRIPT)
    workspaces = tmp_path / "ws"
    _project(workspaces, "s1")
    async with (
        running_host(
            tmp_path / "state", models=(model,), workspaces=workspaces, trust_projects=True
        ) as host,
        host.client() as client,
    ):
        sid = await client.create_session(session_id="s1")
        sent = await client.send(sid, "sign in", key="1")
        (question,) = await _open(client, sid)
        assert question["server"] == "ask" and question["mode"] == "form"
        assert [q["elicitation_id"] for q in await client.elicitations()] == [
            question["elicitation_id"]
        ]
        eid = str(question["elicitation_id"])
        with pytest.raises(UsageError) as wrong:
            await client.answer_elicitation(sid, eid, action="accept", content={"user": 1})
        assert wrong.value.code == "invalid_answer"
        assert await client.elicitations(sid)  # still open
        answered = await client.answer_elicitation(
            sid, eid, action="accept", content={"user": "ada", "password": "hunter2"}
        )
        assert answered["elicitation_id"] == eid
        with pytest.raises((HostConflictError, UsageError)):
            await client.answer_elicitation(sid, eid, action="decline")
        done = await client.wait_message(sid, sent["message"]["id"])
        assert done["status"] == "done"
        facts = await client.events(sid)
        (fact,) = [f for f in facts if f.kind == "elicitation_answered"]
        body = fact.data["body"]
        assert body["content"] == {"user": "ada"} and body["withheld"] == ["password"]
        assert body["by"] == "operator" and str(body["who"]).startswith("token:")
        (result,) = [f for f in facts if f.kind == "tool_responded"]
        assert "user=ada password_length=7" in result.data["body"]["content"]
        assert "hunter2" not in str([f.data for f in facts])
        assert await client.elicitations(sid) == []


EVERYTHING = (
    Path(__file__).parent.parent
    / "mcp_servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)


@pytest.mark.slow
async def test_a_hosted_turn_starts_from_a_prompt_with_a_resource(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", [{"text": "sunny"}])
    workspaces = tmp_path / "ws"
    (workspaces / "s2").mkdir(parents=True)
    (workspaces / "s2" / "lodger.toml").write_text(
        f'[mcp.servers.every]\ncommand = "node"\nargs = [{str(EVERYTHING)!r}, "stdio"]\n'
    )
    async with (
        running_host(
            tmp_path / "state", models=(model,), workspaces=workspaces, trust_projects=True
        ) as host,
        host.client() as client,
    ):
        sid = await client.create_session(session_id="s2")
        with pytest.raises(UsageError):
            await client.send(sid, "lodger-mcp/1\n{}", key="forged")
        sent = await client.send(
            sid,
            "answer in one word",
            key="1",
            prompt=("every", "args-prompt", {"city": "Paris"}),
            resources=[("every", "demo://resource/static/document/architecture.md")],
        )
        done = await client.wait_message(sid, sent["message"]["id"])
        assert done["status"] == "done", done
        facts = await client.events(sid)
        (started,) = [f for f in facts if f.kind == "turn_started"]
        text = started.data["body"]["input"]
        assert text.startswith("What's weather in Paris?\n\nanswer in one word")
        assert "[resource demo://resource/static/document/architecture.md" in text
        failing = await client.send(sid, "x", key="2", prompt=("nope", "p", {}))
        failed = await client.wait_message(sid, failing["message"]["id"])
        assert failed["status"] == "failed" and "no MCP server is named 'nope'" in str(failed)

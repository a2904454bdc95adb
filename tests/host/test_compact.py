"""``POST /v1/sessions/{id}/compact`` against a real host: the fact it returns (a summary,
or its failure), its stream and log, 409 while a turn runs or after a failure, and the
session routes' auth."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2
import pytest

from lodger.errors import HostAuthError, HostConflictError, SessionNotFoundError

from ._support import running_host, write_script

SECTIONS = ("Goal", "Progress", "Decisions", "Files touched", "Open questions", "Next step")
# the one step answers the turn and, asked again with no output of its own, writes the summary
SUMMARY = "\n".join(f"## {s}\n- said hi to the host" for s in SECTIONS)


async def test_compact_returns_the_fact_and_streams_it(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", [{"text": SUMMARY}])
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        sent = await c.send(sid, "say hi", key="k1")
        await c.wait_message(sid, sent["message"]["id"])
        before = await c.events(sid)

        async def first_new_fact() -> str:
            async for event in c.stream(sid, after=len(before) - 1):
                return event.kind
            return ""

        live = asyncio.create_task(first_new_fact())  # a stream open while it compacts
        made = await c.compact(sid, instructions="keep the greeting")
        assert await asyncio.wait_for(live, 30) == "compacted"
        assert made["compacted"] is True
        fact = made["fact"]
        assert fact["kind"] == "compacted" and fact["offset"] == made["offset"] == len(before)
        body = fact["body"]
        assert body["covers"] == {"high_water": len(before), "digest": before[-1].data["digest"]}
        assert body["summary"] == SUMMARY and body["trigger"] == "manual"
        assert body["model"] == model and body["tokens_before"] > 0
        after = await c.events(sid)
        assert [f.kind for f in after[: len(before)]] == [f.kind for f in before]  # kept
        assert after[-1].kind == "compacted" and after[-1].offset == made["offset"]
        again = await c.compact(sid)  # no body: chains the first
        assert again["fact"]["body"]["previous"] == made["offset"]
        assert (await c.show(sid))["events"] == made["offset"] + 2
        # the next turn runs on the compacted context
        next_turn = await c.send(sid, "and again", key="k2")
        done = await c.wait_message(sid, next_turn["message"]["id"])
        assert done["status"] == "done", done


async def test_a_failed_summary_is_the_fact_returned_then_409(tmp_path: Path) -> None:
    # the test model's answer has none of the required sections
    async with running_host(tmp_path / "state", models=("test",)) as host, host.client() as c:
        sid = await c.create_session()
        sent = await c.send(sid, "hello", key="k1")
        await c.wait_message(sid, sent["message"]["id"])
        failed = await c.compact(sid)
        assert failed["compacted"] is False
        body = failed["fact"]["body"]
        assert failed["fact"]["kind"] == "compaction_failed"
        assert body["fallback"] == "elision" and "required section" in body["reason"]
        with pytest.raises(HostConflictError) as refused:
            await c.compact(sid)
        assert refused.value.code == "compaction_refused"
        assert refused.value.status == 409  # type: ignore[attr-defined]


async def test_409_while_a_turn_runs(tmp_path: Path, gates: Path) -> None:
    model = write_script(
        tmp_path / "s.json",
        [{"calls": [{"name": "gate", "args": {"name": "g"}}]}, {"text": SUMMARY}],
    )
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        sent = await c.send(sid, "wait at the gate", key="k1")
        for _ in range(500):
            if (gates / "g.starts").exists():
                break
            await asyncio.sleep(0.02)
        assert (gates / "g.starts").exists()
        count = (await c.show(sid))["events"]
        with pytest.raises(HostConflictError) as busy:
            await c.compact(sid)
        assert busy.value.code == "session_busy"
        assert busy.value.status == 409  # type: ignore[attr-defined]
        assert (await c.show(sid))["events"] == count  # nothing was written
        (gates / "g").touch()
        done = await c.wait_message(sid, sent["message"]["id"])
        assert done["status"] == "done"
        made = await c.compact(sid)  # once the turn has ended, it goes ahead
        assert made["offset"] == (await c.show(sid))["events"] - 1


async def test_auth_and_unknown_sessions(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", [{"text": SUMMARY}])
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        other = await c.create_session()
        sent = await c.send(sid, "say hi", key="k1")
        await c.wait_message(sid, sent["message"]["id"])
        scoped = await c.make_token(session_id=other)
        async with host.client(scoped) as narrow:
            with pytest.raises(HostAuthError):
                await narrow.compact(sid)
        with pytest.raises(SessionNotFoundError):
            await c.compact("no-such-session")
        async with httpx2.AsyncClient(base_url=host.url) as raw:
            anonymous = await raw.post(f"/v1/sessions/{sid}/compact", json={})
            assert anonymous.status_code == 401
            auth = {"Authorization": f"Bearer {host.token}"}
            extra = await raw.post(f"/v1/sessions/{sid}/compact", json={"x": 1}, headers=auth)
            assert extra.status_code == 422
        assert [f.kind for f in await c.events(sid)][-1] == "turn_ended"  # nothing written


def test_the_library_the_cli_and_the_host_record_the_same_fact(tmp_path: Path) -> None:
    """DESIGN.md section 12: one session, compacted through each door on its own copy of
    the same state directory, gets the same ``compacted`` body (the covered prefix, the
    summary, what was dropped and pinned, the token estimates, the model)."""
    import json
    import shutil

    from click.testing import CliRunner

    from lodger.cli import main
    from lodger.runtime.composition import Overrides, compose
    from lodger.runtime.project import Project
    from lodger.runtime.sessions import Sessions
    from lodger.storage import Storage

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("the launch code is Z-42\n" * 50)
    run = tmp_path / "run.json"
    run.write_text(json.dumps([{"calls": [{"name": "read_file", "args": {"path": "notes.txt"}}]},
                               {"text": "read them"}]))  # fmt: skip
    summary = write_script(tmp_path / "summary.json", [{"text": SUMMARY}])
    first = tmp_path / "first"
    args = ["run", "read the notes", "--model", f"script:{run}", "--workspace", str(ws)]
    ran = CliRunner().invoke(main, [*args, "--session", "s1", "--state", str(first)])
    assert ran.exit_code == 0, ran.output
    copies = {door: tmp_path / door for door in ("library", "cli", "host")}
    for copy in copies.values():
        shutil.copytree(first, copy)

    async def library() -> dict[str, object]:
        async with Sessions(Storage.local(copies["library"])) as sessions:
            binding = compose(Project.none(), Overrides(model=summary, builtin_tools=False))
            made = await sessions.compact("s1", binding=binding)
            return made.model_dump(mode="json")

    async def host() -> dict[str, object]:
        async with running_host(copies["host"], models=(summary,)) as h, h.client() as c:
            made = await c.compact("s1")
            assert made["compacted"] is True
            return dict(made["fact"]["body"])

    by_cli = CliRunner().invoke(
        main, ["compact", "s1", "--state", str(copies["cli"]), "--model", summary, "--json"]
    )
    assert by_cli.exit_code == 0, by_cli.output
    facts = {
        "library": asyncio.run(library()),
        "cli": json.loads(by_cli.stdout)["compacted"],
        "host": asyncio.run(host()),
    }
    assert facts["library"]["summary"] == SUMMARY and facts["library"]["dropped_call_ids"]
    assert facts["cli"] == facts["library"]
    assert facts["host"] == facts["library"]

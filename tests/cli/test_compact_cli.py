"""``lodger compact`` as a user runs it: on a SQLite state directory and on an object
store, its report and JSON, and one clear line for each way it is refused."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner, Result

from lodger.cli import main
from lodger.events import EventDraft, SessionStarted
from lodger.runtime.sessions import Sessions
from lodger.storage import EventLog, SqliteLogStore, Storage

RUN = [
    {"calls": [{"name": "read_file", "args": {"path": "notes.txt"}}]},
    {"text": "the notes say hello"},
]
SECTIONS = ("Goal", "Progress", "Decisions", "Files touched", "Open questions", "Next step")
SUMMARY = "\n".join(f"## {s}\n- the notes hold the launch code Z-42" for s in SECTIONS)
NOTES = "launch code Z-42\n" + "padding line\n" * 200


def invoke(*args: str | Path, env: dict[str, str | None] | None = None) -> Result:
    runner = CliRunner(env={"LODGER_STATE": None, "LODGER_STORE": None, **(env or {})})
    return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)


def scripts(tmp_path: Path) -> tuple[Path, Path, Path]:
    run, good, bad = tmp_path / "run.json", tmp_path / "summary.json", tmp_path / "bad.json"
    run.write_text(json.dumps(RUN))
    good.write_text(json.dumps([{"text": SUMMARY}]))
    bad.write_text(json.dumps([{"text": "a summary without any headings"}]))
    return run, good, bad


def run_turn(tmp_path: Path, *where: str | Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "notes.txt").write_text(NOTES)
    run, _, _ = scripts(tmp_path)
    args = ("run", "read the notes", "--model", f"script:{run}", "--workspace", ws)
    result = invoke(*args, "--session", "s1", *where)
    assert result.exit_code == 0, result.output


def projected(storage: Storage) -> str:
    async def read() -> str:
        async with Sessions(storage) as sessions:
            state = await sessions.state("s1")
            messages = state.projector.project().messages
            return "\n".join(getattr(m, "text", "") or getattr(m, "content", "") for m in messages)

    return asyncio.run(read())


def test_compact_reports_what_it_covered_and_the_next_request_uses_the_summary(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    run_turn(tmp_path, "--state", state)
    _, good, _ = scripts(tmp_path)
    before = projected(Storage.local(state))
    assert "padding line" in before  # the read_file result is in the context
    result = invoke("compact", "s1", "--state", state, "--model", f"script:{good}")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("compacted s1 at offset ")
    assert "covers events [0, " in lines[0]
    assert "fewer)" in lines[1] and lines[1].startswith("  tokens: ~")
    assert "dropped: 1 tool result, " in lines[2]
    assert f"summary by script:{good}" in result.stdout
    after = projected(Storage.local(state))
    assert "launch code Z-42" in after and "padding line" not in after
    shown = invoke("log", "show", "s1", "--state", state)
    assert "compacted" in shown.stdout and "dropped 1 call" in shown.stdout
    verified = invoke("log", "verify", "s1", "--state", state)
    assert verified.exit_code == 0 and verified.output.startswith("ok: session")


def test_compact_json_and_an_object_store(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'objects'}"
    unused = tmp_path / "unused"
    run_turn(tmp_path, "--store", url, "--state", unused)
    _, good, _ = scripts(tmp_path)
    result = invoke(
        "compact", "s1", "--store", url, "--state", unused, "--json", "--model", f"script:{good}"
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["v"] == 1 and doc["session_id"] == "s1"
    made = doc["compacted"]
    assert made["kind"] == "compacted" and made["trigger"] == "manual"
    assert made["covers"]["high_water"] == doc["offset"]
    assert made["summary"] == SUMMARY and len(made["dropped_call_ids"]) == 1
    assert made["tokens_after"] < made["tokens_before"]
    assert not unused.exists()  # everything went to the store
    again = invoke("compact", "s1", "--store", url, "--model", f"script:{good}")
    assert again.exit_code == 0, again.output
    assert f"chains the compaction at offset {doc['offset']}" in again.stdout
    assert invoke("log", "verify", "s1", "--store", url).exit_code == 0


def test_a_failed_summary_is_one_line_and_a_fact(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run_turn(tmp_path, "--state", state)
    _, _, bad = scripts(tmp_path)
    failed = invoke("compact", "s1", "--state", state, "--model", f"script:{bad}")
    assert failed.exit_code == 1
    assert failed.stderr.startswith("error: session 's1' was not compacted: the summary lacks")
    assert "Traceback" not in failed.output
    shown = invoke("log", "show", "s1", "--state", state)
    assert "compaction failed" in shown.stdout and "fallback=elision" in shown.stdout
    # the same prefix would fail the same way: refused until something is appended
    again = invoke("compact", "s1", "--state", state, "--model", f"script:{bad}")
    assert again.exit_code == 2
    assert "cannot be compacted now" in again.stderr


def test_unknown_and_running_sessions_are_refused(tmp_path: Path, state_dir: Path) -> None:
    _, good, _ = scripts(tmp_path)
    model = f"script:{good}"
    unknown = invoke("compact", "nope", "--state", state_dir, "--model", model)
    assert unknown.exit_code == 4
    assert unknown.stderr.startswith("error: no log for session 'nope'")
    missing = invoke("compact", "s1", "--state", tmp_path / "nowhere", "--model", model)
    assert missing.exit_code == 4 and not (tmp_path / "nowhere").exists()
    # s-crash's run was interrupted after a T1: it is resumed or abandoned first
    running = invoke("compact", "s-crash", "--state", state_dir, "--model", model)
    assert running.exit_code == 2, running.output
    assert "has a run in progress" in running.stderr
    assert f"next: lodger resume s-crash --state {state_dir}" in running.stderr


def test_a_session_that_never_ran_a_model_needs_one(tmp_path: Path) -> None:
    state = tmp_path / "state"

    async def write() -> None:
        log = EventLog(SqliteLogStore(state))
        try:
            async with await log.open_writer("s0") as writer:
                draft = EventDraft(id="e0", ts=1_700_000_000_000_000, body=SessionStarted())
                await writer.append([draft], expected_offset=0)
        finally:
            await log.close()

    asyncio.run(write())
    result = invoke("compact", "s0", "--state", state)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: no model to write the summary with")
    assert "hint: pass --model SPEC" in result.stderr


def test_a_session_a_worker_runs_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    from lodger.storage.control import SqliteControlPlane

    state = tmp_path / "state"
    run_turn(tmp_path, "--state", state)
    _, good, _ = scripts(tmp_path)
    plane_file = tmp_path / "plane.sqlite3"

    async def hold() -> None:
        plane = SqliteControlPlane(plane_file)
        await plane.start()
        try:
            assert await plane.acquire_session(session_id="s1", holder="worker", ttl_s=600)
        finally:
            await plane.close()

    asyncio.run(hold())
    before = invoke("log", "verify", "s1", "--state", state).output
    args = ("compact", "s1", "--state", state, "--control", plane_file)
    result = invoke(*args, "--model", f"script:{good}")
    assert result.exit_code == 1
    assert "running in a worker" in result.stderr and "nothing was written" in result.stderr
    assert invoke("log", "verify", "s1", "--state", state).output == before


def test_the_workspaces_compaction_table_is_the_policy(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run_turn(tmp_path, "--state", state)
    goal_only = tmp_path / "goal.json"
    goal_only.write_text(json.dumps([{"text": "## Goal\n- read the notes"}]))
    model = f"script:{goal_only}"
    # the default sections are required: a summary with only a goal is not enough
    refused = invoke("compact", "s1", "--state", state, "--model", model)
    assert refused.exit_code == 1 and "lacks the required section(s): Progress" in refused.stderr
    again = invoke("run", "and again", "--session", "s1", "--state", state, "--model",
                   f"script:{tmp_path / 'run.json'}", "--workspace", tmp_path / "ws")  # fmt: skip
    assert again.exit_code == 0, again.output  # appended: the failed prefix is behind
    (tmp_path / "ws" / "lodger.toml").write_text('[compaction]\nrequired_sections = ["Goal"]\n')
    made = invoke("compact", "s1", "--state", state, "--model", model, "--json")
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout)["compacted"]["summary"] == "## Goal\n- read the notes"


HOLDER = """
import asyncio, sys
from pathlib import Path
from lodger.storage import EventLog, SqliteLogStore

async def main():
    log = EventLog(SqliteLogStore(sys.argv[1]))
    writer = await log.open_writer("s1")
    Path(sys.argv[2]).write_text("holding")
    await asyncio.sleep(120)

asyncio.run(main())
"""


def test_a_session_another_process_writes_is_refused(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    state = tmp_path / "state"
    run_turn(tmp_path, "--state", state)
    _, good, _ = scripts(tmp_path)
    marker = tmp_path / "holding"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(state), str(marker)])
    try:
        for _ in range(600):
            if marker.exists() or holder.poll() is not None:
                break
            time.sleep(0.05)
        assert marker.exists(), "the holder never took the session"
        result = invoke("compact", "s1", "--state", state, "--model", f"script:{good}")
        assert result.exit_code == 1
        assert result.stderr.startswith(f"error: session 's1' is being written by pid {holder.pid}")
    finally:
        holder.kill()
        holder.wait(timeout=30)
    shown = invoke("log", "show", "s1", "--state", state)
    assert "compacted" not in shown.stdout  # nothing was written


def test_a_trusted_projects_compaction_model_writes_the_summary(tmp_path: Path) -> None:
    state, ws = tmp_path / "state", tmp_path / "ws"
    ws.mkdir()
    _, good, _ = scripts(tmp_path)
    (ws / "lodger.toml").write_text(f'[compaction]\nmodel = "script:{good}"\n')

    async def write() -> None:  # a session that never ran a model, in that workspace
        log = EventLog(SqliteLogStore(state))
        try:
            async with await log.open_writer("s0") as writer:
                body = SessionStarted(workspace=str(ws))
                draft = EventDraft(id="e0", ts=1_700_000_000_000_000, body=body)
                await writer.append([draft], expected_offset=0)
        finally:
            await log.close()

    asyncio.run(write())
    untrusted = invoke("compact", "s0", "--state", state)
    assert untrusted.exit_code == 2, untrusted.output  # an untrusted file names no model
    assert "no model to write the summary with" in untrusted.stderr
    trusted = invoke("compact", "s0", "--state", state, "--trust", "--json")
    assert trusted.exit_code == 0, trusted.output
    made = json.loads(trusted.stdout)["compacted"]
    assert made["model"] == f"script:{good}" and made["summary"] == SUMMARY

"""``lodger resume`` on a session long enough to take the bulk read path.

A few thousand events put every stage of opening a session past its bulk thresholds:
decoding on a worker thread (>= 1,000 records), the cycle collector paused while the
log is read, folded and projected (>= 2,000 items) and the survivors moved to the oldest
generation afterwards. Resuming must still do exactly what it does on a short log, and a
damaged log must still fail closed before anything is appended: an edited byte in the
middle, a truncated tail, a deleted head file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from lodger.cli import main
from lodger.events import (
    EventDraft,
    ModelOutput,
    ProposedCall,
    RunEnded,
    RunStarted,
    SessionStarted,
    StepStarted,
    ToolDispatched,
    ToolRef,
    ToolResponded,
    TurnEnded,
    TurnStarted,
)
from lodger.storage import EventLog, SqliteLogStore
from lodger.tools.workspace import workspace_id

SESSION = "s-long"
EVENTS = 3_000  # past _DECODE_ON_LOOP (1,000) and the collector's threshold (2,000)
SCRIPT = [{"calls": [{"name": "read_file", "args": {"path": "notes.txt"}}]}, {"text": "done"}]
TOOLS = (ToolRef(name="read_file", schema_digest="sha256-read_file"),)


def history(workspace: Path, model: str) -> list[EventDraft]:
    """Completed turns of two-call steps, then a turn interrupted between T1 and T2."""
    drafts: list[EventDraft] = []

    def add(body: object, **env: str) -> None:
        n = len(drafts)
        drafts.append(EventDraft(id=f"e{n}", ts=1_700_000_000_000_000 + n, body=body, **env))  # type: ignore[arg-type]

    add(SessionStarted(workspace=str(workspace), workspace_id=workspace_id(workspace)))
    turn = 0
    while len(drafts) < EVENTS - 20:
        turn += 1
        t, r = f"t{turn}", f"r{turn}"
        add(TurnStarted(input=f"task {turn}"), turn_id=t)
        add(RunStarted(model=model), turn_id=t, run_id=r)
        for step in range(3):
            s = f"{r}s{step}"
            calls = tuple(
                ProposedCall(call_id=f"{s}c{k}", name="read_file", arguments='{"path": "a"}')
                for k in range(2)
            )
            add(StepStarted(index=step, model=model, tools=TOOLS), turn_id=t, run_id=r, step_id=s)
            add(ModelOutput(text=f"step {step}", calls=calls), turn_id=t, run_id=r, step_id=s)
            for call in calls:
                env = {"turn_id": t, "run_id": r, "step_id": s, "call_id": call.call_id}
                op = f"op-{call.call_id}"
                add(
                    ToolDispatched(operation_id=op, tool="read_file", arguments={"path": "a"}),
                    **env,
                )
                add(ToolResponded(operation_id=op, status="ok", content=f"line {turn}"), **env)
        add(RunEnded(status="completed"), turn_id=t, run_id=r)
        add(TurnEnded(status="completed", answer="ok"), turn_id=t)
    t, r, s = "t-last", "r-last", "r-last-s0"
    call = ProposedCall(call_id="call-0-1", name="read_file", arguments='{"path": "notes.txt"}')
    add(TurnStarted(input="read the notes"), turn_id=t)
    add(RunStarted(model=model), turn_id=t, run_id=r)
    add(StepStarted(index=0, model=model, tools=TOOLS), turn_id=t, run_id=r, step_id=s)
    add(ModelOutput(calls=(call,)), turn_id=t, run_id=r, step_id=s)
    add(
        ToolDispatched(
            operation_id="op-last",
            tool="read_file",
            arguments={"path": "notes.txt"},
            recovery="idempotent",
        ),
        turn_id=t,
        run_id=r,
        step_id=s,
        call_id=call.call_id,
    )
    return drafts


async def build(state: Path, drafts: list[EventDraft]) -> None:
    log = EventLog(SqliteLogStore(state))
    try:
        async with await log.open_writer(SESSION) as writer:
            for i in range(0, len(drafts), 1_000):
                await writer.append(drafts[i : i + 1_000], expected_offset=i)
    finally:
        await log.close()


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state directory built once; each test works on its own copy."""
    root = tmp_path_factory.mktemp("long")
    workspace = root / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("remember the milk\n")
    script = root / "script.json"
    script.write_text(json.dumps(SCRIPT))
    asyncio.run(build(root / "state", history(workspace, f"script:{script}")))
    return root


@pytest.fixture
def copy(golden: Path, tmp_path: Path) -> Path:
    shutil.copytree(golden / "state", tmp_path / "state")
    return tmp_path / "state"


def resume(golden: Path, state: Path) -> Result:
    runner = CliRunner(env={"NO_COLOR": "1", "LODGER_STATE": None, "LODGER_DEBUG": None})
    args = ["resume", SESSION, "--model", f"script:{golden / 'script.json'}"]
    args += ["--workspace", str(golden / "ws"), "--state", str(state)]
    return runner.invoke(main, args)


def rows(state: Path) -> list[tuple[int, bytes]]:
    with contextlib.closing(sqlite3.connect(state / "log.sqlite3")) as conn:
        found = conn.execute(
            'SELECT "offset", data FROM events WHERE session_id = ? ORDER BY "offset"',
            (SESSION,),
        ).fetchall()
    return [(int(o), bytes(d)) for o, d in found]


def kind(data: bytes) -> str:
    return str(json.loads(data)["body"]["kind"])


def test_resume_finishes_the_interrupted_turn(golden: Path, copy: Path) -> None:
    before = rows(copy)
    assert len(before) >= EVENTS - 20

    result = resume(golden, copy)

    assert result.exit_code == 0, result.output
    after = rows(copy)
    assert after[: len(before)] == before  # history untouched
    new = [json.loads(data) for _, data in after[len(before) :]]
    kinds = [e["body"]["kind"] for e in new]
    # a new run re-dispatches the idempotent call under a linked T1, answers, ends the turn
    assert kinds[0] == "run_started"
    dispatched = [e["body"] for e in new if e["body"]["kind"] == "tool_dispatched"]
    assert [(d["tool"], d["retry_of"]) for d in dispatched] == [("read_file", "op-last")]
    responded = [e["body"] for e in new if e["body"]["kind"] == "tool_responded"]
    assert "remember the milk" in responded[0]["content"]
    assert kinds[-1] == "turn_ended" and new[-1]["body"]["status"] == "completed"


def tamper(state: Path, offset: int) -> bytes:
    """Change one character of a stored event behind lodger's back, keeping it JSON."""
    with contextlib.closing(sqlite3.connect(state / "log.sqlite3")) as conn, conn:
        where = 'WHERE session_id = ? AND "offset" = ?'
        (data,) = conn.execute(f"SELECT data FROM events {where}", (SESSION, offset)).fetchone()
        changed = bytes(data).replace(b"line ", b"lime ", 1)
        assert changed != data
        conn.execute(f"UPDATE events SET data = ? {where}", (changed, SESSION, offset))
    return changed


def test_an_edited_byte_in_the_middle_fails_closed(golden: Path, copy: Path) -> None:
    before = rows(copy)
    middle = next(o for o, data in before[len(before) // 2 :] if kind(data) == "tool_responded")
    tamper(copy, middle)
    edited = rows(copy)

    result = resume(golden, copy)

    assert result.exit_code != 0
    assert f"offset {middle}" in result.output
    assert "digest does not match its bytes" in result.output
    assert rows(copy) == edited  # nothing appended


def test_a_truncated_tail_fails_closed(golden: Path, copy: Path) -> None:
    before = rows(copy)
    cut = len(before) - 3
    with contextlib.closing(sqlite3.connect(copy / "log.sqlite3")) as conn, conn:
        conn.execute('DELETE FROM events WHERE session_id = ? AND "offset" >= ?', (SESSION, cut))

    result = resume(golden, copy)

    assert result.exit_code != 0
    assert f"offset {cut}" in result.output
    assert "lost or rolled back" in result.output
    assert rows(copy) == before[:cut]  # nothing appended


def test_a_deleted_head_file_fails_closed(golden: Path, copy: Path) -> None:
    before = rows(copy)
    heads = list((copy / "heads").glob("*.head"))
    assert len(heads) == 1
    heads[0].unlink()

    result = resume(golden, copy)

    assert result.exit_code != 0
    assert "head record" in result.output and "missing" in result.output
    assert rows(copy) == before

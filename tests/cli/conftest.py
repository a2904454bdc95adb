"""Realistic sessions for the CLI tests, written through the real SQLite event log.

Tests get everything through fixtures (never ``from conftest import``): with other test
folders growing their own conftest modules, an import by that name is ambiguous.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from lodger.events import (
    Body,
    CallRejected,
    Event,
    EventDraft,
    ModelOutput,
    ProposedCall,
    ResultStatus,
    RunEnded,
    RunStarted,
    SessionStarted,
    StepStarted,
    ToolDispatched,
    ToolRef,
    ToolResponded,
    TurnEnded,
    TurnStarted,
    Usage,
    seal,
)
from lodger.storage import EventLog, SqliteLogStore

T0 = 1_700_000_000_000_000  # microseconds since the epoch
DEMO = "s-demo"
CRASHED = "s-crash"


class _Drafts:
    """Builds drafts with readable ids; ``at`` is milliseconds after ``T0``."""

    def __init__(self) -> None:
        self.drafts: list[EventDraft] = []

    def add(self, at: int, body: Body, **envelope: str | None) -> None:
        self.drafts.append(
            EventDraft(id=f"e{len(self.drafts):03d}", ts=T0 + at * 1000, body=body, **envelope)
        )


def _tools(*names: str) -> tuple[ToolRef, ...]:
    return tuple(ToolRef(name=name, schema_digest=f"sha-{name}") for name in names)


def _dispatch(op: str, tool: str, **arguments: str) -> ToolDispatched:
    return ToolDispatched(operation_id=op, tool=tool, arguments=dict(arguments))


def _respond(op: str, status: ResultStatus, content: str) -> ToolResponded:
    return ToolResponded(operation_id=op, status=status, content=content)


def demo_drafts() -> list[EventDraft]:
    """One finished turn: two overlapping reads, a rejected write, a code cell with a
    nested hidden call, then the answer. The offset of each event is in its comment."""
    d = _Drafts()
    turn = {"turn_id": "t1"}
    run = {**turn, "run_id": "r1"}
    step0 = {**run, "step_id": "st0"}
    step1 = {**run, "step_id": "st1"}
    step2 = {**run, "step_id": "st2"}
    nested = {**step1, "call_id": "n1", "parent_call_id": "c4"}
    hidden = {"origin": "code_mode", "visibility": "hidden"}
    tools = _tools("read_file", "exec")
    reads = (
        ProposedCall(call_id="c1", name="read_file", arguments='{"path": "a.txt"}'),
        ProposedCall(call_id="c2", name="read_file", arguments='{"path": "b.txt"}'),
    )
    cell = ProposedCall(call_id="c4", name="exec", arguments='{"code": "await tools.read()"}')
    write = ProposedCall(call_id="c3", name="write_file", arguments='{"path": "a.txt"}')
    rejected = CallRejected(tool="write_file", reason="invisible", message="not visible")
    usage = Usage(input_tokens=120, output_tokens=30)

    d.add(0, SessionStarted(workspace="/projects/demo"))  # 0
    d.add(10, TurnStarted(input="fix the failing test in [tests]"), **turn)  # 1
    d.add(20, RunStarted(model="scripted:demo", tools=("read_file", "exec")), **run)  # 2
    d.add(30, StepStarted(index=0, model="scripted:demo", tools=tools), **step0)  # 3
    output = ModelOutput(text="Reading both.", reasoning="need a and b", calls=reads, usage=usage)
    d.add(40, output, **step0)  # 4
    # c1 and c2 overlap: c1 runs 100 -> 400 ms, c2 runs 110 -> 150 ms.
    d.add(100, _dispatch("op1", "read_file", path="a.txt"), **step0, call_id="c1")  # 5
    d.add(110, _dispatch("op2", "read_file", path="b.txt"), **step0, call_id="c2")  # 6
    d.add(150, _respond("op2", "ok", "bravo contents"), **step0, call_id="c2")  # 7
    d.add(400, _respond("op1", "ok", "alpha contents"), **step0, call_id="c1")  # 8
    d.add(500, StepStarted(index=1, model="scripted:demo", tools=tools), **step1)  # 9
    d.add(510, ModelOutput(text="Write, then check.", calls=(write, cell)), **step1)  # 10
    d.add(520, rejected, **step1, call_id="c3")  # 11
    d.add(530, _dispatch("op4", "exec", code="..."), **step1, call_id="c4")  # 12
    d.add(540, _dispatch("op5", "read_file", path="c.txt"), **nested, **hidden)  # 13
    d.add(560, _respond("op5", "error", "c.txt: no such file"), **nested, **hidden)  # 14
    d.add(600, _respond("op4", "ok", '{"missing": "c.txt"}'), **step1, call_id="c4")  # 15
    d.add(700, StepStarted(index=2, model="scripted:demo", tools=tools), **step2)  # 16
    d.add(710, ModelOutput(text="c.txt is missing.", finish_reason="stop"), **step2)  # 17
    d.add(720, RunEnded(status="completed"), **run)  # 18
    d.add(730, TurnEnded(status="completed", answer="c.txt is missing."), **turn)  # 19
    return d.drafts


def crashed_drafts() -> list[EventDraft]:
    """A turn killed after T1 of its only call: no T2, no run_ended, no turn_ended."""
    d = _Drafts()
    step = {"turn_id": "t1", "run_id": "r1", "step_id": "st0"}
    call = ProposedCall(call_id="c1", name="shell", arguments='{"cmd": "pytest"}')
    d.add(0, SessionStarted(workspace="/projects/crash"))
    d.add(10, TurnStarted(input="run the tests"), turn_id="t1")
    d.add(20, RunStarted(model="scripted:demo"), turn_id="t1", run_id="r1")
    d.add(30, StepStarted(index=0, model="scripted:demo", tools=_tools("shell")), **step)
    d.add(40, ModelOutput(calls=(call,)), **step)
    d.add(50, _dispatch("op1", "shell", cmd="pytest"), **step, call_id="c1")
    return d.drafts


def sealed(session_id: str, drafts: list[EventDraft]) -> list[Event]:
    """The events ``drafts`` become when appended at offset 0, without any storage."""
    events: list[Event] = []
    prev = ""
    for offset, draft in enumerate(drafts):
        event, _ = seal(draft, session_id=session_id, offset=offset, prev_digest=prev)
        events.append(event)
        prev = event.digest
    return events


async def _write(state: Path, sessions: dict[str, list[EventDraft]]) -> None:
    log = EventLog(SqliteLogStore(state))
    try:
        for session_id, drafts in sessions.items():
            async with await log.open_writer(session_id) as writer:
                # Two appends, as a runtime would: the first batch, then the rest.
                await writer.append(drafts[:3], expected_offset=0)
                await writer.append(drafts[3:], expected_offset=3)
    finally:
        await log.close()


@pytest.fixture
def demo_events() -> list[Event]:
    """Session ``s-demo``: 20 events, one completed turn (offsets in ``demo_drafts``)."""
    return sealed(DEMO, demo_drafts())


@pytest.fixture
def crashed_events() -> list[Event]:
    """Session ``s-crash``: 6 events, a turn interrupted after T1 of call ``c1``."""
    return sealed(CRASHED, crashed_drafts())


@pytest.fixture(name="demo_drafts")
def demo_drafts_fixture() -> list[EventDraft]:
    return demo_drafts()


@pytest.fixture(name="crashed_drafts")
def crashed_drafts_fixture() -> list[EventDraft]:
    return crashed_drafts()


@pytest.fixture(name="sealed")
def sealed_fixture() -> Callable[[str, list[EventDraft]], list[Event]]:
    return sealed


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """A real SQLite state directory holding the demo and the crashed session."""
    state = tmp_path / "state"
    asyncio.run(_write(state, {DEMO: demo_drafts(), CRASHED: crashed_drafts()}))
    return state

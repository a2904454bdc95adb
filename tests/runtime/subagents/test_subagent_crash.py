"""SIGKILL of a real parent process around a delegation, then resume in this process.

Between the parent's T1 and T2 with the child finished: resume takes the child's answer
from its log and runs nothing again. With the child mid-turn: resume resumes the child
(one new run of its open turn, never a second child or a second turn), and every effect,
counted in a file outside the log, happened once.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from subagent_world import crash_agent

from lodger.cli import main
from lodger.errors import ResumeBlockedError
from lodger.events import (
    Event,
    RecoveryDecided,
    RecoveryObserved,
    RunStarted,
    ToolDispatched,
    ToolResponded,
    TurnStarted,
)
from lodger.runtime.subagents import child_session_id, link_of
from lodger.storage import open_log

WORLD = Path(__file__).with_name("subagent_world.py")


def _crash(tmp_path: Path, mode: str) -> Path:
    state = tmp_path / "state"
    (tmp_path / "ws").mkdir()
    proc = subprocess.run(
        [sys.executable, str(WORLD), str(state), mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return state


def _delegate_call(events: list[Event]) -> str:
    (t1,) = [e for e in events if isinstance(e.body, ToolDispatched)]
    assert isinstance(t1.body, ToolDispatched) and t1.body.tool == "delegate"
    assert t1.call_id is not None
    return t1.call_id


async def _resume(tmp_path: Path, state: Path) -> tuple[list[Event], list[Event], str]:
    effects = tmp_path / "effects.txt"
    async with crash_agent(state, tmp_path / "ws", effects, "none") as agent:
        before = await agent.log.read_all("parent-1")
        call_id = _delegate_call(before)
        assert not any(isinstance(e.body, ToolResponded) for e in before)  # killed before T2
        result = await agent.resume("parent-1")
        assert result.status == "completed", result.error
        assert result.answer == "parent done"
        parent = await agent.log.read_all("parent-1")
        child_id = child_session_id("parent-1", call_id)
        child = await agent.log.read_all(child_id)
        await agent.log.verify("parent-1")
        await agent.log.verify(child_id)
        assert sorted(await agent.log.list_sessions()) == sorted(["parent-1", child_id])
    return parent, child, call_id


def _observed(parent: list[Event], call_id: str) -> dict[str, object]:
    (seen,) = [
        e.body for e in parent if isinstance(e.body, RecoveryObserved) and e.call_id == call_id
    ]
    assert seen.status == "completed" and seen.reason == "probe_applied"
    result: dict[str, object] = json.loads(seen.observation)
    return result


@pytest.mark.slow
async def test_parent_killed_between_t1_and_t2_takes_the_finished_childs_answer(
    tmp_path: Path,
) -> None:
    state = _crash(tmp_path, "after_child")
    # the child finished in the killed process: its turn ended, its effect happened
    log = open_log(state)
    try:
        child_events_before = None
        for sid in await log.list_sessions():
            if sid != "parent-1":
                child_events_before = await log.read_all(sid)
    finally:
        await log.close()
    assert child_events_before is not None
    assert child_events_before[-1].kind == "turn_ended"
    assert (tmp_path / "effects.txt").read_text() == "1\n"

    parent, child, call_id = await _resume(tmp_path, state)
    assert [e.digest for e in child] == [e.digest for e in child_events_before]  # untouched
    result = _observed(parent, call_id)
    assert result["status"] == "completed"
    assert result["answer"] == "child answer: effect 1 is done"
    assert (tmp_path / "effects.txt").read_text() == "1\n"  # nothing ran twice
    assert sum(isinstance(e.body, ToolDispatched) for e in parent) == 1


@pytest.mark.slow
async def test_parent_killed_with_the_child_mid_turn_resumes_the_child_once(
    tmp_path: Path,
) -> None:
    state = _crash(tmp_path, "child_midturn")
    assert (tmp_path / "effects.txt").read_text() == "1\n"

    parent, child, call_id = await _resume(tmp_path, state)
    # one turn, two runs: the second resumes the first's prefix; the effect call was not
    # dispatched again
    assert sum(isinstance(e.body, TurnStarted) for e in child) == 1
    runs = [e.body for e in child if isinstance(e.body, RunStarted)]
    assert len(runs) == 2
    assert runs[0].resumed_from is None and runs[1].resumed_from is not None
    assert sum(isinstance(e.body, ToolDispatched) for e in child) == 1
    assert child[-1].kind == "turn_ended"
    result = _observed(parent, call_id)
    assert result["answer"] == "child answer: effect 1 is done"
    assert (tmp_path / "effects.txt").read_text() == "1\n"

    # resuming the parent again finds nothing to do (its turn ended): no third run
    async with crash_agent(state, tmp_path / "ws", tmp_path / "effects.txt", "none") as agent:
        again = await agent.log.read_all(child[0].session_id)
    assert len(again) == len(child)


@pytest.mark.slow
async def test_parent_killed_before_the_child_started_is_not_applied(tmp_path: Path) -> None:
    state = _crash(tmp_path, "before_child")
    effects = tmp_path / "effects.txt"
    shown = await asyncio.to_thread(
        CliRunner().invoke, main, ["log", "show", "parent-1", "--state", str(state)]
    )
    assert shown.exit_code == 0, shown.output
    assert "never started" in shown.output
    async with crash_agent(state, tmp_path / "ws", effects, "none") as agent:
        assert await agent.log.list_sessions() == ["parent-1"]  # no child was written
        call_id = _delegate_call(await agent.log.read_all("parent-1"))
        result = await agent.resume("parent-1")
        assert result.status == "completed" and result.answer == "parent done"
        parent = await agent.log.read_all("parent-1")
        (seen,) = [
            e.body for e in parent if isinstance(e.body, RecoveryObserved) and e.call_id == call_id
        ]
        assert seen.status == "not_applied" and seen.reason == "probe_not_applied"
        assert "never started" in seen.observation
        assert await agent.log.list_sessions() == ["parent-1"]  # recovery started none
    assert not effects.exists()


@pytest.mark.slow
async def test_a_grandchild_mid_turn_is_resumed_through_its_parent(tmp_path: Path) -> None:
    state = _crash(tmp_path, "grandchild_midturn")
    effects = tmp_path / "effects.txt"
    assert effects.read_text() == "1\n"
    async with crash_agent(state, tmp_path / "ws", effects, "nested") as agent:
        result = await agent.resume("parent-1")
        assert result.status == "completed" and result.answer == "parent done"
        sessions = await agent.log.list_sessions()
        assert len(sessions) == 3  # parent, middle, grandchild: none started twice
        by_depth: dict[int, list[Event]] = {0: await agent.log.read_all("parent-1")}
        for sid in sessions:
            events = await agent.log.read_all(sid)
            await agent.log.verify(sid)
            link = link_of(events[0])
            if link is not None:
                by_depth[link.depth] = events
        for depth in (1, 2):  # each was resumed once: one turn, a second run
            runs = [e.body for e in by_depth[depth] if isinstance(e.body, RunStarted)]
            assert len(runs) == 2 and runs[1].resumed_from is not None
            assert by_depth[depth][-1].kind == "turn_ended"
        middle_result = _observed(by_depth[1], _delegate_call(by_depth[1]))
        assert middle_result["answer"] == "child answer: effect 1 is done"
        assert _observed(by_depth[0], _delegate_call(by_depth[0]))["answer"] == "middle done"
    assert effects.read_text() == "1\n"


@pytest.mark.slow
async def test_a_damaged_child_parks_the_parents_call_and_log_show_says_so(
    tmp_path: Path,
) -> None:
    state = _crash(tmp_path, "child_midturn")
    effects = tmp_path / "effects.txt"
    async with crash_agent(state, tmp_path / "ws", effects, "none") as agent:
        call_id = _delegate_call(await agent.log.read_all("parent-1"))
    child_id = child_session_id("parent-1", call_id)
    with sqlite3.connect(state / "log.sqlite3") as conn:  # a byte changed outside lodger
        conn.execute(
            "UPDATE events SET data = replace(data, 'child task', 'child tusk') "
            'WHERE session_id = ? AND "offset" = 1',
            (child_id,),
        )
    shown = await asyncio.to_thread(
        CliRunner().invoke, main, ["log", "show", "parent-1", "--state", str(state)]
    )
    assert shown.exit_code == 0, shown.output
    assert f"subagent {child_id}  unreadable" in shown.output
    async with crash_agent(state, tmp_path / "ws", effects, "none") as agent:
        with pytest.raises(ResumeBlockedError) as blocked:
            await agent.resume("parent-1")
        assert call_id in blocked.value.message
        parent = await agent.log.read_all("parent-1")
        decided = [e.body for e in parent if isinstance(e.body, RecoveryDecided)]
        assert [d.action for d in decided] == ["park"]
        assert "probe failed" in decided[0].reason or "cannot" in decided[0].reason
    assert effects.read_text() == "1\n"  # nothing ran again

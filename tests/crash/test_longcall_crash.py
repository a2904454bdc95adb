"""SIGKILL after the remote side accepted the work (issue 33 parts 3 and 4): a real child
process runs the turn against a loopback server that counts what it runs; the parent
kills it once the server has the request, then resumes in-process.

- an idempotent HTTP call killed after the charge, before its T2, is re-dispatched with
  the same ``Idempotency-Key``: the server answers its stored result and charges once;
- a long-running call killed while the turn waits on it is classified ``running`` with its
  handle and settled through the tool's poll, with no person; only a handle the server
  cannot tell about parks it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from tests.crash.longcall_child import SCRIPTS
from tests.tools.idempotent_server import Ledger, serve
from tests.tools.remote_tools import build_tool, pay_tool

from lodger.cli import main
from lodger.engine.settings import Services
from lodger.errors import ResumeBlockedError
from lodger.events import Event, RecoveryDecided, ToolDispatched, ToolResponded
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.scripted import ScriptedModel
from lodger.recovery import plan_recovery
from lodger.recovery.classify import CallState, classify_calls
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.testing import MemoryArtifactStore
from lodger.tools import Tool

ROOT = Path(__file__).resolve().parents[2]


def run_child_until(state: Path, base: str, mode: str, ready: Callable[[], bool]) -> None:
    """Start the child and SIGKILL it once ``ready()`` (what the server saw) holds."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.crash.longcall_child", str(state), base, mode],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready():
            if child.poll() is not None:
                raise AssertionError(f"the child ended first: {child.stderr.read()!r}")  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                raise AssertionError("the server never saw the child's request")
            time.sleep(0.01)
        child.kill()
    finally:
        child.wait()
        if child.stderr is not None:
            child.stderr.close()
    assert child.returncode == -9


def agent(state: Path, tools: list[Tool], mode: str, script: list[Any] | None = None) -> Agent:
    return Agent(
        model=ScriptedModel(script or SCRIPTS[mode]),
        tools=tools,
        storage=Storage(log=EventLog(SqliteLogStore(state)), artifacts=MemoryArtifactStore()),
        services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds("r")),
    )


async def events_of(state: Path) -> list[Event]:
    log = EventLog(SqliteLogStore(state))
    try:
        return await log.read_all("s1")
    finally:
        await log.close()


def executed(ledger: Ledger) -> int:
    with ledger.lock:
        return len(ledger.executed)


@pytest.mark.slow
async def test_an_http_call_killed_after_the_remote_ran_it_settles_through_its_key(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    with serve() as (base, ledger):
        run_child_until(state, base, "pay", lambda: executed(ledger) == 1)
        plan = plan_recovery(await events_of(state))
        assert [(c.status, c.action) for c in plan.calls] == [("indeterminate", "redispatch")]
        resumed = agent(state, [pay_tool(base)], "pay")
        result = await resumed.resume("s1")
        await resumed.close()
    assert result.status == "completed" and result.answer == "paid"
    assert len(ledger.executed) == 1  # charged once, counted by the server
    assert len(ledger.keys) == 2 and ledger.keys[0] == ledger.keys[1] is not None
    events = await events_of(state)
    t1s = [e.body for e in events if isinstance(e.body, ToolDispatched)]
    assert len(t1s) == 2 and t1s[1].retry_of == t1s[0].operation_id
    t2 = next(e.body for e in events if isinstance(e.body, ToolResponded))
    assert '"replayed": true' in t2.content


def polled(ledger: Ledger) -> bool:
    with ledger.lock:
        return len(ledger.polls) >= 1  # a poll comes only after call_accepted committed


@pytest.mark.slow
async def test_a_long_call_killed_while_waiting_is_settled_by_polling_its_handle(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    with serve() as (base, ledger):
        run_child_until(state, base, "job", lambda: polled(ledger))
        events = await events_of(state)
        plan = plan_recovery(events)
        assert plan_recovery(events) == plan  # the same prefix, the same plan
        assert [(c.status, c.reason, c.action) for c in plan.calls] == [
            ("running", "accepted_with_handle", "poll")
        ]
        runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "LODGER_STATE": None})
        shown = await asyncio.to_thread(  # the CLI runs its own event loop
            runner.invoke, main, ["recover", "s1", "--state", str(state)], catch_exceptions=False
        )
        assert "running  (accepted_with_handle)  -> poll its handle" in shown.stdout, shown.output
        ledger.jobs["job-1"] = "app built"  # the farm finished while lodger was down
        resumed = agent(state, [build_tool(base, "wait")], "job")
        result = await resumed.resume("s1")
        await resumed.close()
    assert result.status == "completed" and result.answer == "built"
    assert len(ledger.executed) == 1  # the build was started once
    events = await events_of(state)
    assert sum(isinstance(e.body, ToolDispatched) for e in events) == 1
    assert not any(isinstance(e.body, RecoveryDecided) for e in events)  # no one was asked
    t2 = next(e.body for e in events if isinstance(e.body, ToolResponded))
    assert t2.content == "build finished: app built"


@pytest.mark.slow
async def test_a_handle_the_remote_cannot_tell_about_parks_the_call(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with serve() as (base, ledger):
        run_child_until(state, base, "job", lambda: polled(ledger))
        ledger.unknown_jobs.add("job-1")  # the farm lost the job
        resumed = agent(state, [build_tool(base, "wait")], "job")
        with pytest.raises(ResumeBlockedError, match="parked"):
            await resumed.resume("s1")
        await resumed.close()
    events = await events_of(state)
    parked = [e.body for e in events if isinstance(e.body, RecoveryDecided)]
    assert len(parked) == 1 and "cannot tell" in parked[0].reason
    assert "does not know job job-1" in parked[0].reason
    plan = plan_recovery(events)
    assert [(c.status, c.action) for c in plan.calls] == [("parked", "wait_operator")]
    assert len(ledger.executed) == 1


@pytest.mark.slow
async def test_a_long_call_still_running_after_the_crash_stays_running_and_settles_later(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    with serve() as (base, ledger):
        run_child_until(state, base, "job", lambda: polled(ledger))
        # a wait call waits again on resume, up to its time limit (one second here)
        resumed = agent(state, [build_tool(base, "wait", timeout=1)], "job")
        result = await resumed.resume("s1")  # the polls say running: no park, no re-run
        events = await events_of(state)
        assert result.status == "completed"
        assert not any(isinstance(e.body, RecoveryDecided | ToolResponded) for e in events)
        assert [c.call_id for c in resumed_running(events)] == ["call-0-1"]
        ledger.jobs["job-1"] = "app built"
        later = agent(state, [build_tool(base, "wait")], "job", [{"text": "the build is in"}])
        await later.run("and now?", session="s1")
        await later.close()
        await resumed.close()
    events = await events_of(state)
    t2 = [e.body for e in events if isinstance(e.body, ToolResponded)]
    assert [b.content for b in t2] == ["build finished: app built"]
    assert (
        len(ledger.executed) == 1 and sum(isinstance(e.body, ToolDispatched) for e in events) == 1
    )


@pytest.mark.slow
async def test_a_wait_call_still_running_after_the_crash_waits_again_on_resume(
    tmp_path: Path,
) -> None:
    """A ``wait`` call resumes as ``wait``: polled with backoff until the result comes,
    which is its T2; the model reads only the result, never "running"."""
    state = tmp_path / "state"
    with serve() as (base, ledger):
        run_child_until(state, base, "job", lambda: polled(ledger))
        with ledger.lock:
            before = ledger.polls.count("job-1")
            ledger.finish_at = before + 3  # running, running, then done: while resuming
        resumed = agent(state, [build_tool(base, "wait")], "job")
        result = await resumed.resume("s1")
        await resumed.close()
        with ledger.lock:
            after = ledger.polls.count("job-1")
    assert result.status == "completed" and result.answer == "built"
    assert after - before == 3  # waited through two "running" answers, within the resume
    events = await events_of(state)
    (t2,) = [e.body for e in events if isinstance(e.body, ToolResponded)]
    assert t2.content.startswith("build finished:")
    assert len(ledger.executed) == 1 and not any(
        isinstance(e.body, RecoveryDecided) for e in events
    )


def resumed_running(events: list[Event]) -> list[CallState]:
    return [c for c in classify_calls(events).values() if c.status()[0] == "running"]


@pytest.mark.slow
async def test_abandoning_the_turn_stops_following_its_running_call(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with serve() as (base, ledger):
        run_child_until(state, base, "job", lambda: polled(ledger))
        operator = agent(state, [build_tool(base, "wait")], "job", [{"text": "fresh start"}])
        await operator.abandon("s1", reason="the farm job is not wanted")
        assert resumed_running(await events_of(state)) == []
        ledger.jobs["job-1"] = "too late"
        polls = len(ledger.polls)
        await operator.run("next", session="s1")
        await operator.close()
        assert len(ledger.polls) == polls  # nothing polls an abandoned call
    events = await events_of(state)
    assert not any(isinstance(e.body, ToolResponded) for e in events)

"""Subagents over the control plane: real PostgreSQL, a ``file://`` store, real worker
processes. A parent that delegates parks dormant (its call suspended, its lease released,
no worker slot taken), its children run on any worker, and the last child to settle
wakes it; a worker SIGKILLed inside a child is replaced and nothing happens twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from lodger import Agent
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.subagents import SubagentLink, SubagentPolicy, child_session_id
from lodger.storage import Storage
from lodger.storage.control import open_control
from lodger.storage.snapshots import restore_snapshot
from lodger.testing.postgres import PostgresServer

from ._workers import Workers, lodger, wait_for

pytestmark = pytest.mark.slow

TOOLS = Path(__file__).with_name("_subagent_tools.py")


def _world(tmp_path: Path, postgres: PostgresServer, tasks: list[str]) -> Workers:
    parent = [{"calls": [{"name": "delegate", "args": {"task": t}} for t in tasks]},
              {"text": "all delegated work is done"}]  # fmt: skip
    child = [{"calls": [{"name": "child_effect", "args": {"tag": "x"}}]},
             {"text": "child finished"}]  # fmt: skip
    (tmp_path / "parent.json").write_text(json.dumps(parent))
    (tmp_path / "child.json").write_text(json.dumps(child))
    store = f"file://{tmp_path / 'objects'}"
    return Workers(tmp_path, store, postgres.new_database(), tmp_path / "parent.json")


def _start(workers: Workers) -> None:
    workers.start("--tools", str(TOOLS), "--subagents",
                  "--subagent-model", f"script:{workers.dir / 'child.json'}")  # fmt: skip


def _row(dsn: str, sql: str, *args: Any) -> tuple[Any, ...] | None:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql.encode(), args).fetchone()


def _status(dsn: str, session: str) -> str | None:
    row = _row(dsn, "SELECT status FROM sessions WHERE session_id = %s", session)
    return None if row is None else str(row[0])


def _lease_expiry(dsn: str, session: str) -> float | None:
    row = _row(dsn, "SELECT expires_at FROM session_leases WHERE session_id = %s", session)
    return None if row is None else float(row[0])


def _kinds(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["body"]["kind"] == kind]


def _answers(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The delegate results the parent's model saw (recovery observed, by call id)."""
    out: dict[str, dict[str, Any]] = {}
    for e in _kinds(events, "recovery_observed"):
        assert e["body"]["status"] == "completed", e["body"]
        out[e["call_id"]] = json.loads(e["body"]["observation"])
    return out


def test_a_parent_parks_dormant_while_two_children_run_and_wakes_once_both_settle(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    workers = _world(tmp_path, postgres, ["first half", "second half"])
    dsn = workers.control
    kids = [child_session_id("p1", f"call-0-{n}") for n in (1, 2)]
    try:
        for _ in range(2):  # two workers of one slot each: both children at once
            _start(workers)
        assert workers.send("p1", "split the work").returncode == 0
        held = [tmp_path / f"holding-x-{kid}" for kid in kids]
        wait_for("both children inside their tool", lambda: all(p.exists() for p in held))
        # Both slots run children at the same time: the parent occupies none. Its call
        # suspended, its run ended waiting, its lease was released (not left to expire).
        pids = {int(p.read_text()) for p in held}
        assert pids == {p.pid for p in workers.procs}
        assert _status(dsn, "p1") == "waiting"
        assert _lease_expiry(dsn, "p1") == 0.0
        parked = workers.events("p1")
        assert parked[-1]["body"]["kind"] == "run_ended"
        assert parked[-1]["body"]["status"] == "interrupted"
        assert parked[-1]["body"]["error"].startswith("waiting for 2 suspended call(s)")
        assert len(_kinds(parked, "tool_dispatched")) == 2
        assert _kinds(parked, "tool_responded") == []  # no T2: the calls are suspended
        (tmp_path / "gate-x").touch()
        wait_for("the parent completed", lambda: _status(dsn, "p1") == "completed")
    finally:
        workers.stop_all()
    assert sorted((tmp_path / "child-effects").read_text().splitlines()) == sorted(
        f"x {kid}" for kid in kids
    )
    events = workers.events("p1")
    answers = _answers(events)
    assert set(answers) == {"call-0-1", "call-0-2"}
    for n, kid in enumerate(kids, start=1):
        assert answers[f"call-0-{n}"]["session"] == kid
        assert answers[f"call-0-{n}"]["answer"] == "child finished"
        child = workers.events(kid)
        assert child[0]["body"]["metadata"]["subagent.parent_session"] == "p1"
        assert len(_kinds(child, "turn_started")) == 1
        assert _kinds(child, "turn_ended")[0]["body"]["status"] == "completed"
    assert len(_kinds(events, "tool_dispatched")) == 2  # never dispatched again
    (ended,) = _kinds(events, "turn_ended")
    assert ended["body"]["status"] == "completed"
    assert ended["body"]["answer"] == "all delegated work is done"
    assert lodger(tmp_path, "log", "verify", "p1", "--store", workers.store).returncode == 0


def test_a_worker_killed_inside_a_child_is_replaced_and_the_effect_happens_once(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    workers = _world(tmp_path, postgres, ["the whole job"])
    dsn = workers.control
    kid = child_session_id("p1", "call-0-1")
    try:
        for _ in range(2):
            _start(workers)
        assert workers.send("p1", "delegate it").returncode == 0
        marker = tmp_path / f"holding-x-{kid}"
        wait_for("the child inside its tool", marker.exists)
        victim = int(marker.read_text())
        os.kill(victim, signal.SIGKILL)  # after the child's effect, before its T2
        (tmp_path / "gate-x").touch()
        wait_for("the parent completed", lambda: _status(dsn, "p1") == "completed")
    finally:
        workers.stop_all()
    assert (tmp_path / "child-effects").read_text().splitlines() == [f"x {kid}"]
    assert (tmp_path / "child-invocations").read_text().splitlines() == [f"x {kid} {victim}"]
    child = workers.events(kid)
    runs = _kinds(child, "run_started")
    assert len(runs) == 2 and runs[1]["body"]["parent_run_id"] == runs[0]["run_id"]
    assert len(_kinds(child, "tool_dispatched")) == 1  # the probe found the effect
    assert len(_kinds(child, "turn_started")) == 1  # resumed, never restarted
    events = workers.events("p1")
    assert list(_answers(events).values()) == [
        {"session": kid, "status": "completed", "answer": "child finished", "steps": 2,
         "tokens": 0}
    ]  # fmt: skip
    assert len(_kinds(events, "tool_dispatched")) == 1
    assert _kinds(events, "turn_ended")[0]["body"]["status"] == "completed"
    assert lodger(tmp_path, "log", "verify", kid, "--store", workers.store).returncode == 0


def test_a_child_that_delegates_waits_dormant_too_and_the_family_settles_bottom_up(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    workers = _world(tmp_path, postgres, ["top task"])
    # children delegate once more; the grandchild's own delegation is refused (depth 2)
    child = [{"calls": [{"name": "delegate", "args": {"task": "deeper"}}]},
             {"text": "child finished"}]  # fmt: skip
    (tmp_path / "child.json").write_text(json.dumps(child))
    dsn = workers.control
    kid = child_session_id("p1", "call-0-1")
    grandkid = child_session_id(kid, "call-0-1")
    try:
        workers.start("--subagents", "2", "--subagent-model", f"script:{tmp_path / 'child.json'}")
        assert workers.send("p1", "go deep").returncode == 0
        wait_for("the parent completed", lambda: _status(dsn, "p1") == "completed")
    finally:
        workers.stop_all()
    deepest = workers.events(grandkid)
    assert deepest[0]["body"]["metadata"]["subagent.depth"] == "2"
    (refused,) = _kinds(deepest, "call_rejected")
    assert "limited to depth 2" in refused["body"]["message"]
    middle = workers.events(kid)
    ended = [e["body"] for e in _kinds(middle, "run_ended")]
    assert ended[0]["status"] == "interrupted" and ended[0]["error"].startswith("waiting for 1")
    assert ended[-1]["status"] == "completed"
    assert _answers(middle)["call-0-1"]["session"] == grandkid
    tree = lodger(tmp_path, "sessions", "--tree", "--json", "--store", workers.store)
    assert tree.returncode == 0, tree.stderr
    parents = {s["session_id"]: s.get("parent") for s in json.loads(tree.stdout)["sessions"]}
    assert parents[kid] == "p1" and parents[grandkid] == kid
    assert _answers(workers.events("p1"))["call-0-1"] == {
        "session": kid, "status": "completed", "answer": "child finished", "steps": 2,
        "tokens": 0,
    }  # fmt: skip


def test_a_child_out_of_wall_time_is_ended_and_its_parent_told(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    workers = _world(tmp_path, postgres, [])
    parent = [{"calls": [{"name": "delegate",
                          "args": {"task": "slow", "budget": {"wall_time_s": 0.5}}}]},
              {"text": "the child gave up"}]  # fmt: skip
    (tmp_path / "parent.json").write_text(json.dumps(parent))
    kid = child_session_id("p1", "call-0-1")
    try:
        _start(workers)  # the gate never opens: the child's tool waits past its wall time
        assert workers.send("p1", "try it").returncode == 0
        wait_for("the parent completed", lambda: _status(workers.control, "p1") == "completed")
    finally:
        workers.stop_all()
    answer = _answers(workers.events("p1"))["call-0-1"]
    assert answer["session"] == kid and answer["status"] == "abandoned"
    assert "wall time" in answer["error"]
    child = workers.events(kid)
    assert [e["body"]["status"] for e in _kinds(child, "tool_responded")] == ["cancelled"]
    assert _kinds(child, "turn_ended")[0]["body"]["status"] == "abandoned"


class _LostWakes:
    """A launcher whose wakes never reach the queue: the log a worker leaves when it dies
    after writing a child's first event and before enqueuing the child's wake."""

    def __init__(self) -> None:
        self.started: list[str] = []

    @contextlib.asynccontextmanager
    async def writing(self, session_id: str) -> AsyncIterator[None]:
        yield

    async def start(self, *, child: SubagentLink, snapshot: str | None) -> None:
        self.started.append(child.session_id)

    async def final_snapshot(self, *, child: SubagentLink) -> str | None:
        raise AssertionError("no child settles here")

    async def settled(self, *, child: SubagentLink) -> None:
        raise AssertionError("no child settles here")

    @contextlib.asynccontextmanager
    async def reserving(self, root: str) -> AsyncIterator[None]:
        yield


def test_a_child_whose_wake_was_lost_is_started_by_the_parents_recovery(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    workers = _world(tmp_path, postgres, ["the job"])
    kid = child_session_id("p1", "call-0-1")
    lost = _LostWakes()

    async def park_without_a_child_wake() -> str:
        storage = Storage.from_url(workers.store)
        policy = SubagentPolicy(children=lost)
        model = ScriptedModel.from_file(tmp_path / "parent.json")
        async with Agent(model=model, storage=storage, subagents=policy) as agent:
            result = await agent.run("delegate it", session="p1")
        control = open_control(workers.control)
        await control.start()
        try:
            assert await control.pending_wakes() == []  # the child's wake is lost
            # the parent's own wake, as the claim of a dead worker's wake expires
            await control.send(session_id="p1", message=None)
        finally:
            await control.close()
        return result.status

    assert asyncio.run(park_without_a_child_wake()) == "waiting"
    assert lost.started == [kid] and workers.has_session(kid)
    try:
        _start(workers)
        (tmp_path / "gate-x").touch()
        wait_for("the parent completed", lambda: _status(workers.control, "p1") == "completed")
    finally:
        workers.stop_all()
    assert (tmp_path / "child-effects").read_text().splitlines() == [f"x {kid}"]
    runs = [e["body"] for e in _kinds(workers.events("p1"), "run_ended")]
    # parked, woken with the child not yet run (pending: it re-sent the child's wake),
    # woken again by the child, completed
    assert [r["status"] for r in runs] == ["interrupted", "interrupted", "completed"]
    assert _answers(workers.events("p1"))["call-0-1"]["answer"] == "child finished"


def test_two_detached_children_on_two_workers_never_spend_more_than_the_tree_budget(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    workers = _world(tmp_path, postgres, [])
    ask = {"steps": 4}
    parent = [{"calls": [{"name": "delegate", "args": {"task": t, "budget": ask}}
                         for t in ("left", "right")]},
              {"text": "both answered"}]  # fmt: skip
    busy = [{"calls": [{"name": "child_effect", "args": {"tag": "x"}}]}] * 3 + [{"text": "did 3"}]
    (tmp_path / "parent.json").write_text(json.dumps(parent))
    (tmp_path / "child.json").write_text(json.dumps(busy))
    (tmp_path / "gate-x").touch()  # the children's effects do not wait
    kids = [child_session_id("p1", f"call-0-{n}") for n in (1, 2)]
    try:
        for _ in range(2):
            workers.start("--tools", str(TOOLS), "--subagents", "--subagent-tree-steps", "5",
                          "--subagent-model", f"script:{tmp_path / 'child.json'}")  # fmt: skip
        assert workers.send("p1", "split it").returncode == 0
        wait_for("the parent completed", lambda: _status(workers.control, "p1") == "completed")
    finally:
        workers.stop_all()
    answers = _answers(workers.events("p1"))
    grants, spent = [], 0
    for n, kid in enumerate(kids, start=1):
        child = workers.events(kid)
        grants.append(json.loads(child[0]["body"]["metadata"]["subagent.budget"])["steps"])
        steps = len([e for e in _kinds(child, "model_output") if e["origin"] == "provider"])
        assert answers[f"call-0-{n}"]["steps"] == steps
        spent += steps
    # both asked 4 of a tree of 5: one got 4, the other what was left
    assert sorted(grants) == [1, 4]
    assert spent == 5
    assert sorted(a["status"] for a in answers.values()) == ["completed", "step_limit"]
    effects = (tmp_path / "child-effects").read_text().splitlines()
    assert sorted(effects) == sorted([f"x {kids[grants.index(4)]}"] * 3
                                     + [f"x {kids[grants.index(1)]}"])  # fmt: skip


def test_a_detached_childs_edits_reach_the_parents_workspace(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """The child starts from a snapshot of the parent's workspace on another worker; when
    the parent wakes, the child's edits are applied to the parent's workspace (three-way
    against that snapshot) and the delegate result says which paths arrived."""
    workers = _world(tmp_path, postgres, [])
    write = "write_file"
    parent = [
        {"calls": [{"name": write, "args": {"path": "notes.txt", "content": "parent's notes"}},
                   {"name": write, "args": {"path": "shared.txt", "content": "v1"}}]},
        {"calls": [{"name": "delegate", "args": {"task": "improve shared.txt"}}]},
        {"text": "merged"},
    ]  # fmt: skip
    child = [
        {"calls": [{"name": write, "args": {"path": "shared.txt", "content": "child's v2"}},
                   {"name": write, "args": {"path": "src/new.py", "content": "print(2)"}}]},
        {"text": "child finished"},
    ]  # fmt: skip
    (tmp_path / "parent.json").write_text(json.dumps(parent))
    (tmp_path / "child.json").write_text(json.dumps(child))
    kid = child_session_id("p1", "call-1-1")
    try:
        _start(workers)
        assert workers.send("p1", "delegate an edit").returncode == 0
        wait_for("the parent completed", lambda: _status(workers.control, "p1") == "completed")
    finally:
        workers.stop_all()
    answer = _answers(workers.events("p1"))["call-1-1"]
    assert answer["session"] == kid and answer["answer"] == "child finished"
    assert answer["workspace"] == {"applied": ["shared.txt", "src", "src/new.py"],
                                   "conflicts": []}  # fmt: skip
    row = _row(workers.control, "SELECT snapshot FROM sessions WHERE session_id = %s", "p1")
    assert row is not None

    async def restored() -> dict[str, str]:
        storage = Storage.from_url(workers.store)
        try:
            await restore_snapshot(str(row[0]), storage.artifacts, tmp_path / "after")
        finally:
            await storage.close()
        root = tmp_path / "after"
        return {p.relative_to(root).as_posix(): p.read_text()
                for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip

    assert asyncio.run(restored()) == {
        "notes.txt": "parent's notes",
        "shared.txt": "child's v2",
        "src/new.py": "print(2)",
    }

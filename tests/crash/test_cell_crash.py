"""The crash harness inside code cells: SIGKILL before a nested T1, between a nested T1
and its T2, with nested calls in flight under Promise.all, and after the last nested T2
before the cell's own T2. Recovery never runs the cell again (one exec T1 ever); nested
calls follow their own policies (lookup re-runs under a linked T1, a charge parks and the
operator decides it from the effects file); no effect ran twice; the cell is settled by
one cell_interrupted fact and the turn ends with the uninterrupted answer."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from test_crash_harness import check_final, drive_to_the_end, make_world

from lodger.events import RecoveryObserved, ToolDispatched

CELL_FAILPOINTS = [
    "cell_before_nested_t1",
    "cell_between_nested_t1_and_t2",
    "cell_nested_in_flight",
    "cell_after_last_nested_t2",
]


@pytest.mark.slow
@pytest.mark.parametrize("failpoint", CELL_FAILPOINTS)
def test_sigkill_inside_a_cell(
    tmp_path: Path, failpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LODGER_CRASH_CELLS", "1")
    world = make_world(tmp_path)
    code = world.child("run", failpoint)
    assert code == -signal.SIGKILL, f"failpoint {failpoint} was never reached"
    events = drive_to_the_end(world, [])
    check_final(world, events)
    cells = [e for e in events if isinstance(e.body, ToolDispatched) and e.body.tool == "exec"]
    assert len(cells) == 1, "the cell ran again"
    nested = [e for e in events if isinstance(e.body, ToolDispatched) and e.parent_call_id]
    assert all(e.parent_call_id == cells[0].call_id for e in nested)
    # every nested call after the first attempt is a linked re-run, never a fresh call
    by_call: dict[str, list[ToolDispatched]] = {}
    for e in nested:
        assert isinstance(e.body, ToolDispatched) and e.call_id is not None
        by_call.setdefault(e.call_id, []).append(e.body)
    for attempts in by_call.values():
        assert all(later.retry_of is not None for later in attempts[1:])
    settled = [
        e.body
        for e in events
        if isinstance(e.body, RecoveryObserved) and e.body.reason == "cell_interrupted"
    ]
    assert len(settled) == 1
    report = json.loads(settled[0].observation)
    assert {n["call_id"] for n in report["nested"]} == set(by_call)


def test_an_uninterrupted_cell_is_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LODGER_CRASH_CELLS", "1")
    world = make_world(tmp_path)
    assert world.child("run", "cell_none") == 0
    events = drive_to_the_end(world, [])
    check_final(world, events)
    assert sorted(tuple(x) for x in world.effect_lines()) == [
        ("charge", "5"),
        ("charge", "7"),
        ("lookup", "price"),
    ]

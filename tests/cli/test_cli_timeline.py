"""The timeline projection and its rendering, as pure functions over events."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lodger.cli._render import render_timeline, summarize_arguments
from lodger.cli._timeline import CallNode, Item, Span, build_timeline, summarize
from lodger.events import (
    Event,
    EventDraft,
    ModelOutput,
    RecoveryObserved,
    RunEnded,
    SessionStarted,
    ToolDispatched,
    ToolResponded,
    TurnEnded,
)

Seal = Callable[[str, list[EventDraft]], list[Event]]


def _offsets(items: list[Item]) -> list[int]:
    """Every event offset reachable in the tree, in walk order."""
    out: list[int] = []
    for item in items:
        if isinstance(item, Span):
            out.append(item.event.offset)
            out += _offsets(item.children)
        elif isinstance(item, CallNode):
            out += [fact.offset for fact in item.facts]
            out += _offsets(list(item.children))
        else:
            out.append(item.offset)
    return out


def _plain(events: list[Event], *, full: bool = False) -> list[str]:
    return [line.plain for line in render_timeline(build_timeline(events), full=full)]


def test_spans_nest_turn_run_step(demo_events: list[Event]) -> None:
    timeline = build_timeline(demo_events)
    session, turn = timeline.items
    assert isinstance(session, Event)
    assert isinstance(session.body, SessionStarted)
    assert isinstance(turn, Span)
    assert timeline.turns == [turn]
    run, turn_end = turn.children
    assert isinstance(run, Span)
    assert run.kind == "run_started"
    assert isinstance(turn_end, Event)
    assert isinstance(turn_end.body, TurnEnded)
    steps = [c for c in run.children if isinstance(c, Span)]
    assert [s.event.offset for s in steps] == [3, 9, 16]
    assert isinstance(run.children[-1], Event)
    assert isinstance(run.children[-1].body, RunEnded)
    assert (turn.status(), run.status()) == ("completed", "completed")


def test_calls_pair_responses_by_call_id(demo_events: list[Event]) -> None:
    timeline = build_timeline(demo_events)
    c1, c2 = timeline.calls["c1"], timeline.calls["c2"]
    # Log order interleaves the two calls; the tree pairs each T2 with its own T1.
    assert [f.offset for f in c1.facts] == [5, 8]
    assert [f.offset for f in c2.facts] == [6, 7]
    assert (c1.name, c1.arguments, c1.offset) == ("read_file", '{"path": "a.txt"}', 4)
    assert (c1.status(), c2.status()) == ("ok", "ok")
    (s1, e1), (s2, e2) = c1.interval(), c2.interval()
    assert s1 is not None and e1 is not None and s2 is not None and e2 is not None
    assert s1 < s2 < e2 < e1  # c2 ran entirely inside c1


def test_rejected_call_has_no_dispatch(demo_events: list[Event]) -> None:
    c3 = build_timeline(demo_events).calls["c3"]
    assert c3.status() == "rejected"
    assert c3.dispatched() is None
    assert [f.offset for f in c3.facts] == [11]


def test_nested_code_mode_call_hangs_under_its_cell(demo_events: list[Event]) -> None:
    timeline = build_timeline(demo_events)
    cell, nested = timeline.calls["c4"], timeline.calls["n1"]
    assert cell.children == [nested]
    assert (nested.parent_call_id, nested.origin, nested.hidden) == ("c4", "code_mode", True)
    assert (nested.name, nested.status(), nested.offset) == ("read_file", "error", 13)
    assert nested.dispatch_arguments() == '{"path": "c.txt"}'
    step1 = timeline.turns[0].children[0]
    assert isinstance(step1, Span)
    top_level_calls = [c for s in step1.children if isinstance(s, Span) for c in s.children]
    assert nested not in top_level_calls
    assert cell in top_level_calls


@pytest.mark.parametrize("length", range(21))
def test_every_prefix_places_each_event_once(demo_events: list[Event], length: int) -> None:
    prefix = demo_events[:length]
    timeline = build_timeline(prefix)
    assert sorted(_offsets(timeline.items)) == list(range(length))


def test_recovery_fact_is_found_by_operation_id(
    crashed_drafts: list[EventDraft], sealed: Seal
) -> None:
    t0 = crashed_drafts[0].ts
    observed = RecoveryObserved(operation_id="op1", status="unknown", reason="probe_unknown")
    # No call_id on the envelope: the operation id alone links it to call c1.
    crashed_drafts.append(EventDraft(id="rec", ts=t0 + 90_000, body=observed))
    timeline = build_timeline(sealed("s-crash", crashed_drafts))
    call = timeline.calls["c1"]
    assert [f.kind for f in call.facts] == ["tool_dispatched", "recovery_observed"]
    assert call.status() == "dispatched"
    assert call.interval() == (t0 + 50_000, None)


def test_turn_status_without_turn_end(
    crashed_events: list[Event], crashed_drafts: list[EventDraft], sealed: Seal
) -> None:
    assert build_timeline(crashed_events).turns[0].status() == "interrupted"
    ts = crashed_drafts[-1].ts
    parked = RunEnded(status="parked")
    crashed_drafts.append(EventDraft(id="end", ts=ts, body=parked, turn_id="t1", run_id="r1"))
    assert build_timeline(sealed("s-crash", crashed_drafts)).turns[0].status() == "parked"


def test_summarize_counts_turns_and_status(
    demo_events: list[Event], crashed_events: list[Event]
) -> None:
    summary = summarize("s-demo", demo_events)
    assert (summary.events, summary.turns, summary.last_status) == (20, 1, "completed")
    assert (summary.workspace, summary.last_ts) == ("/projects/demo", demo_events[0].ts + 730_000)
    crashed = summarize("s-crash", crashed_events)
    assert (crashed.events, crashed.turns, crashed.last_status) == (6, 1, "interrupted")
    empty = summarize("nothing", [])
    assert (empty.events, empty.turns, empty.last_status, empty.last_ts) == (0, 0, None, None)


def test_render_shows_every_offset_and_keeps_brackets(demo_events: list[Event]) -> None:
    lines = _plain(demo_events)
    assert lines[0].startswith("session s-demo  20 events")
    starts = {int(line.split()[0]) for line in lines[1:] if line.split()[0].isdigit()}
    assert starts == set(range(20))
    # Event text is data, not rich markup.
    assert any('"fix the failing test in [tests]"' in line for line in lines)
    assert any("reasoning: need a and b" in line for line in lines)


def test_render_clips_long_text_unless_full(demo_drafts: list[EventDraft], sealed: Seal) -> None:
    drafts = demo_drafts[:4]
    long_text = " ".join(f"word{n}" for n in range(200))
    output = ModelOutput(text=long_text)
    drafts.append(EventDraft(id="long", ts=drafts[-1].ts, body=output, turn_id="t1"))
    events = sealed("s-demo", drafts)
    clipped = "\n".join(_plain(events))
    assert "... (+" in clipped
    assert long_text not in clipped
    assert long_text in "\n".join(_plain(events, full=True))


def test_unproposed_call_renders_with_dispatch_arguments(
    demo_drafts: list[EventDraft], sealed: Seal
) -> None:
    drafts = demo_drafts[:4]
    ts = drafts[-1].ts
    dispatch = ToolDispatched(operation_id="opx", tool="shell", arguments={"cmd": "ls"})
    response = ToolResponded(operation_id="opx", status="cancelled", content="")
    for index, body in enumerate((dispatch, response)):
        drafts.append(
            EventDraft(id=f"x{index}", ts=ts + index, body=body, call_id="cx", run_id="r1")
        )
    lines = _plain(sealed("s-demo", drafts))
    header = next(line for line in lines if "id=cx" in line)
    assert 'shell(cmd="ls")' in header
    assert "cancelled" in header


def test_summarize_arguments() -> None:
    assert summarize_arguments('{"path": "a.txt", "n": 2}') == 'path="a.txt", n=2'
    assert summarize_arguments("not json {") == "not json {"
    assert summarize_arguments(None) == ""
    long = summarize_arguments('{"code": "' + "x" * 300 + '"}')
    assert len(long) < 100
    assert long.endswith("chars)")

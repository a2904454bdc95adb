"""Classification is pure, total on valid prefixes, deterministic, and fails closed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lodger.engine.settings import Services
from lodger.errors import CorruptLogError
from lodger.events import (
    CallRejected,
    Event,
    EventDraft,
    ModelOutput,
    ProposedCall,
    RecoveryDecided,
    ToolDispatched,
    ToolResponded,
    TurnStarted,
)
from lodger.ids import ManualClock, SequentialIds
from lodger.recovery import classify_calls, plan_recovery
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, MemoryLogStore, Storage
from lodger.testing import MemoryArtifactStore
from lodger.tools import tool


@tool(recovery="idempotent")
def lookup(key: str) -> str:
    """Look up a key."""
    return key.upper()


@tool
def charge(amount: int) -> str:
    """Charge money."""
    return f"charged {amount}"


SCRIPT = [
    {"text": "start", "calls": [{"name": "lookup", "args": {"key": "a"}}]},
    {
        "calls": [
            {"name": "lookup", "args": {"key": "b"}},
            {"name": "charge", "args": {"amount": 3}},
            {"name": "nope", "args": {}},
            {"name": "charge", "args": {"amount": "x"}},
        ]
    },
    {"calls": [{"name": "charge", "args": {"amount": 4}}]},
    {"text": "done"},
]


def _valid_log() -> list[Event]:
    async def build() -> list[Event]:
        from lodger.providers.scripted import ScriptedModel

        agent = Agent(
            model=ScriptedModel(SCRIPT),
            tools=[lookup, charge],
            storage=Storage(log=EventLog(MemoryLogStore()), artifacts=MemoryArtifactStore()),
            services=Services(clock=ManualClock(tick_us=7), ids=SequentialIds("x")),
        )
        await agent.run("go", session="s1")
        return await agent.session("s1").events()

    return asyncio.run(build())


VALID = _valid_log()


@settings(max_examples=len(VALID) + 1)
@given(st.integers(min_value=0, max_value=len(VALID)))
def test_any_prefix_of_a_valid_log_classifies_and_twice_gives_the_same_plan(n: int) -> None:
    prefix = VALID[:n]
    first = plan_recovery(prefix)
    second = plan_recovery(list(prefix))
    assert first == second
    for call in first.calls:
        # a settled call needs no action; an open one has exactly one
        assert (call.status in ("completed", "rejected")) == (call.action == "none")


def test_statuses_of_a_finished_log() -> None:
    states = classify_calls(VALID)
    statuses = {cid: s.status()[0] for cid, s in states.items()}
    assert statuses == {
        "call-0-1": "completed",
        "call-1-1": "completed",
        "call-1-2": "completed",
        "call-1-3": "rejected",
        "call-1-4": "rejected",
        "call-2-1": "completed",
    }
    assert plan_recovery(VALID).turn_id is None  # nothing to resume


def test_prefix_cut_between_t1_and_t2_is_indeterminate_with_its_policy() -> None:
    cut = next(i for i, e in enumerate(VALID) if isinstance(e.body, ToolDispatched)) + 1
    plan = plan_recovery(VALID[:cut])
    assert [(c.call_id, c.status, c.reason, c.action) for c in plan.calls] == [
        ("call-0-1", "indeterminate", "t1_without_t2", "redispatch")
    ]


def _draft(body: object, **env: object) -> EventDraft:
    return EventDraft(id=f"d{id(body)}", ts=1, turn_id="t", run_id="r", body=body, **env)  # type: ignore[arg-type]


async def _log_of(*drafts: EventDraft) -> list[Event]:
    log = EventLog(MemoryLogStore())
    writer = await log.open_writer("s1")
    await writer.append([_draft(TurnStarted(input="x")), *drafts], expected_offset=0)
    return await log.read_all("s1")


CALL = ModelOutput(calls=(ProposedCall(call_id="c1", name="charge", arguments="{}"),))
T1 = ToolDispatched(operation_id="o1", tool="charge", arguments={})
T2 = ToolResponded(operation_id="o1", status="ok", content="x")


@pytest.mark.parametrize(
    ("drafts", "code", "offset"),
    [
        ([_draft(T2, call_id="c1")], "unknown_operation", 1),
        ([_draft(T1, call_id="c1")], "dispatch_without_call", 1),
        (
            [
                _draft(CALL),
                _draft(T1, call_id="c1"),
                _draft(T2, call_id="c1"),
                _draft(T2, call_id="c1"),
            ],
            "duplicate_response",
            4,
        ),
        (
            [_draft(CALL), _draft(T1, call_id="c1"), _draft(T1, call_id="c1")],
            "duplicate_operation",
            3,
        ),
        ([_draft(CALL), _draft(T1, call_id="c1"), _draft(T2, call_id="other")], "call_mismatch", 3),
        (
            [
                _draft(CALL),
                _draft(CallRejected(tool="charge", reason="denied", message="no"), call_id="c1"),
                _draft(T1, call_id="c1"),
            ],
            "dispatch_after_rejection",
            3,
        ),
        (
            [
                _draft(CALL),
                _draft(T1, call_id="c1"),
                _draft(
                    ToolDispatched(operation_id="o2", tool="charge", arguments={}), call_id="c1"
                ),
            ],
            "unlinked_redispatch",
            3,
        ),
        (
            [
                _draft(CALL),
                _draft(T1, call_id="c1"),
                _draft(T2, call_id="c1"),
                _draft(
                    ToolDispatched(operation_id="o2", tool="charge", arguments={}, retry_of="o1"),
                    call_id="c1",
                ),
            ],
            "bad_retry_link",
            4,
        ),
        ([_draft(CALL), _draft(CALL)], "duplicate_call_id", 2),
        (
            [_draft(RecoveryDecided(operation_id="zz", action="park"), call_id="c1")],
            "unknown_operation",
            1,
        ),
    ],
)
async def test_inconsistent_logs_fail_closed_with_the_offset(
    drafts: list[EventDraft], code: str, offset: int
) -> None:
    events = await _log_of(*drafts)
    with pytest.raises(CorruptLogError) as caught:
        plan_recovery(events)
    assert caught.value.code == code
    assert caught.value.offset == offset
    assert caught.value.session_id == "s1"


def test_plan_serializes_for_json(tmp_path: Path) -> None:
    cut = next(i for i, e in enumerate(VALID) if isinstance(e.body, ToolDispatched)) + 1
    data = plan_recovery(VALID[:cut]).to_dict()
    assert data["open_turn"] is not None
    assert data["calls"][0]["action"] == "redispatch"  # type: ignore[index]

"""Writes ``v10_extensions.jsonl`` through the real writer (run once; never regenerate a
shipped golden): schema 10's facts, appended as one session would hold them. The session
is a replay of another (``replay_started``) scored by an eval (``eval_scored``); its turn
calls an MCP tool whose server asks a question (``elicitation_requested``, answered with a
sensitive field withheld: ``elicitation_answered``) and for a completion
(``sampling_requested``, ``sampling_answered``); the server's listing changes
(``tools_changed``); a second call is answered from the recorded result
(``call_replayed``).

    PYTHONPATH=src python tests/data/golden/make_v10_extensions.py
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from lodger.events import (
    Body,
    CallReplayed,
    ElicitationAnswered,
    ElicitationRequested,
    EvalScored,
    EventDraft,
    ModelOutput,
    ProposedCall,
    ReplayStarted,
    RunEnded,
    RunStarted,
    SamplingAnswered,
    SamplingRequested,
    SessionStarted,
    StepStarted,
    ToolDispatched,
    ToolResponded,
    ToolsChanged,
    TurnEnded,
    TurnStarted,
    Usage,
)
from lodger.storage import EventLog, MemoryLogStore

SESSION = "golden-v10"


def bodies() -> list[tuple[Body, dict[str, str]]]:
    turn = {"turn_id": "t1", "run_id": "r1"}
    step0 = {**turn, "step_id": "s0"}
    step1 = {**turn, "step_id": "s1"}
    call = {**step0, "call_id": "c1"}
    replayed = {**step1, "call_id": "c2"}
    form = {
        "type": "object",
        "properties": {
            "repo": {"type": "string"},
            "token": {"type": "string", "x-sensitive": True},
        },
        "required": ["repo"],
    }
    return [
        (
            ReplayStarted(
                source_session="golden-v10-source",
                source_offset=12,
                model="function:candidate",
                policy="recorded",
            ),
            {},
        ),
        (TurnStarted(input="open an issue on the tracker"), {"turn_id": "t1"}),
        (RunStarted(model="function:candidate"), turn),
        (StepStarted(index=0, model="function:candidate", tools=()), step0),
        (
            ModelOutput(
                calls=(ProposedCall(call_id="c1", name="tracker__create", arguments="{}"),)
            ),
            step0,
        ),
        (ToolDispatched(operation_id="op1", tool="tracker__create", arguments={}), call),
        (
            ElicitationRequested(
                elicitation_id="el1",
                operation_id="op1",
                server="tracker",
                mode="form",
                message="Which repository?",
                requested_schema=form,
            ),
            call,
        ),
        (
            ElicitationAnswered(
                elicitation_id="el1",
                action="accept",
                content={"repo": "acme/web"},
                withheld=("token",),
                by="user",
                who="cli:golden",
            ),
            call,
        ),
        (
            SamplingRequested(
                sampling_id="sa1",
                operation_id="op1",
                server="tracker",
                request={
                    "messages": [{"role": "user", "content": "title for: login fails"}],
                    "maxTokens": 40,
                },
                decision="allow",
                reason="rule sampling(tracker)",
            ),
            call,
        ),
        (
            SamplingAnswered(
                sampling_id="sa1",
                model="function:candidate",
                content="Login fails after reset",
                stop_reason="end_turn",
                usage=Usage(input_tokens=18, output_tokens=6),
            ),
            call,
        ),
        (ToolResponded(operation_id="op1", status="ok", content="issue #7 opened"), call),
        (
            ToolsChanged(
                server="tracker",
                added=("tracker__close",),
                removed=("tracker__legacy",),
                unusable=("tracker__broken",),
            ),
            turn,
        ),
        (StepStarted(index=1, model="function:candidate", tools=()), step1),
        (
            ModelOutput(calls=(ProposedCall(call_id="c2", name="read", arguments='{"path":"a"}'),)),
            step1,
        ),
        (ToolDispatched(operation_id="op2", tool="read", arguments={"path": "a"}), replayed),
        (CallReplayed(operation_id="op2", source="recorded", source_offset=9), replayed),
        (ToolResponded(operation_id="op2", status="ok", content="a's text"), replayed),
        (RunEnded(status="completed"), turn),
        (TurnEnded(status="completed", answer="opened #7"), {"turn_id": "t1"}),
        (
            EvalScored(
                eval_run="ev1",
                case="open-issue",
                evaluator="contains",
                passed=True,
                score=0.75,
                reason="answer names the issue",
            ),
            {},
        ),
    ]


async def main() -> None:
    store = MemoryLogStore()
    log = EventLog(store)
    writer = await log.open_writer(SESSION)
    drafts = [EventDraft(id="g10-0", ts=1_717_001_000_000_000, body=SessionStarted())]
    drafts += [
        EventDraft(id=f"g10-{i}", ts=1_717_001_000_000_000 + i * 1000, body=body, **where)
        for i, (body, where) in enumerate(bodies(), start=1)
    ]
    await writer.append(drafts, expected_offset=0)
    await writer.close()
    records = await store.read_records(session_id=SESSION, start=0, end=None)
    out = Path(__file__).with_name("v10_extensions.jsonl")
    out.write_text(
        "".join(
            json.dumps({"offset": r.offset, "data": r.data.decode("utf-8"), "digest": r.digest})
            + "\n"
            for r in records
        ),
        encoding="utf-8",
    )


if __name__ == "__main__":
    asyncio.run(main())

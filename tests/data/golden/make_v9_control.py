"""Writes ``v9_control.jsonl`` through the real writer (run once; never regenerate a
shipped golden): schema 9's facts, appended as one session would hold them. A turn reads
a large result, is compacted (``compacted``; an earlier attempt ``compaction_failed``),
is steered while it runs (``steer_received``, delivered at step 1: ``steer_delivered``),
gets a follow-up queued and edited (``message_queued``, ``queue_changed``), switches its
permission mode (``permission_mode_changed``), edits a file (``file_checkpoint``), is
cancelled (``cancel_requested``) and is then rewound onto a fork (``rewound``).

    PYTHONPATH=src python tests/data/golden/make_v9_control.py
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

from lodger.events import (
    ArtifactRef,
    Body,
    CallAccepted,
    CancelRequested,
    Compacted,
    CompactionFailed,
    EventDraft,
    FileCheckpoint,
    ForkParent,
    MessageQueued,
    ModelOutput,
    PermissionModeChanged,
    Prefix,
    ProcessEnded,
    ProcessStarted,
    ProposedCall,
    QueueChanged,
    Rewound,
    RunEnded,
    RunStarted,
    SessionStarted,
    SteerDelivered,
    SteerReceived,
    StepStarted,
    ToolDispatched,
    ToolResponded,
    TurnEnded,
    TurnStarted,
    Usage,
)
from lodger.storage import EventLog, MemoryLogStore

SESSION = "golden-v9"
BEFORE = b"old line\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def bodies(head: Prefix) -> list[tuple[Body, dict[str, str]]]:
    turn = {"turn_id": "t1", "run_id": "r1"}
    step0 = {**turn, "step_id": "s0"}
    step1 = {**turn, "step_id": "s1"}
    call = {**step0, "call_id": "c1"}
    edit = {**step1, "call_id": "c2"}
    return [
        (PermissionModeChanged(mode="accept_edits", previous="ask", who="cli:golden"), {}),
        (TurnStarted(input="read the log and fix the config"), {"turn_id": "t1"}),
        (RunStarted(model="function:golden"), turn),
        (StepStarted(index=0, model="function:golden", tools=()), step0),
        (ModelOutput(calls=(ProposedCall(call_id="c1", name="read", arguments="{}"),)), step0),
        (ToolDispatched(operation_id="op1", tool="read", arguments={}), call),
        (ToolResponded(operation_id="op1", status="ok", content="x" * 400), call),
        (SteerReceived(steer_id="st1", text="only the [server] table", who="cli:golden"), turn),
        (
            CompactionFailed(
                covers=head,
                trigger="threshold",
                attempts=2,
                reason="no 'next step' section",
                model="function:golden",
                usage=Usage(input_tokens=300, output_tokens=60),
            ),
            turn,
        ),
        (
            Compacted(
                covers=head,
                summary="## Goal\nfix the config\n## Next step\nedit it",
                dropped_call_ids=("c1",),
                dropped_bytes=400,
                dropped_tokens=100,
                pinned=("turn_input",),
                model="function:golden",
                prompt_sha256=sha(b"summarize"),
                tokens_before=160,
                tokens_after=40,
                trigger="threshold",
                usage=Usage(input_tokens=150, output_tokens=30),
            ),
            turn,
        ),
        (SteerDelivered(steer_ids=("st1",), step=1), step1),
        (StepStarted(index=1, model="function:golden", tools=()), step1),
        (
            FileCheckpoint(
                operation_id="op2",
                path="lodger.toml",
                before_sha256=sha(BEFORE),
                after_sha256=sha(b"new line\n"),
                before=ArtifactRef(sha256=sha(BEFORE), size=len(BEFORE)),
            ),
            edit,
        ),
        (
            ProcessStarted(
                process_id="p1",
                operation_id="op3",
                command="python -m http.server 8000",
                pid=4242,
                sandbox="bwrap",
            ),
            {**step1, "call_id": "c3"},
        ),
        (
            CallAccepted(operation_id="op4", handle={"job_id": "job-7"}, wait="continue"),
            {**step1, "call_id": "c4"},
        ),
        (ProcessEnded(process_id="p1", status="stopped", exit_code=-15, output_bytes=120), turn),
        (MessageQueued(message_id="m1", text="then run the tests", who="host:golden"), {}),
        (
            QueueChanged(
                message_id="m1", action="edit", text="then run all tests", who="host:golden"
            ),
            {},
        ),
        (CancelRequested(who="cli:golden", reason="wrong file"), turn),
        (RunEnded(status="cancelled"), turn),
        (TurnEnded(status="cancelled"), {"turn_id": "t1"}),
        (
            Rewound(
                left=ForkParent(session_id="golden-v9-left", high_water=20, digest=sha(b"left")),
                to=head,
                restored=1,
                who="cli:golden",
            ),
            {},
        ),
    ]


async def main() -> None:
    store = MemoryLogStore()
    log = EventLog(store)
    writer = await log.open_writer(SESSION)
    [first] = await writer.append(
        [EventDraft(id="g9-0", ts=1_717_000_900_000_000, body=SessionStarted())],
        expected_offset=0,
    )
    head = Prefix(high_water=1, digest=first.digest)
    drafts = [
        EventDraft(id=f"g9-{i}", ts=1_717_000_900_000_000 + i * 1000, body=body, **where)  # type: ignore[arg-type]
        for i, (body, where) in enumerate(bodies(head), start=1)
    ]
    await writer.append(drafts, expected_offset=1)
    await writer.close()
    records = await store.read_records(session_id=SESSION, start=0, end=None)
    out = Path(__file__).with_name("v9_control.jsonl")
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

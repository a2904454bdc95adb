"""``CompactionFold``, fed one event at a time: calls waiting for an approval stay pinned
until decided, a failed write pins nothing, the last todo list wins, and the fold's
export restores to the same pins and breaker counts."""

from __future__ import annotations

import json

from lodger._pinned import CompactionFold, pinned_items
from lodger.events import (
    Body,
    Compacted,
    CompactionFailed,
    Event,
    FileExpectation,
    PermissionDecided,
    PermissionRequested,
    Prefix,
    ToolDispatched,
    ToolResponded,
    TurnEnded,
    TurnStarted,
)


def _events(*bodies: tuple[Body, str | None]) -> list[Event]:
    return [
        Event(offset=i, session_id="s", id=f"e{i}", ts=i, body=body, call_id=call)
        for i, (body, call) in enumerate(bodies)
    ]


def _write(path: str, sha: str) -> ToolDispatched:
    return ToolDispatched(
        operation_id=f"op-{path}-{sha}",
        tool="write_file",
        arguments={"path": path},
        expectations=(FileExpectation(path=path, before_sha256=None, after_sha256=sha),),
    )


def _todo(*items: tuple[str, str]) -> ToolDispatched:
    return ToolDispatched(
        operation_id="op-todo",
        tool="todo_write",
        arguments={
            "items": [{"text": t, "status": s} for t, s in items],
            "expected_revision": 0,
        },
    )


def _ok(op: str, status: str = "ok") -> ToolResponded:
    return ToolResponded(operation_id=op, status=status, content="")  # type: ignore[arg-type]


COVERS = Prefix(high_water=1, digest="d")
EVENTS = _events(
    (TurnStarted(input="fix the bug"), None),
    (PermissionRequested(tool="shell", summary="rm -rf build"), "c1"),
    (PermissionDecided(tool="shell", decision="park", by="default"), "c1"),
    (PermissionRequested(tool="shell", summary="ls"), "c2"),
    (PermissionDecided(tool="shell", decision="allow", by="policy"), "c2"),
    (_write("a.py", "aaa"), "c3"),
    (_ok("op-a.py-aaa"), "c3"),
    (_write("b.py", "bbb"), "c4"),
    (_ok("op-b.py-bbb", "error"), "c4"),  # failed: b.py is not pinned
    (_todo(("one", "done"), ("two", "pending")), "c5"),
    (_ok("op-todo"), "c5"),
    (_write("a.py", "a2"), "c6"),
    (_ok("op-a.py-a2"), "c6"),
    (
        CompactionFailed(covers=COVERS, trigger="overflow", attempts=2, reason="x"),
        None,
    ),
)


def test_pins_follow_the_log() -> None:
    pinned = pinned_items(EVENTS)
    assert pinned.turn_input == "fix the bug"
    assert pinned.waiting == (("c1", "shell"),)  # parked, not decided; c2 was allowed
    assert pinned.files == (("a.py", "a2"),)
    assert pinned.todos == ("[pending] two",)
    assert pinned.labels() == ("turn_input", "todo:[pending] two", "file:a.py", "approval:c1")


def test_the_breaker_counts_and_a_turns_end_resets_them() -> None:
    fold = CompactionFold()
    for e in EVENTS:
        fold.feed(e)
    assert (fold.made, fold.failed) == (1, True)
    summary = Compacted(
        covers=COVERS, summary="s", model="m", prompt_sha256="p",
        tokens_before=2, tokens_after=1, trigger="manual",
    )  # fmt: skip
    more = _events((summary, None), (TurnEnded(status="completed"), None))
    fold.feed(more[0])
    assert (fold.made, fold.failed) == (2, False)
    fold.feed(more[1])
    assert (fold.made, fold.failed) == (0, False) and fold.pinned().turn_input is None


def test_an_exported_fold_restores_to_the_same_state() -> None:
    for n in range(len(EVENTS) + 1):
        fold = CompactionFold()
        for e in EVENTS[:n]:
            fold.feed(e)
        again = CompactionFold.restore(json.loads(json.dumps(fold.export())))
        assert again.pinned() == fold.pinned()
        assert (again.made, again.failed) == (fold.made, fold.failed)
        for e in EVENTS[n:]:  # and both go on alike
            fold.feed(e)
            again.feed(e)
        assert again.pinned() == fold.pinned()


def test_a_call_that_settles_after_the_compaction_reaches_the_model_as_a_note() -> None:
    """A call parked for an approval when the session was compacted and answered after:
    its output was summarized away, so its result is a runtime note, never a tool result
    without its call."""
    from lodger.context import Projector, project_messages
    from lodger.events import ModelOutput, ProposedCall, RunEnded
    from lodger.providers.base import ToolResultMessage, UserMessage

    call = ProposedCall(call_id="c1", name="deploy", arguments="{}")
    summary = Compacted(
        covers=Prefix(high_water=5, digest="d"), summary="## Goal\ndeploy", model="m",
        prompt_sha256="p", tokens_before=9, tokens_after=3, trigger="manual",
    )  # fmt: skip
    events = _events(
        (TurnStarted(input="deploy it"), None),
        (ModelOutput(text="", calls=(call,)), None),
        (PermissionRequested(tool="deploy", summary="deploy"), "c1"),
        (PermissionDecided(tool="deploy", decision="park", by="default"), "c1"),
        (RunEnded(status="interrupted"), None),
        (summary, None),
        (ToolDispatched(operation_id="op1", tool="deploy", arguments={}), "c1"),
        (ToolResponded(operation_id="op1", status="ok", content="deployed v2"), "c1"),
    )
    messages = project_messages(events).messages
    assert not any(isinstance(m, ToolResultMessage) for m in messages)
    notes = [m.text for m in messages if isinstance(m, UserMessage)]
    assert "call c1 (deploy)" in notes[0]  # pinned while it waited
    assert notes[1] == "The call c1 proposed before the summary returned: deployed v2"
    growing: list[Event] = []
    projector = Projector(growing)
    for e in events:
        growing.append(e)
        projector.project()
    assert projector.project() == project_messages(events)

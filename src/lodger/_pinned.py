"""What a compaction pins: the items the model keeps seeing above the newest summary.

A pure function of the events a compaction covers (``pinned_items``): the input of the
turn open at its high-water mark, the open items of the todo list the last successful
``todo_write`` left, every file a completed call wrote with the hash it left, and the
calls still waiting for an approval. ``render_head`` writes them, with the summary, as
the one runtime message the projection puts first (``lodger.context``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lodger.events import (
    Event,
    PermissionDecided,
    PermissionRequested,
    ToolDispatched,
    ToolResponded,
    TurnEnded,
    TurnStarted,
)

__all__ = ["Pinned", "pinned_items", "render_head"]

#: the tool whose arguments hold a todo list (``lodger.tools.todo``)
TODO_WRITE = "todo_write"


@dataclass(frozen=True, kw_only=True)
class Pinned:
    """The items a compaction keeps in view."""

    turn_input: str | None = None
    todos: tuple[str, ...] = ()
    #: (path, sha256 after the last write; None: deleted)
    files: tuple[tuple[str, str | None], ...] = ()
    #: (call id, tool) of the calls waiting for an approval
    waiting: tuple[tuple[str, str], ...] = ()

    def labels(self) -> tuple[str, ...]:
        """What was pinned, as the ``compacted`` fact lists it."""
        out: list[str] = []
        if self.turn_input is not None:
            out.append("turn_input")
        out += [f"todo:{t}" for t in self.todos]
        out += [f"file:{p}" for p, _ in self.files]
        out += [f"approval:{c}" for c, _ in self.waiting]
        return tuple(out)


def _todo_items(arguments: object) -> tuple[str, ...]:
    if not isinstance(arguments, dict):
        return ()
    items = arguments.get("items")
    if not isinstance(items, list):
        return ()
    out: list[str] = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            status = item.get("status", "pending")
            if status != "done":
                out.append(f"[{status}] {item['text']}")
    return tuple(out)


def pinned_items(events: Sequence[Event]) -> Pinned:
    """The pinned items of the prefix ``events`` (in log order)."""
    turn: tuple[str | None, str] | None = None
    dispatched: dict[str, ToolDispatched] = {}
    todos: tuple[str, ...] = ()
    files: dict[str, str | None] = {}
    asked: dict[str, str] = {}
    for e in events:
        body = e.body
        if isinstance(body, TurnStarted):
            turn = (e.turn_id, body.input)
        elif isinstance(body, TurnEnded):
            turn = None
        elif isinstance(body, ToolDispatched) and e.call_id is not None:
            dispatched[e.call_id] = body
        elif isinstance(body, ToolResponded) and e.call_id is not None:
            t1 = dispatched.get(e.call_id)
            if t1 is None or body.status != "ok":
                continue
            if t1.tool == TODO_WRITE:
                todos = _todo_items(t1.arguments)
            for x in t1.expectations:
                files.pop(x.path, None)  # the last write goes last
                files[x.path] = x.after_sha256
        elif isinstance(body, PermissionRequested) and e.call_id is not None:
            asked[e.call_id] = body.tool
        elif (
            isinstance(body, PermissionDecided)
            and e.call_id is not None
            and body.decision != "park"
        ):
            asked.pop(e.call_id, None)
    return Pinned(
        turn_input=turn[1] if turn is not None else None,
        todos=todos,
        files=tuple(files.items()),
        waiting=tuple(asked.items()),
    )


def render_head(pinned: Pinned, summary: str) -> str:
    """The runtime message that stands for a compacted prefix."""
    parts = [
        "The conversation before this point was compacted into the summary below; the "
        "full history is in the session's log (the recall tool fetches a fact back)."
    ]
    if pinned.turn_input is not None:
        parts.append(f"## Task of the current turn\n{pinned.turn_input}")
    if pinned.todos:
        parts.append("## Open todo items\n" + "\n".join(f"- {t}" for t in pinned.todos))
    if pinned.files:
        lines = [
            f"- {path} (sha256 {sha[:12]})" if sha is not None else f"- {path} (deleted)"
            for path, sha in pinned.files
        ]
        parts.append("## Files edited\n" + "\n".join(lines))
    if pinned.waiting:
        lines = [f"- call {c} ({tool})" for c, tool in pinned.waiting]
        parts.append("## Calls waiting for an approval\n" + "\n".join(lines))
    parts.append(f"## Summary\n{summary}")
    return "\n\n".join(parts)

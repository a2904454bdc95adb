"""What a compaction pins: the items the model keeps seeing above the newest summary.

A pure function of the events a compaction covers (``pinned_items``, folded as events
come by ``CompactionFold``): the input of the turn open at its high-water mark, the
open items of the todo list the last successful ``todo_write`` left, every file a
completed call wrote with the hash it left, and the calls still waiting for an
approval. ``render_head`` writes them, with the summary, as the one runtime message the
projection puts first (``lodger.context``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lodger.events import (
    Event,
    PermissionDecided,
    PermissionRequested,
    ToolDispatched,
    ToolResponded,
    TurnStarted,
)

__all__ = [
    "CompactionFold",
    "Pinned",
    "pinned_from",
    "pinned_items",
    "pinned_plain",
    "render_head",
]

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


class CompactionFold:
    """What compaction reads of a log, folded one event at a time (the projector feeds
    it every event, so nothing is read twice and a checkpoint keeps it): the items a
    compaction would pin now, and what the circuit breaker counts since the last turn
    ended (compactions and failures, and whether the newest attempt failed)."""

    __slots__ = ("_asked", "_files", "_pending", "_todos", "_turn", "failed", "made")

    def __init__(self) -> None:
        self._turn: str | None = None  # the open turn's input
        #: call id -> (the todo items its arguments hold, or None; its file expectations)
        self._pending: dict[str, tuple[tuple[str, ...] | None, tuple[tuple[str, str | None], ...]]]
        self._pending = {}
        self._todos: tuple[str, ...] = ()
        self._files: dict[str, str | None] = {}
        self._asked: dict[str, str] = {}
        #: ``compacted`` and ``compaction_failed`` facts since the last ``turn_ended``
        self.made = 0
        #: whether the newest of them (since the last ``turn_ended``) is a failure
        self.failed = False

    def feed(self, e: Event) -> None:
        body = e.body
        kind = body.kind
        if kind == "tool_dispatched":
            assert isinstance(body, ToolDispatched)
            if e.call_id is not None and (body.tool == TODO_WRITE or body.expectations):
                todos = _todo_items(body.arguments) if body.tool == TODO_WRITE else None
                files = tuple((x.path, x.after_sha256) for x in body.expectations)
                self._pending[e.call_id] = (todos, files)
        elif kind == "tool_responded":
            assert isinstance(body, ToolResponded)
            pending = self._pending.pop(e.call_id, None) if e.call_id is not None else None
            if pending is not None and body.status == "ok":
                todos, files = pending
                if todos is not None:
                    self._todos = todos
                for path, sha in files:
                    self._files.pop(path, None)  # the last write goes last
                    self._files[path] = sha
        elif kind == "turn_started":
            assert isinstance(body, TurnStarted)
            self._turn = body.input
        elif kind == "turn_ended":
            self._turn, self.made, self.failed = None, 0, False
        elif kind == "permission_requested" and e.call_id is not None:
            assert isinstance(body, PermissionRequested)
            self._asked[e.call_id] = body.tool
        elif kind == "permission_decided" and e.call_id is not None:
            assert isinstance(body, PermissionDecided)
            if body.decision != "park":
                self._asked.pop(e.call_id, None)
        elif kind == "compacted":
            self.made, self.failed = self.made + 1, False
        elif kind == "compaction_failed":
            self.made, self.failed = self.made + 1, True

    def pinned(self) -> Pinned:
        """The items a compaction of the events fed so far pins."""
        return Pinned(
            turn_input=self._turn,
            todos=self._todos,
            files=tuple(self._files.items()),
            waiting=tuple(self._asked.items()),
        )

    def export(self) -> dict[str, Any]:
        return {
            "turn": self._turn,
            "pending": [[c, t, [list(f) for f in fs]] for c, (t, fs) in self._pending.items()],
            "todos": list(self._todos),
            "files": [[p, sha] for p, sha in self._files.items()],
            "asked": [[c, t] for c, t in self._asked.items()],
            "made": self.made,
            "failed": self.failed,
        }

    @classmethod
    def restore(cls, data: Mapping[str, Any]) -> CompactionFold:
        """``export``'s inverse; ``TypeError`` or ``ValueError`` on values it cannot have made."""
        fold = cls()
        turn = data["turn"]
        if turn is not None and type(turn) is not str:
            raise TypeError("compaction fold: the turn's input is not text")
        fold._turn = turn
        for call_id, todos, files in data["pending"]:
            fold._pending[_text(call_id)] = (
                None if todos is None else tuple(_text(t) for t in todos),
                tuple((_text(p), _sha(sha)) for p, sha in files),
            )
        fold._todos = tuple(_text(t) for t in data["todos"])
        fold._files = {_text(p): _sha(sha) for p, sha in data["files"]}
        fold._asked = {_text(c): _text(t) for c, t in data["asked"]}
        made = data["made"]
        if type(made) is not int or made < 0:
            raise ValueError("compaction fold: a bad count")
        fold.made, fold.failed = made, data["failed"] is True
        return fold


def _text(value: object) -> str:
    if type(value) is not str:
        raise TypeError("compaction fold: a value is not text")
    return value


def _sha(value: object) -> str | None:
    return None if value is None else _text(value)


def pinned_plain(pinned: Pinned) -> dict[str, Any]:
    return {
        "turn_input": pinned.turn_input,
        "todos": list(pinned.todos),
        "files": [list(f) for f in pinned.files],
        "waiting": [list(w) for w in pinned.waiting],
    }


def pinned_from(data: Mapping[str, Any]) -> Pinned:
    turn = data["turn_input"]
    return Pinned(
        turn_input=None if turn is None else _text(turn),
        todos=tuple(_text(t) for t in data["todos"]),
        files=tuple((_text(p), _sha(sha)) for p, sha in data["files"]),
        waiting=tuple((_text(c), _text(t)) for c, t in data["waiting"]),
    )


def pinned_items(events: Iterable[Event]) -> Pinned:
    """The pinned items of the prefix ``events`` (in log order)."""
    fold = CompactionFold()
    for e in events:
        fold.feed(e)
    return fold.pinned()


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

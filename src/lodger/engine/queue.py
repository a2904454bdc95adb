"""The follow-up queue and the steers of a turn, as pure functions of the log.

``queued_messages`` folds ``message_queued`` and ``queue_changed`` facts into the queue in
the order it runs: ``interrupt`` and ``rollback`` messages go ahead of the ``enqueue``
ones (behind earlier urgent ones), and each change edits, moves, retracts or delivers
one message (a change that finds no message changes nothing). ``pending_steers`` are
the steers of the open turn no step has carried yet. ``lodger.engine.steering`` says how
these facts are made.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from lodger.errors import UsageError
from lodger.events import (
    Event,
    MessageQueued,
    QueueChanged,
    QueuePolicy,
    SteerDelivered,
    SteerReceived,
)

__all__ = [
    "MAX_TEXT",
    "POLICIES",
    "QueuedMessage",
    "Steered",
    "StopRequest",
    "check_message",
    "fold_queue",
    "logged_steer_ids",
    "pending_steers",
    "queued_messages",
]

#: every follow-up policy, the default first
POLICIES: tuple[QueuePolicy, ...] = get_args(QueuePolicy)
_URGENT = ("interrupt", "rollback")
#: the longest text a steer or a queued message may carry
MAX_TEXT = 100_000


@dataclass(frozen=True, kw_only=True)
class QueuedMessage:
    """A message waiting in the session's follow-up queue (``queued_messages``)."""

    message_id: str
    text: str
    policy: QueuePolicy
    who: str | None
    #: the offset of its ``message_queued`` fact
    offset: int

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> QueuedMessage:
        """``to_dict``'s inverse (a fold checkpoint's), checking every value's type."""
        message_id, text, policy = data["message_id"], data["text"], data["policy"]
        who, offset = data["who"], data["offset"]
        if type(message_id) is not str or type(text) is not str or type(offset) is not int:
            raise TypeError("queue: a queued message holds a bad value")
        if who is not None and type(who) is not str:
            raise TypeError("queue: a queued message's author is not text")
        return cls(
            message_id=message_id,
            text=text,
            policy=check_message(text or " ", str(policy)),
            who=who,
            offset=offset,
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "message_id": self.message_id,
            "text": self.text,
            "policy": self.policy,
            "who": self.who,
            "offset": self.offset,
        }


@dataclass(frozen=True, kw_only=True)
class Steered:
    """What became of a steer: ``steer`` (committed for the running turn, delivered at
    its next provider boundary) or ``queued`` (no turn was running, or it had taken its
    last step: the message is the session's next turn)."""

    steer_id: str
    status: Literal["steer", "queued"]
    #: the offset of its fact (None: a worker commits it, ``lodger.runtime.worker``)
    offset: int | None

    def to_dict(self) -> dict[str, object]:
        return {"steer_id": self.steer_id, "status": self.status, "offset": self.offset}


@dataclass(frozen=True, kw_only=True)
class StopRequest:
    """A queued message that asked the running turn to stop (``interrupt``/``rollback``)."""

    message_id: str
    policy: QueuePolicy

    @property
    def reason(self) -> str:
        verb = "rolled back" if self.policy == "rollback" else "interrupted"
        return f"{verb} for queued message {self.message_id}"


def check_message(text: str, policy: str = "enqueue") -> QueuePolicy:
    """Refuse an empty or oversized text and an unknown policy with a clear error."""
    if not isinstance(text, str) or not text:
        raise UsageError("a steer or queued message needs some text", code="empty_message")
    if len(text) > MAX_TEXT:
        raise UsageError(
            f"the message is {len(text)} characters; at most {MAX_TEXT} are taken",
            hint="send a shorter message, or attach the rest as a file",
            code="message_too_long",
        )
    for known in POLICIES:
        if policy == known:
            return known
    raise UsageError(
        f"unknown queue policy {policy!r}",
        hint="use one of: " + ", ".join(POLICIES),
        code="queue_policy",
    )


def pending_steers(events: Sequence[Event], start: int | None) -> list[SteerReceived]:
    """The steers of the turn that started at offset ``start`` that no step has carried
    yet and that were not queued as the next turn (none when no turn is open)."""
    if start is None:
        return []
    waiting: dict[str, SteerReceived] = {}
    turn_id = events[start].turn_id
    for e in events[start:]:
        body = e.body
        if isinstance(body, SteerReceived) and e.turn_id == turn_id:
            waiting[body.steer_id] = body
        elif isinstance(body, SteerDelivered):
            for steer_id in body.steer_ids:
                waiting.pop(steer_id, None)
        elif isinstance(body, MessageQueued):
            waiting.pop(body.message_id, None)
    return list(waiting.values())


def queued_messages(events: Iterable[Event]) -> list[QueuedMessage]:
    """The session's follow-up queue after ``events``, in the order it runs."""
    queue: list[QueuedMessage] = []
    for e in events:
        if isinstance(e.body, (MessageQueued, QueueChanged)):
            fold_queue(queue, e)
    return queue


def fold_queue(queue: list[QueuedMessage], e: Event) -> None:
    """Apply one ``message_queued`` or ``queue_changed`` fact to ``queue`` in place."""
    body = e.body
    if isinstance(body, MessageQueued):
        message = QueuedMessage(
            message_id=body.message_id,
            text=body.text,
            policy=body.policy,
            who=body.who,
            offset=e.offset,
        )
        if body.policy in _URGENT:  # ahead of the waiting ones, behind earlier urgent ones
            at = next((i for i, m in enumerate(queue) if m.policy not in _URGENT), len(queue))
            queue.insert(at, message)
        else:
            queue.append(message)
    elif isinstance(body, QueueChanged):
        _apply_change(queue, body)


def _apply_change(queue: list[QueuedMessage], change: QueueChanged) -> None:
    index = next((i for i, m in enumerate(queue) if m.message_id == change.message_id), None)
    if index is None:
        return  # delivered or retracted already: a later change finds nothing to change
    if change.action == "edit" and change.text is not None:
        old = queue[index]
        queue[index] = QueuedMessage(
            message_id=old.message_id,
            text=change.text,
            policy=old.policy,
            who=old.who,
            offset=old.offset,
        )
    elif change.action == "move" and change.position is not None:
        moved = queue.pop(index)
        queue.insert(max(0, min(change.position, len(queue))), moved)
    elif change.action in ("retract", "delivered"):
        del queue[index]


def logged_steer_ids(events: Iterable[Event], wanted: Iterable[str]) -> set[str]:
    """Which of the ``wanted`` steer ids the log holds already (received, or queued as a
    message): a steer relayed twice (a worker died before forgetting it) commits once."""
    wanted = set(wanted)
    found: set[str] = set()
    if not wanted:
        return found
    for e in events:
        body = e.body
        if isinstance(body, SteerReceived) and body.steer_id in wanted:
            found.add(body.steer_id)
        elif isinstance(body, MessageQueued) and body.message_id in wanted:
            found.add(body.message_id)
    return found

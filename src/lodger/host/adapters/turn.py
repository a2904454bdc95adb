"""One turn, as a front end sees it: the moves its facts and text deltas make.

``TurnMoves.take(item)`` is fed the session's stream (facts, deltas) from some offset
and returns what the item adds: text of a part, a call with its input, a question for an
approval, a call's result or refusal, and finally the end. It follows the first turn it
meets (or the one it is told), ignores the others, and ends when that turn settles, when
its run ends without settling it (parked, interrupted), or when everything the turn does
now waits for an approval (the front end answers, and a new stream continues from
``next_offset``, as the Vercel AI SDK's tool approvals and AG-UI's interrupts expect).

Text: a step's deltas are one part (its id is the step's); when the step's
``model_output`` commits, whatever of its text the deltas did not carry follows (deltas
are a prefix of it: ``lodger.host.feed``), so the text a front end assembles is the
committed text even when deltas were dropped. A step whose deltas disagree with its
committed text (a provider retried mid-stream) gets its committed text as a second part.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lodger.events import (
    CallRejected,
    Event,
    ModelOutput,
    PermissionDecided,
    PermissionRequested,
    RunEnded,
    ToolDispatched,
    ToolResponded,
    TurnEnded,
)
from lodger.host.feed import LiveText

__all__ = [
    "ApprovalAsked",
    "Began",
    "CallDenied",
    "CallFailed",
    "CallProposed",
    "CallResult",
    "Ended",
    "Move",
    "Reasoning",
    "StepBegan",
    "Text",
    "TextDone",
    "TurnMoves",
]


@dataclass(frozen=True, slots=True)
class Began:
    """The followed turn's first fact or delta."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class StepBegan:
    step_id: str


@dataclass(frozen=True, slots=True)
class Text:
    """More text of part ``part_id`` (opened by its first piece)."""

    part_id: str
    text: str


@dataclass(frozen=True, slots=True)
class TextDone:
    part_id: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    """A step's whole reasoning text, once its output commits."""

    part_id: str
    text: str


@dataclass(frozen=True, slots=True)
class CallProposed:
    """A call the model (or a code cell) proposed. ``input`` is its arguments parsed;
    ``valid`` is False when they are not a JSON object (``arguments`` is what came)."""

    call_id: str
    name: str
    arguments: str
    input: Any
    valid: bool
    parent_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalAsked:
    call_id: str
    tool: str
    summary: str


@dataclass(frozen=True, slots=True)
class CallDenied:
    call_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class CallFailed:
    """Refused before dispatch, or it ran and failed (``message`` says why)."""

    call_id: str
    message: str


@dataclass(frozen=True, slots=True)
class CallResult:
    """A call's result (T2): ``output`` is its content parsed as JSON where it is JSON."""

    call_id: str
    content: str
    output: Any


@dataclass(frozen=True, slots=True)
class Ended:
    """The stream of the turn ends. ``status``: the turn's end (``completed``,
    ``failed``, ``cancelled``, ``step_limit``, ``abandoned``), its run's when that left
    it open (``parked``, ``interrupted``), or ``waiting_for_approval``."""

    status: str
    error: str | None
    answer: str | None
    next_offset: int
    #: the calls waiting for an answer (``waiting_for_approval``)
    asking: tuple[ApprovalAsked, ...] = ()


Move = (
    Began
    | StepBegan
    | Text
    | TextDone
    | Reasoning
    | CallProposed
    | ApprovalAsked
    | CallDenied
    | CallFailed
    | CallResult
    | Ended
)

#: how a run's end leaves its turn open, so the stream ends with it
_OPEN_RUN_ENDS = frozenset({"parked", "interrupted"})


@dataclass
class TurnMoves:
    """Follows one turn (``turn_id``, or the first one met). ``known`` are call ids the
    front end has already been told about (a continuation after an approval)."""

    turn_id: str | None = None
    known: set[str] = field(default_factory=set)
    #: call ids whose outcome the front end has already been told
    settled: set[str] = field(default_factory=set)
    next_offset: int = 0
    done: bool = False
    _began: bool = False
    _step: str | None = None
    _streamed: dict[str, str] = field(default_factory=dict)  # step -> text the deltas said
    _written: set[str] = field(default_factory=set)  # steps whose output committed
    _open_text: str | None = None
    _in_flight: set[str] = field(default_factory=set)
    _asking: dict[str, ApprovalAsked] = field(default_factory=dict)
    _error: str | None = None

    def take(self, item: Event | LiveText) -> list[Move]:
        """The moves ``item`` adds (none once ``done``)."""
        if self.done:
            return []
        if isinstance(item, Event):
            self.next_offset = max(self.next_offset, item.offset + 1)
        turn_id = item.turn_id
        if turn_id is None or (self.turn_id is not None and turn_id != self.turn_id):
            return []
        moves: list[Move] = []
        if not self._began:
            self._began, self.turn_id = True, turn_id
            moves.append(Began(turn_id))
        if isinstance(item, LiveText):
            if item.step_id in self._written:
                return moves  # a late delta of a step whose text was told whole
            moves += self._step_of(item.step_id)
            moves += self._delta(item)
            return moves
        moves += self._fact(item)
        if not self.done and self._asking and not self._in_flight:
            moves += self._close_text()
            moves.append(self._end("waiting_for_approval"))
        return moves

    def _step_of(self, step_id: str | None) -> list[Move]:
        if step_id is None or step_id == self._step:
            return []
        moves = self._close_text()
        self._step = step_id
        moves.append(StepBegan(step_id))
        return moves

    def _close_text(self) -> list[Move]:
        if self._open_text is None:
            return []
        part, self._open_text = self._open_text, None
        return [TextDone(part)]

    def _delta(self, delta: LiveText) -> list[Move]:
        self._streamed[delta.step_id] = self._streamed.get(delta.step_id, "") + delta.text
        self._open_text = delta.step_id
        return [Text(delta.step_id, delta.text)]

    def _fact(self, event: Event) -> list[Move]:
        body = event.body
        if isinstance(body, ModelOutput):
            return [*self._step_of(event.step_id), *self._output(event, body)]
        if event.kind == "step_started":
            return self._step_of(event.step_id)
        call_id = event.call_id
        if isinstance(body, TurnEnded):
            self._error = self._error or body.reason
            return [*self._close_text(), self._end(body.status, answer=body.answer)]
        if isinstance(body, RunEnded):
            self._error = body.error or self._error
            if body.status in _OPEN_RUN_ENDS:
                return [*self._close_text(), self._end(body.status)]
            return []
        if call_id is None:
            return []
        return self._call_fact(event, call_id)

    def _call_fact(self, event: Event, call_id: str) -> list[Move]:
        body = event.body
        if isinstance(body, ToolDispatched):
            self._in_flight.add(call_id)
            if call_id in self.known:
                return []
            self.known.add(call_id)
            raw = json.dumps(body.arguments, ensure_ascii=False)
            return [
                CallProposed(call_id, body.tool, raw, body.arguments, True, event.parent_call_id)
            ]
        if call_id not in self.known:
            return []  # a call proposed before this stream began: the front end has none
        if isinstance(body, PermissionRequested):
            asked = ApprovalAsked(call_id, body.tool, body.summary)
            self._asking[call_id] = asked
            return [asked]
        if isinstance(body, PermissionDecided):
            if body.decision == "park":
                return []  # still waits: answered outside the run
            self._asking.pop(call_id, None)
            if body.decision == "deny":
                self.settled.add(call_id)
                return [CallDenied(call_id, body.reason or "denied")]
            return []
        if call_id in self.settled:
            return []
        if isinstance(body, CallRejected):
            self.settled.add(call_id)
            if body.reason == "denied":
                return [CallDenied(call_id, body.message)]
            return [CallFailed(call_id, body.message)]
        if isinstance(body, ToolResponded):
            self._in_flight.discard(call_id)
            self.settled.add(call_id)
            if body.status == "ok":
                return [CallResult(call_id, body.content, _parsed(body.content))]
            if body.status == "denied":
                return [CallDenied(call_id, body.content)]
            return [CallFailed(call_id, body.content or body.status)]
        return []

    def _output(self, event: Event, body: ModelOutput) -> list[Move]:
        step = event.step_id or f"output-{event.offset}"
        self._written.add(step)
        moves: list[Move] = []
        if body.reasoning:
            moves.append(Reasoning(f"{step}:reasoning", body.reasoning))
        streamed = self._streamed.pop(step, "")
        if body.text.startswith(streamed):
            rest = body.text[len(streamed) :]
            if rest:
                self._open_text = step
                moves.append(Text(step, rest))
        elif body.text:  # the deltas said something else: the committed text as its own part
            moves += self._close_text()
            self._open_text = f"{step}:output"
            moves.append(Text(f"{step}:output", body.text))
        moves += self._close_text()
        for call in body.calls:
            if call.call_id in self.known:
                continue
            self.known.add(call.call_id)
            parsed, valid = _arguments(call.arguments)
            moves.append(CallProposed(call.call_id, call.name, call.arguments, parsed, valid))
        return moves

    def _end(self, status: str, *, answer: str | None = None) -> Ended:
        self.done = True
        error = self._error if status not in ("completed", "waiting_for_approval") else None
        return Ended(status, error, answer, self.next_offset, tuple(self._asking.values()))


def _parsed(content: str) -> Any:
    """A result's content as JSON where it is JSON, else the text."""
    try:
        return json.loads(content)
    except (ValueError, RecursionError):
        return content


def _arguments(raw: str) -> tuple[Any, bool]:
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        return raw, False
    return parsed, isinstance(parsed, dict)

"""The timeline projection: a session's events folded into a tree for people to read.

A pure function of a list of events (DESIGN L6): turns hold runs, runs hold steps, steps
hold model output and the calls it proposed. Every fact about a call (rejection,
permission, T1 dispatch, T2 response, recovery, operator decision) is grouped under the
call by ``call_id`` (or by ``operation_id`` when a recovery fact names only the
operation), and nested code-mode calls hang under the cell that made them through
``parent_call_id``. Nothing here renders or does I/O, so the tree can be tested and reused
by other views (a web UI, ``lodger watch``).

Inside a node, children keep log order; only grouping moves a fact away from its offset.
The tree never invents facts: a call without T2 stays without a response.

A long session is shown a page at a time: :func:`index_turns` finds where each turn starts
without decoding the whole log, and :func:`select_page` picks turns by number. A turn's
page is its offsets, from its ``turn_started`` up to the next one: a fact appended later
about an earlier turn's call shows on the page where it was appended.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from lodger.errors import UsageError
from lodger.events import (
    CallAccepted,
    CallRejected,
    Event,
    ModelOutput,
    OperatorDecision,
    PermissionDecided,
    PermissionRequested,
    RecoveryDecided,
    RecoveryObserved,
    RunEnded,
    RunStarted,
    SessionStarted,
    StepStarted,
    ToolDispatched,
    ToolResponded,
    TurnEnded,
    TurnStarted,
)
from lodger.storage.eventlog import VerifiedRecords

__all__ = [
    "CallNode",
    "Item",
    "Page",
    "SessionSummary",
    "Span",
    "Timeline",
    "TurnIndex",
    "build_timeline",
    "index_turns",
    "number_runs",
    "page_events",
    "select_page",
    "summarize",
    "summarize_verified",
]

_UNKNOWN_TOOL = "?"


@dataclass(slots=True)
class Span:
    """A turn, run or step: the event that opened it and everything that happened inside."""

    event: Event
    children: list[Item] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.event.kind

    def ended(self) -> Event | None:
        """The ``run_ended`` / ``turn_ended`` fact that closed this span, if any."""
        for child in reversed(self.children):
            if isinstance(child, Event) and isinstance(child.body, RunEnded | TurnEnded):
                return child
        return None

    def status(self) -> str:
        """How the span ended: its end status, or ``interrupted`` when it never ended.

        A turn without ``turn_ended`` reports its last run's end (``parked``, ``failed``)
        when that run ended; a turn or run with no end at all was interrupted (or is
        still running; the log alone cannot tell).
        """
        end = self.ended()
        if end is not None and isinstance(end.body, RunEnded | TurnEnded):
            return end.body.status
        if isinstance(self.event.body, TurnStarted):
            runs = [c for c in self.children if isinstance(c, Span) and c.kind == "run_started"]
            if runs and runs[-1].ended() is not None:
                return runs[-1].status()
        return "interrupted"


@dataclass(slots=True)
class CallNode:
    """One call and every fact about it, in log order; nested calls are ``children``."""

    call_id: str
    name: str
    arguments: str | None = None
    """The raw argument JSON the model proposed (``None`` for code-mode calls)."""
    proposed_by: Event | None = None
    parent_call_id: str | None = None
    facts: list[Event] = field(default_factory=list)
    children: list[CallNode] = field(default_factory=list)

    @property
    def offset(self) -> int:
        """Where the call first appears: its proposal, else its first fact."""
        if self.proposed_by is not None:
            return self.proposed_by.offset
        return self.facts[0].offset if self.facts else -1

    @property
    def hidden(self) -> bool:
        return any(fact.visibility == "hidden" for fact in self.facts)

    @property
    def origin(self) -> str:
        source = self.proposed_by or (self.facts[0] if self.facts else None)
        return source.origin if source is not None else "provider"

    def dispatched(self) -> Event | None:
        """The first T1 fact (a retry adds another; the first one starts the call)."""
        return next((f for f in self.facts if isinstance(f.body, ToolDispatched)), None)

    def responded(self) -> Event | None:
        """The last T2 fact."""
        return next((f for f in reversed(self.facts) if isinstance(f.body, ToolResponded)), None)

    def rejected(self) -> Event | None:
        return next((f for f in self.facts if isinstance(f.body, CallRejected)), None)

    def status(self) -> str:
        """``rejected``, the T2 status, ``running`` (the remote side accepted it, no T2
        yet), ``dispatched`` (T1 without T2) or ``proposed``."""
        response = self.responded()
        if response is not None and isinstance(response.body, ToolResponded):
            return response.body.status
        if self.rejected() is not None:
            return "rejected"
        if any(isinstance(f.body, CallAccepted) for f in self.facts):
            return "running"
        if self.dispatched() is not None:
            return "dispatched"
        return "proposed"

    def interval(self) -> tuple[int | None, int | None]:
        """``(T1 ts, T2 ts)`` in microseconds; either may be missing."""
        start, end = self.dispatched(), self.responded()
        return (start.ts if start else None, end.ts if end else None)

    def dispatch_arguments(self) -> str | None:
        """The arguments as dispatched (canonical JSON), for calls with no proposal."""
        first = self.dispatched()
        if first is not None and isinstance(first.body, ToolDispatched):
            return json.dumps(first.body.arguments, sort_keys=True, ensure_ascii=False)
        return None


#: A timeline child: a span (turn, run, step), a call, or a plain fact.
Item: TypeAlias = Span | CallNode | Event


@dataclass(slots=True)
class Timeline:
    """The tree of one session's events; ``items`` are the top-level children."""

    session_id: str
    events: list[Event]
    items: list[Item] = field(default_factory=list)
    turns: list[Span] = field(default_factory=list)
    calls: dict[str, CallNode] = field(default_factory=dict)


def _tool_name(event: Event) -> str:
    body = event.body
    if isinstance(body, ToolDispatched | CallRejected | PermissionRequested | PermissionDecided):
        return body.tool
    return _UNKNOWN_TOOL


def _operation_id(event: Event) -> str | None:
    body = event.body
    if isinstance(
        body,
        ToolDispatched | ToolResponded | RecoveryObserved | RecoveryDecided | OperatorDecision,
    ):
        return body.operation_id
    return None


class _Builder:
    def __init__(self, session_id: str, events: list[Event]) -> None:
        self.timeline = Timeline(session_id=session_id, events=events)
        self.spans: dict[tuple[str, str], Span] = {}  # (kind, id) -> span
        self.operations: dict[str, str] = {}  # operation_id -> call_id

    def container(self, event: Event) -> list[Item]:
        """The innermost open span the event belongs to (step, run, turn, else the root)."""
        for kind, key in (
            ("step_started", event.step_id),
            ("run_started", event.run_id),
            ("turn_started", event.turn_id),
        ):
            if key is not None and (kind, key) in self.spans:
                return self.spans[(kind, key)].children
        return self.timeline.items

    def open_span(self, event: Event, key: str | None) -> None:
        span = Span(event)
        # A span sits in its parent span, never in itself: look up before registering.
        self.container(event).append(span)
        if key is not None:
            self.spans[(event.kind, key)] = span
        if isinstance(event.body, TurnStarted):
            self.timeline.turns.append(span)

    def call(self, call_id: str, event: Event) -> CallNode:
        node = self.timeline.calls.get(call_id)
        if node is None:
            node = CallNode(call_id, _tool_name(event), parent_call_id=event.parent_call_id)
            self.timeline.calls[call_id] = node
            parent = self.timeline.calls.get(event.parent_call_id or "")
            if parent is not None:
                parent.children.append(node)
            else:
                self.container(event).append(node)
        elif node.name == _UNKNOWN_TOOL:
            node.name = _tool_name(event)
        return node

    def add(self, event: Event) -> None:
        body = event.body
        if isinstance(body, TurnStarted):
            self.open_span(event, event.turn_id)
        elif isinstance(body, RunStarted):
            self.open_span(event, event.run_id)
        elif isinstance(body, StepStarted):
            self.open_span(event, event.step_id)
        elif isinstance(body, ModelOutput):
            self.container(event).append(event)
            for proposed in body.calls:
                node = self.call(proposed.call_id, event)
                node.name = proposed.name
                node.arguments = proposed.arguments
                node.proposed_by = event
        else:
            operation = _operation_id(event)
            call_id = event.call_id or self.operations.get(operation or "")
            if call_id is None:
                self.container(event).append(event)
                return
            if operation is not None and isinstance(body, ToolDispatched):
                self.operations[operation] = call_id
            self.call(call_id, event).facts.append(event)


def build_timeline(events: Sequence[Event]) -> Timeline:
    """Fold a session's events (in offset order) into a :class:`Timeline`.

    >>> timeline = build_timeline(await log.read_all("s1"))
    >>> [call.status() for call in timeline.calls.values()]
    ['ok', 'rejected']
    """
    ordered = list(events)
    builder = _Builder(ordered[0].session_id if ordered else "", ordered)
    for event in ordered:
        builder.add(event)
    return builder.timeline


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """One row of ``lodger sessions``."""

    session_id: str
    events: int
    turns: int
    last_status: str | None
    last_ts: int | None
    workspace: str | None


def summarize(session_id: str, events: Sequence[Event]) -> SessionSummary:
    """Count events and turns, and say how the last turn ended (see :meth:`Span.status`)."""
    timeline = build_timeline(events)
    workspace = next((e.body.workspace for e in events if isinstance(e.body, SessionStarted)), None)
    return SessionSummary(
        session_id=session_id,
        events=len(events),
        turns=len(timeline.turns),
        last_status=timeline.turns[-1].status() if timeline.turns else None,
        last_ts=events[-1].ts if events else None,
        workspace=workspace,
    )


# ---------------------------------------------------------------- pages of turns


@dataclass(frozen=True, slots=True)
class TurnIndex:
    """Where the turns of a log of ``high_water`` events start, in offset order.

    Turn ``n`` (numbered from 1) covers offsets ``[starts[n-1], starts[n])``, the last one
    up to ``high_water``; offsets before the first turn (``session_started``) are the
    preamble."""

    high_water: int
    starts: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.starts)

    def span(self, number: int) -> tuple[int, int]:
        """Offsets ``[start, end)`` of turn ``number``."""
        end = self.starts[number] if number < len(self.starts) else self.high_water
        return self.starts[number - 1], end

    def preamble(self) -> tuple[int, int]:
        return 0, self.starts[0] if self.starts else self.high_water

    def number_at(self, offset: int) -> int | None:
        """The number of the turn that starts at ``offset``, if one does."""
        i = bisect.bisect_left(self.starts, offset)
        return i + 1 if i < len(self.starts) and self.starts[i] == offset else None


_TURN_STARTED = b"turn_started"


def index_turns(verified: VerifiedRecords) -> TurnIndex:
    """Find every ``turn_started`` of a verified log, decoding only the candidates.

    Stored events are canonical JSON, which names the kind as written: only records whose
    bytes contain ``turn_started`` can be one, and those are decoded to make sure (text
    that merely mentions the word is decoded and dropped).
    """
    starts: list[int] = []
    for record in verified.records:
        if _TURN_STARTED in record.data:
            (event,) = verified.decode(record.offset, record.offset + 1)
            if isinstance(event.body, TurnStarted):
                starts.append(record.offset)
    return TurnIndex(high_water=len(verified), starts=tuple(starts))


@dataclass(frozen=True, slots=True)
class Page:
    """The turns shown (numbers, ascending) out of ``index``; the preamble always shows."""

    index: TurnIndex
    shown: tuple[int, ...]

    @property
    def complete(self) -> bool:
        return len(self.shown) == self.index.count

    def ranges(self) -> list[tuple[int, int]]:
        """The offset ranges to decode, in order, adjacent ones merged."""
        spans = [self.index.preamble(), *(self.index.span(n) for n in self.shown)]
        merged: list[tuple[int, int]] = []
        for start, end in spans:
            if start == end:
                continue
            if merged and merged[-1][1] == start:
                merged[-1] = (merged[-1][0], end)
            else:
                merged.append((start, end))
        return merged

    def hidden(self) -> list[tuple[int, int]]:
        """Runs of hidden turn numbers as inclusive ``(first, last)`` pairs."""
        shown = set(self.shown)
        return number_runs([n for n in range(1, self.index.count + 1) if n not in shown])


def number_runs(numbers: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending numbers as runs of consecutive ones: ``[1, 2, 3, 7]`` -> ``[(1, 3), (7, 7)]``."""
    runs: list[tuple[int, int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


def select_page(
    index: TurnIndex, *, turns: Sequence[int] = (), last: int | None = None, every: bool = False
) -> Page:
    """The page to show: ``every`` turn, the given ``turns``, the ``last`` N, or by default
    the last turn. A turn number outside the log is a usage error."""
    count = index.count
    if every:
        return Page(index, tuple(range(1, count + 1)))
    if turns:
        outside = sorted(n for n in set(turns) if not 1 <= n <= count)
        if outside:
            has = f"turns 1 to {count}" if count else "no turns"
            raise UsageError(
                f"the session has {has}; turn {outside[0]} is not one of them",
                hint="number turns from 1, as `lodger log show` prints them",
                code="invalid_range",
            )
        return Page(index, tuple(sorted(set(turns))))
    keep = 1 if last is None else last
    if keep < 1:
        raise UsageError(f"--last-turns takes 1 or more turns, not {keep}", code="invalid_range")
    return Page(index, tuple(range(max(count - keep, 0) + 1, count + 1)))


def page_events(verified: VerifiedRecords, page: Page) -> list[Event]:
    """The page's events, fully decoded, in offset order."""
    events: list[Event] = []
    for start, end in page.ranges():
        events += verified.decode(start, end)
    return events


def summarize_verified(verified: VerifiedRecords, index: TurnIndex) -> SessionSummary:
    """:func:`summarize` of a whole log, decoding only its preamble, last turn and last
    event: the same row at a fraction of the cost on a long session."""
    page = select_page(index)
    events = page_events(verified, page)
    timeline = build_timeline(events)
    last = verified.decode(len(verified) - 1)[0] if verified.records else None
    workspace = next((e.body.workspace for e in events if isinstance(e.body, SessionStarted)), None)
    return SessionSummary(
        session_id=verified.session_id,
        events=len(verified),
        turns=index.count,
        last_status=timeline.turns[-1].status() if timeline.turns else None,
        last_ts=last.ts if last is not None else None,
        workspace=workspace,
    )

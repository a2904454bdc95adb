"""What a replay did differently: a pure function of two logs.

A replay (``lodger.runtime.replay``) is a fork of a source session whose own log begins
with ``replay_started`` (the source, the offset it forked at, the model). Its report
compares the source's steps after that offset with the replay's own steps:

- the first step where the trajectories diverge (numbered from 1 across the replayed
  turns): a step diverges when it proposes other calls (tool and canonical arguments,
  in order), or, when neither proposes a call, answers other text; a trajectory that
  ends first diverges at the step after its last;
- the calls added and removed (as multisets of tool and arguments);
- each turn's final answer, side by side;
- tokens, requests and cost (micro-USD from the default price table; None when a model
  has no price) of each side;
- how the replay answered its calls (``call_replayed``: recorded, live, sandbox, parked).

Nothing here reads storage: the host's ``GET /v1/sessions/{id}/replay-report`` and the
CLI compute the same report from the same two logs.

>>> report = replay_report(source_events, replay_events)
>>> report.diverged_at.step if report.diverged_at else None
3
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lodger.engine.prices import PriceTable
from lodger.errors import ConfigError, UsageError
from lodger.events import (
    CallReplayed,
    Event,
    ModelOutput,
    ReplayStarted,
    RunStarted,
    TurnEnded,
    TurnStarted,
    canonical_json,
)

__all__ = [
    "Divergence",
    "ReplayReport",
    "Step",
    "refuse_replay",
    "replay_report",
    "replay_started_of",
]


@dataclass(frozen=True, kw_only=True)
class Step:
    """One model step of a trajectory: its turn (from 1), its place in the turn (from 1),
    the calls it proposed (tool, canonical JSON arguments) and its text."""

    turn: int
    turn_step: int
    calls: tuple[tuple[str, str], ...]
    text: str
    offset: int

    def signature(self) -> tuple[Any, ...]:
        return (self.calls,) if self.calls else ((), self.text)

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "turn_step": self.turn_step,
            "offset": self.offset,
            "calls": [{"tool": name, "arguments": json.loads(args)} for name, args in self.calls],
            "text": self.text,
        }


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """The first step (from 1) where the two trajectories differ; a side is None where
    its trajectory had already ended."""

    step: int
    source: Step | None
    replay: Step | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "source": None if self.source is None else self.source.to_dict(),
            "replay": None if self.replay is None else self.replay.to_dict(),
        }


@dataclass(frozen=True, kw_only=True)
class _Side:
    session_id: str
    model: str | None
    steps: tuple[Step, ...]
    answers: tuple[str | None, ...]
    input_tokens: int
    output_tokens: int
    requests: int
    cost_micro_usd: int | None

    def usage(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_micro_usd": self.cost_micro_usd,
        }


@dataclass(frozen=True, kw_only=True)
class ReplayReport:
    """The comparison of a replay with its source (see the module docstring)."""

    source: _Side
    replay: _Side
    source_offset: int
    policy: str
    diverged_at: Divergence | None
    added: tuple[tuple[str, str], ...]
    removed: tuple[tuple[str, str], ...]
    answered: dict[str, int] = field(default_factory=dict)

    @property
    def source_session(self) -> str:
        return self.source.session_id

    @property
    def replay_session(self) -> str:
        return self.replay.session_id

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON (what ``lodger replay --json`` writes and the host serves)."""
        turns = max(len(self.source.answers), len(self.replay.answers))
        return {
            "source_session": self.source.session_id,
            "replay_session": self.replay.session_id,
            "source_offset": self.source_offset,
            "policy": self.policy,
            "models": {"source": self.source.model, "replay": self.replay.model},
            "diverged_at": None if self.diverged_at is None else self.diverged_at.to_dict(),
            "steps": {"source": len(self.source.steps), "replay": len(self.replay.steps)},
            "calls": {
                "added": [_call_dict(c) for c in self.added],
                "removed": [_call_dict(c) for c in self.removed],
            },
            "answers": [
                {
                    "turn": n + 1,
                    "source": _at(self.source.answers, n),
                    "replay": _at(self.replay.answers, n),
                }
                for n in range(turns)
            ],
            "usage": {"source": self.source.usage(), "replay": self.replay.usage()},
            "answered": dict(self.answered),
        }


def _at(values: Sequence[str | None], n: int) -> str | None:
    return values[n] if n < len(values) else None


def _call_dict(call: tuple[str, str]) -> dict[str, Any]:
    return {"tool": call[0], "arguments": json.loads(call[1])}


def replay_started_of(events: Sequence[Event]) -> ReplayStarted | None:
    """The ``replay_started`` fact of a replay's own log (None: not a replay)."""
    for event in events[:3]:
        if isinstance(event.body, ReplayStarted):
            return event.body
    return None


def refuse_replay(session_id: str, events: Sequence[Event]) -> None:
    """Refuse to run a turn of a replay's session outside a replay, or to rewind it: a run
    there would bind the real tools, and its workspace facts are a scratch copy's, never to
    be restored over the session's workspace (fork the source instead)."""
    started = replay_started_of(events)
    if started is not None:
        raise UsageError(
            f"session {session_id!r} is a replay of {started.source_session!r}: it runs and "
            "rewinds only as a replay, never with the real tools or workspace",
            hint=f"replay {started.source_session!r} again, or fork it to go on for real",
            code="usage",
            session_id=session_id,
        )


def _canonical_args(raw: str) -> str:
    try:
        return canonical_json(json.loads(raw)).decode()
    except (ValueError, RecursionError):
        return raw  # a malformed call compares as the text the model sent


def _side(session_id: str, events: Sequence[Event], prices: PriceTable) -> _Side:
    steps: list[Step] = []
    answers: list[str | None] = []
    turn = turn_step = 0
    tokens_in = tokens_out = requests = 0
    cost: int | None = 0
    model: str | None = None
    for event in events:
        body = event.body
        if isinstance(body, TurnStarted):
            turn, turn_step = turn + 1, 0
        elif isinstance(body, RunStarted):
            model = model or body.model
        elif isinstance(body, TurnEnded):
            answers.append(body.answer)
        elif isinstance(body, ModelOutput):
            turn_step += 1
            calls = tuple((c.name, _canonical_args(c.arguments)) for c in body.calls)
            steps.append(
                Step(
                    turn=turn, turn_step=turn_step, calls=calls, text=body.text, offset=event.offset
                )
            )
            requests += 1
            if body.usage is not None:
                tokens_in += body.usage.input_tokens
                tokens_out += body.usage.output_tokens
                cost = _add_cost(cost, prices, model, body.usage)
    return _Side(
        session_id=session_id,
        model=model,
        steps=tuple(steps),
        answers=tuple(answers),
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        requests=requests,
        cost_micro_usd=cost,
    )


def _add_cost(cost: int | None, prices: PriceTable, model: str | None, usage: Any) -> int | None:
    if cost is None or model is None:
        return None
    try:
        return cost + prices.price(model).cost(usage)
    except ConfigError:
        return None  # a model with no price: the report says it does not know


def _divergence(source: Sequence[Step], replay: Sequence[Step]) -> Divergence | None:
    for n in range(max(len(source), len(replay))):
        mine = source[n] if n < len(source) else None
        theirs = replay[n] if n < len(replay) else None
        if mine is None or theirs is None or mine.signature() != theirs.signature():
            return Divergence(step=n + 1, source=mine, replay=theirs)
    return None


def _all_calls(steps: Sequence[Step]) -> Counter[tuple[str, str]]:
    return Counter(call for step in steps for call in step.calls)


def replay_report(
    source_events: Sequence[Event],
    replay_events: Sequence[Event],
    *,
    prices: PriceTable | None = None,
) -> ReplayReport:
    """Compare a replay's own log with its source's (the source's own log, as the replay
    forked it: the events after ``replay_started.source_offset`` are the recorded run)."""
    started = replay_started_of(replay_events)
    if started is None or not replay_events:
        raise UsageError(
            "this session is not a replay: its log has no replay_started fact",
            hint="run `lodger replay SESSION --model SPEC` to make one",
            code="usage",
        )
    prices = prices or PriceTable.defaults()
    source_id = source_events[0].session_id if source_events else started.source_session
    source = _side(source_id, source_events[started.source_offset :], prices)
    replay = _side(replay_events[0].session_id, replay_events, prices)
    theirs, mine = _all_calls(source.steps), _all_calls(replay.steps)
    answered = Counter(e.body.source for e in replay_events if isinstance(e.body, CallReplayed))
    return ReplayReport(
        source=source,
        replay=replay,
        source_offset=started.source_offset,
        policy=started.policy,
        diverged_at=_divergence(source.steps, replay.steps),
        added=tuple(sorted((mine - theirs).elements())),
        removed=tuple(sorted((theirs - mine).elements())),
        answered={k: answered.get(k, 0) for k in ("recorded", "live", "sandbox", "parked")},
    )

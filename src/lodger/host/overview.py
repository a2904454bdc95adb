"""What the console's session list and usage panel show, folded from the logs.

``SessionDigest`` reads one session's log once and then only what was appended since
(one stored-head lookup per unchanged session, as ``lodger.runtime.spend``): where the
session comes from (a fork's ``session_started.parent``, a subagent's link, a rewind's
branch), where it works, its turns, its last activity and what its model requests cost.
``turn_usage`` prices each turn of one session. Both price with the host's
``PriceTable``; a model the table has no price for leaves the cost unknown (``None``),
never zero.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Literal

from lodger.engine.budgets import SpendFold
from lodger.engine.prices import PriceTable
from lodger.errors import ConfigError
from lodger.events import (
    Compacted,
    CompactionFailed,
    Event,
    ModelOutput,
    SessionStarted,
    TurnEnded,
    TurnStarted,
    Usage,
)
from lodger.runtime.subagents.link import link_of
from lodger.storage import EventLog
from lodger.storage.branches import root_of

__all__ = ["Digest", "SessionDigest", "TurnUsage", "turn_usage"]

Relation = Literal["fork", "subagent", "branch"]


@dataclass(kw_only=True)
class Digest:
    """One session as the list shows it (see the module docstring)."""

    session_id: str
    high_water: int = 0
    workspace: str | None = None
    parent: str | None = None
    relation: Relation | None = None
    #: the parent's call that started a subagent
    parent_call: str | None = None
    turns: int = 0
    open_turn: str | None = None
    last_turn_status: str | None = None
    last_input: str = ""
    first_us: int = 0
    last_us: int = 0
    cost_micro_usd: int | None = 0
    _spend: SpendFold | None = field(default=None, repr=False)


@dataclass(kw_only=True)
class TurnUsage:
    """The model requests of one turn (or of the whole session: ``turn_id`` None)."""

    turn_id: str | None
    index: int
    input: str = ""
    status: str | None = None
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_micro_usd: int | None = 0

    def add(self, usage: Usage, cost: int | None) -> None:
        self.requests += 1
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cache_read_tokens += usage.cache_read_tokens
        self.cache_write_tokens += usage.cache_write_tokens
        if cost is None or self.cost_micro_usd is None:
            self.cost_micro_usd = None
        else:
            self.cost_micro_usd += cost


_READERS: weakref.WeakKeyDictionary[EventLog, SessionDigest] = weakref.WeakKeyDictionary()


class SessionDigest:
    """Keeps each session's ``Digest`` with the offset it reached (see module doc)."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self._digests: dict[str, Digest] = {}
        self._prices: PriceTable | None = None

    @classmethod
    def for_log(cls, log: EventLog) -> SessionDigest:
        found = _READERS.get(log)
        if found is None:
            found = _READERS[log] = cls(log)
        return found

    async def digest(self, session_id: str, prices: PriceTable) -> Digest:
        if prices != self._prices:
            self._digests.clear()
            self._prices = prices
        found = self._digests.get(session_id)
        head = await self.log.head(session_id)
        if found is None or head.high_water < found.high_water:  # new, or replaced
            found = self._digests[session_id] = Digest(session_id=session_id)
            found._spend = SpendFold(prices)
        if head.high_water > found.high_water:
            _feed(found, await self.log.read(session_id, start=found.high_water))
        return found


def _feed(digest: Digest, events: list[Event]) -> None:
    spend = digest._spend
    assert spend is not None
    for event in events:
        if event.offset < digest.high_water:
            continue
        _note(digest, event)
        if digest.cost_micro_usd is not None:
            try:
                spend.feed((event,))
                digest.cost_micro_usd = spend.total
            except ConfigError:
                digest.cost_micro_usd = None  # a model with no price: unknown, not free
        digest.high_water = event.offset + 1


def _note(digest: Digest, event: Event) -> None:
    body = event.body
    if not digest.first_us:
        digest.first_us = event.ts
    digest.last_us = max(digest.last_us, event.ts)
    if isinstance(body, SessionStarted) and event.offset == 0:
        digest.workspace = body.workspace
        link = link_of(event)
        if link is not None:
            digest.parent, digest.relation = link.parent_session, "subagent"
            digest.parent_call = link.parent_call
        elif root_of(event.session_id) != event.session_id:
            digest.parent, digest.relation = root_of(event.session_id), "branch"
        elif body.parent is not None:
            digest.parent, digest.relation = body.parent.session_id, "fork"
    elif isinstance(body, TurnStarted):
        digest.turns += 1
        digest.open_turn = event.turn_id
        digest.last_input = body.input[:200]
    elif isinstance(body, TurnEnded):
        digest.open_turn = None
        digest.last_turn_status = body.status


def turn_usage(events: list[Event], prices: PriceTable) -> tuple[list[TurnUsage], TurnUsage]:
    """Each turn's model requests and their cost, and the session's total (compaction
    requests between turns count in the total only)."""
    spend = SpendFold(prices)
    total = TurnUsage(turn_id=None, index=0)
    turns: dict[str, TurnUsage] = {}
    for event in events:
        body = event.body
        if isinstance(body, TurnStarted) and event.turn_id is not None:
            turns[event.turn_id] = TurnUsage(
                turn_id=event.turn_id, index=len(turns) + 1, input=body.input[:200]
            )
        elif isinstance(body, TurnEnded) and event.turn_id in turns:
            turns[event.turn_id].status = body.status
        before = spend.total
        cost: int | None
        try:
            spend.feed((event,))
            cost = spend.total - before
        except ConfigError:
            cost = None
        usage = _usage_of(event)
        if usage is None:
            continue
        total.add(usage, cost)
        turn = turns.get(event.turn_id or "")
        if turn is not None:
            turn.add(usage, cost)
    return list(turns.values()), total


def _usage_of(event: Event) -> Usage | None:
    body = event.body
    if isinstance(body, ModelOutput) and event.origin == "provider":
        return body.usage
    if isinstance(body, Compacted | CompactionFailed):
        return body.usage
    return None

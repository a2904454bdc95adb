"""What the other sessions of a storage spent: the tree and daily budgets' reader.

``LogSpend`` prices sessions from their logs (``lodger.engine.budgets.SpendFold``) and
keeps each session's fold with the offset it reached, so a later check reads only the
events appended since (one stored-head lookup per unchanged session). One reader is
shared by everything in the process that uses the same ``EventLog`` (``for_log``).

- **Tree**: the root of the checking session's subagent tree (its ``SubagentLink.root``,
  or the session itself), then every child a ``delegate`` call's T1 names
  (``actor:subagent:<id>``) whose own link names that parent, at any depth, as the
  step budget's walk does (``lodger.runtime.subagents.ledger``). Exact: the parent's log
  names every child before the child runs.
- **Day**: every session the log lists, summing the requests whose ``model_output`` was
  committed on that UTC day. Exact too, but it costs a head lookup per session and the
  first check in a process folds every log once: keep a daily budget for state
  directories of a moderate number of sessions (thousands), or leave it off.

Another process's spend counts once it is committed; two workers checking at the same
moment can each make one more request before either sees the other's (a budget is a
limit to stop at, not a lock).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from lodger.engine.budgets import SpendFold
from lodger.engine.prices import PriceTable
from lodger.engine.state import SessionState
from lodger.runtime.subagents.link import link_of, session_from_resources
from lodger.storage import EventLog

__all__ = ["LogSpend"]

#: how many sessions one tree walk reads at most (as the step budget's walk)
_MAX_SESSIONS = 10_000

_READERS: weakref.WeakKeyDictionary[EventLog, LogSpend] = weakref.WeakKeyDictionary()


class LogSpend:
    """Reads the spend of a log's sessions, folding each log once (see module doc)."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self._folds: dict[str, SpendFold] = {}
        self._prices: PriceTable | None = None

    @classmethod
    def for_log(cls, log: EventLog) -> LogSpend:
        """The process's reader of ``log``."""
        found = _READERS.get(log)
        if found is None:
            found = _READERS[log] = cls(log)
        return found

    async def tree(self, own: SpendFold, state: SessionState, prices: PriceTable) -> int:
        """Micro-USD spent by the subagent tree ``state``'s session is in."""
        link = link_of(state.events[0]) if state.events else None
        root = link.root if link is not None else state.session_id
        total = 0
        seen: set[str] = set()
        todo: list[tuple[str, str | None]] = [(root, None)]
        while todo and len(seen) < _MAX_SESSIONS:  # a guard against a runaway tree
            sid, parent = todo.pop()
            if sid in seen:
                continue
            fold = await self._children(sid, state, prices)
            if fold is None:
                continue  # named by a T1, not started yet
            link = link_of(fold.first)
            if parent is not None and (link is None or link.parent_session != parent):
                continue  # not this call's child (a hostile or foreign session)
            seen.add(sid)
            total += fold.total if sid != state.session_id else own.total
            todo.extend((child, sid) for child in fold.children)
        return total

    async def day(self, own: SpendFold, day: int, state: SessionState, prices: PriceTable) -> int:
        """Micro-USD spent on UTC ``day`` by every session of the log."""
        total = own.by_day.get(day, 0)
        for sid in await self.log.list_sessions():
            if sid == state.session_id:
                continue
            fold = await self._read(sid, prices)
            if fold is not None:
                total += fold.by_day.get(day, 0)
        return total

    async def _children(
        self, sid: str, state: SessionState, prices: PriceTable
    ) -> SpendFold | None:
        if sid != state.session_id:
            return await self._read(sid, prices)
        # the checking session: its children from its own fold (fresher than the log)
        fold = self._fold(sid, prices)
        fold.feed(state.events[fold.high_water :])
        return fold

    def _fold(self, sid: str, prices: PriceTable) -> SpendFold:
        if prices != self._prices:  # other prices: every cached sum is stale
            self._folds.clear()
            self._prices = prices
        fold = self._folds.get(sid)
        if fold is None:
            fold = self._folds[sid] = SpendFold(prices, _child_of)
        return fold

    async def _read(self, sid: str, prices: PriceTable) -> SpendFold | None:
        """The session's fold brought up to its stored head; None if it has no log."""
        fold = self._fold(sid, prices)
        head = await self.log.head(sid)
        if head.high_water < fold.high_water:  # rolled back or replaced: fold afresh
            fold = self._folds[sid] = SpendFold(prices, _child_of)
        if head.high_water == 0:
            return None
        if head.high_water > fold.high_water:
            fold.feed(await self.log.read(sid, start=fold.high_water))
        return fold


def _child_of(resources: Sequence[str]) -> str | None:
    return session_from_resources(resources)

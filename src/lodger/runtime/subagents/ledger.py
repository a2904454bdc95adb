"""What a session tree has spent, read from its logs: the tree budget that survives a crash.

The tree budget is not a counter kept anywhere: it is derived, at each delegation, from
facts already durable. A delegation records the budget it was granted in its child's
first event (``subagent.budget``); the child's log records what it spent (one step per
model output, tokens from each output's usage). Walking down from the root (the parent's
``delegate`` T1 names each child's session id) gives, per child:

    settled (its turn ended, or its parent's call has a result)  -> what it spent
    open (running, suspended, or a crash cut it)                 -> max(granted, spent)

and the tree has ``tree_steps - sum`` steps (and tokens) left. A parent SIGKILLed and
resumed reads the same logs and gets the same figure; parents and children on different
workers too, since the logs are shared. Two delegations of one tree serialize between
reading the figure and writing the child's first event (an ``asyncio.Lock`` per root in
a process; the control plane's named lease ``subagent-tree:<root>`` across workers), so
each reservation is seen by the next.

A child that never wrote its first event reserved nothing (it did not happen); a settled
child's spending never changes, so ``TreeSpend.settled_*`` only grows and is safe to
cache for an early refusal.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lodger.events import Event, SessionStarted, ToolDispatched, ToolResponded
from lodger.runtime.subagents.link import child_outcome, link_of, session_from_resources
from lodger.runtime.subagents.policy import Budget, SubagentPolicy, TreeBudget
from lodger.storage import EventLog

__all__ = ["TreeSpend", "budget_from_metadata", "budget_metadata", "tree_budget", "tree_spend"]

_BUDGET = "subagent.budget"
#: how many sessions one walk reads at most (a guard against a runaway or cyclic tree)
_MAX_SESSIONS = 10_000


def budget_metadata(granted: Budget) -> dict[str, str]:
    """The first-event metadata recording what a child was granted."""
    body = {"steps": granted.steps, "tokens": granted.tokens, "wall_time": granted.wall_time}
    return {_BUDGET: json.dumps(body, sort_keys=True)}


def budget_from_metadata(first: Event | None) -> Budget | None:
    """The budget a child's first event records it was granted (None: an older child, or
    an unreadable record)."""
    if first is None or not isinstance(first.body, SessionStarted):
        return None
    raw = first.body.metadata.get(_BUDGET)
    if raw is None:
        return None
    try:
        body = json.loads(raw)
        steps = int(body["steps"])
        tokens = None if body.get("tokens") is None else int(body["tokens"])
        wall = None if body.get("wall_time") is None else float(body["wall_time"])
    except (ValueError, TypeError, KeyError):
        return None
    if steps < 0 or (tokens is not None and tokens < 0):
        return None
    return Budget(steps=steps, tokens=tokens, wall_time=wall)


@dataclass(frozen=True, kw_only=True)
class TreeSpend:
    """What every child of one root has spent or holds: ``steps``/``tokens`` count open
    children at ``max(granted, spent)``; ``settled_*`` count settled children alone."""

    root: str
    steps: int = 0
    tokens: int = 0
    settled_steps: int = 0
    settled_tokens: int = 0
    children: int = 0
    open_children: int = 0


async def tree_spend(log: EventLog, root: str, *, policy: SubagentPolicy) -> TreeSpend:
    """Walk the tree of ``root`` through its logs (see the module docstring)."""
    steps = tokens = settled_steps = settled_tokens = children = open_children = 0
    queue = [root]
    seen = {root}
    while queue:
        session = queue.pop()
        events = [e for e in await log.read(session) if e.session_id == session]
        answered = {e.call_id for e in events if isinstance(e.body, ToolResponded) and e.call_id}
        for child_id, dispatched, call_id in _delegations(events, policy):
            if child_id in seen or len(seen) >= _MAX_SESSIONS:
                continue
            child_events = await log.read(child_id)
            if not child_events or link_of(child_events[0]) is None:
                continue  # never started: it reserved nothing
            link = link_of(child_events[0])
            assert link is not None
            if link.parent_session != session:
                continue  # not this call's child (a hostile or foreign session)
            seen.add(child_id)
            queue.append(child_id)
            children += 1
            outcome = child_outcome(child_id, child_events)
            if outcome.status is not None or call_id in answered:
                steps += outcome.steps
                tokens += outcome.tokens
                settled_steps += outcome.steps
                settled_tokens += outcome.tokens
                continue
            open_children += 1
            granted = budget_from_metadata(child_events[0]) or _asked(dispatched, policy)
            steps += max(granted.steps, outcome.steps)
            tokens += max(granted.tokens or 0, outcome.tokens)
    return TreeSpend(
        root=root,
        steps=steps,
        tokens=tokens,
        settled_steps=settled_steps,
        settled_tokens=settled_tokens,
        children=children,
        open_children=open_children,
    )


def tree_budget(spend: TreeSpend, policy: SubagentPolicy) -> TreeBudget:
    """What the tree has left for further children, given what it spent."""
    return TreeBudget(
        steps=policy.tree_steps - spend.steps,
        tokens=None if policy.tree_tokens is None else policy.tree_tokens - spend.tokens,
    )


def settled_floor(spend: TreeSpend, policy: SubagentPolicy) -> TreeBudget:
    """An upper bound on what the tree has left that stays true as time passes (settled
    spending only grows): a refusal from it is never wrong."""
    return TreeBudget(
        steps=policy.tree_steps - spend.settled_steps,
        tokens=None if policy.tree_tokens is None else policy.tree_tokens - spend.settled_tokens,
    )


def _delegations(
    events: Sequence[Event], policy: SubagentPolicy
) -> list[tuple[str, ToolDispatched, str | None]]:
    """The children a session's ``delegate`` T1s name, with the T1 and its call id (a
    retry of one call names the same child: counted once)."""
    out: list[tuple[str, ToolDispatched, str | None]] = []
    for e in events:
        body = e.body
        if isinstance(body, ToolDispatched) and body.tool == policy.name:
            child = session_from_resources(body.resources)
            if child is not None:
                out.append((child, body, e.call_id))
    return out


def _asked(dispatched: ToolDispatched, policy: SubagentPolicy) -> Budget:
    """An older child records no grant: what its T1 asked, capped by the policy."""
    raw = dispatched.arguments.get("budget")
    asked: dict[str, Any] = raw if isinstance(raw, dict) else {}
    default = policy.default_budget
    try:
        steps = int(asked.get("steps", default.steps))
        tokens = asked.get("tokens", default.tokens)
        tokens = None if tokens is None else int(tokens)
    except (ValueError, TypeError):
        return policy.max_budget
    return Budget(steps=steps, tokens=tokens).capped(policy.max_budget)

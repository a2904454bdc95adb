"""What delegation may do: per-child budgets, the depth limit and the budget of a tree.

``SubagentPolicy`` is given to ``Agent(subagents=...)`` (or ``lodger run --subagents``).
A child gets the budget its delegation asks for, capped by ``max_budget``; every child
of a tree (a root session and all its descendants) draws its steps and tokens from the
tree's budget, so a child cannot give its own children more than the tree has left. The
tree's budget is read from its logs at each delegation (``lodger.runtime.subagents.ledger``), so
it holds after a crash and resume, and across workers.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from lodger.errors import ToolCallError
from lodger.providers.base import Model

if TYPE_CHECKING:
    from lodger.runtime.subagents.link import SubagentLink

__all__ = ["Budget", "ChildLauncher", "SubagentPolicy", "TreeBudget"]


class ChildLauncher(Protocol):
    """Where children run when they do not run inline in the parent's process (the
    control plane and its workers, ``lodger.runtime.subagents.detached``)."""

    def writing(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """While open, this process may write the child's first events (a worker's log
        writes are fenced by session leases: this holds the child's)."""
        ...

    async def start(self, *, child: SubagentLink, snapshot: str | None) -> None:
        """Make sure the child (its first event is written) gets run somewhere, in a copy
        of ``snapshot`` (the parent's workspace when it delegated; None when called
        again by the parent's recovery probe, so it must be idempotent)."""
        ...

    async def final_snapshot(self, *, child: SubagentLink) -> str | None:
        """The snapshot of the child's workspace when its turn settled (None: unknown)."""
        ...

    async def settled(self, *, child: SubagentLink) -> None:
        """The child's turn settled: wake its parent (idempotent per child)."""
        ...

    def reserving(self, root: str) -> AbstractAsyncContextManager[None]:
        """While open, no other process reserves from the budget of ``root``'s tree (held
        from reading the tree's spending to writing the new child's first event)."""
        ...


@dataclass(frozen=True, kw_only=True)
class Budget:
    """What one child may spend: model steps, tokens (input + output, None: unlimited) and
    wall time in seconds (None: the policy's cap)."""

    steps: int = 20
    tokens: int | None = None
    wall_time: float | None = None

    def capped(self, cap: Budget) -> Budget:
        return Budget(
            steps=min(self.steps, cap.steps),
            tokens=_least(self.tokens, cap.tokens),
            wall_time=_least(self.wall_time, cap.wall_time),
        )


_N = TypeVar("_N", int, float)


def _least(a: _N | None, b: _N | None) -> _N | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


@dataclass(frozen=True, kw_only=True)
class SubagentPolicy:
    """How an agent delegates.

    ``model`` runs the children (default: the parent's model; a spec such as
    ``"openai:gpt-4.1-mini"`` is made and closed by the agent); ``system`` is their system
    prompt (default: the parent's). ``max_depth`` is how deep the tree may grow: 1 lets
    the agent delegate and its children not, 2 lets children delegate once more.
    ``default_budget`` is what a delegation gets when it names none, ``max_budget`` caps
    what one may ask for, and ``tree_steps``/``tree_tokens`` bound every child of one
    root together.

    >>> Agent(model=model, tools=tools, subagents=SubagentPolicy(max_depth=2))
    """

    model: Model | str | None = None
    system: str | None = None
    max_depth: int = 1
    default_budget: Budget = field(default_factory=Budget)
    max_budget: Budget = field(default_factory=lambda: Budget(steps=50, wall_time=600.0))
    tree_steps: int = 200
    tree_tokens: int | None = None
    name: str = "delegate"
    #: None: children run inline, in the parent's process; a launcher (the control
    #: plane's, set by the worker): the parent's call suspends, the child runs on any
    #: worker, and the parent is woken when it settles
    children: ChildLauncher | None = None


class TreeBudget:
    """The steps and tokens left for every child of one root session.

    Built from what the tree's logs say it spent (``lodger.runtime.subagents.ledger.tree_budget``);
    a delegation reserves what its child may spend before the child starts (the grant is
    recorded in the child's first event, so the next reading counts it).
    """

    def __init__(self, *, steps: int, tokens: int | None) -> None:
        self.steps_left = steps
        self.tokens_left = tokens

    def check(self) -> None:
        """Refuse (as a tool error) when nothing is left for another child."""
        if self.steps_left < 1:
            raise ToolCallError(
                "the delegation budget of this session tree is spent (no model steps left "
                "for another subagent); do the rest yourself",
                code="subagent_budget",
            )
        if self.tokens_left is not None and self.tokens_left < 1:
            raise ToolCallError(
                "the delegation budget of this session tree is spent (no tokens left for "
                "another subagent); do the rest yourself",
                code="subagent_budget",
            )

    def reserve(self, budget: Budget) -> Budget:
        """Take ``budget`` (less, when the tree has less left); the budget granted."""
        self.check()
        granted = Budget(
            steps=min(budget.steps, self.steps_left),
            tokens=_least(budget.tokens, self.tokens_left),
            wall_time=budget.wall_time,
        )
        self.steps_left -= granted.steps
        if self.tokens_left is not None and granted.tokens is not None:
            self.tokens_left -= granted.tokens
        return granted

    def settle(self, granted: Budget, *, steps: int, tokens: int) -> None:
        """Give back what a child was granted and did not spend."""
        self.steps_left += max(granted.steps - steps, 0)
        if self.tokens_left is not None and granted.tokens is not None:
            self.tokens_left += max(granted.tokens - tokens, 0)

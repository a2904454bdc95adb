"""Families of sessions: who started whom, from the first events alone.

A session's parent is the session that delegated to it (``SubagentLink``) or the one it
was forked from (``session_started.parent``). ``family_tree`` turns the first events of a
state directory's sessions into trees, roots first, children in session-id order (ids
are UUIDv7 or derived from them, so roughly in creation order). A session whose parent is
not among them is a root of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from lodger.events import Event, SessionStarted
from lodger.runtime.subagents.link import SubagentLink, link_of

__all__ = ["FamilyNode", "family_tree", "parent_of"]

Relation = Literal["root", "subagent", "fork"]


@dataclass(kw_only=True)
class FamilyNode:
    session_id: str
    relation: Relation
    parent: str | None = None
    link: SubagentLink | None = None
    #: for a fork: the offset it shares the parent's log up to
    at: int | None = None
    children: list[FamilyNode] = field(default_factory=list)

    def walk(self, depth: int = 0) -> list[tuple[int, FamilyNode]]:
        """This node and its descendants, depth first, with their depth."""
        out = [(depth, self)]
        for child in self.children:
            out.extend(child.walk(depth + 1))
        return out


def parent_of(first: Event) -> FamilyNode:
    """The node a session's first event describes (its parent not yet attached)."""
    link = link_of(first)
    body = first.body
    fork = body.parent if isinstance(body, SessionStarted) else None
    if link is not None:
        return FamilyNode(
            session_id=first.session_id,
            relation="subagent",
            parent=link.parent_session,
            link=link,
            at=fork.high_water if fork else None,
        )
    if fork is not None:
        return FamilyNode(
            session_id=first.session_id, relation="fork", parent=fork.session_id, at=fork.high_water
        )
    return FamilyNode(session_id=first.session_id, relation="root")


def family_tree(firsts: Mapping[str, Event | None]) -> list[FamilyNode]:
    """The trees of the sessions whose first events are given (None: unreadable)."""
    nodes: dict[str, FamilyNode] = {}
    for session_id, first in firsts.items():
        if first is None:
            nodes[session_id] = FamilyNode(session_id=session_id, relation="root")
        else:
            nodes[session_id] = parent_of(first)
    roots: list[FamilyNode] = []
    for session_id in sorted(nodes):
        node = nodes[session_id]
        parent = nodes.get(node.parent) if node.parent is not None else None
        if parent is None or _would_cycle(nodes, node):
            roots.append(node)
        else:
            parent.children.append(node)
    return roots


def _would_cycle(nodes: Mapping[str, FamilyNode], node: FamilyNode) -> bool:
    seen = {node.session_id}
    current = node.parent
    while current is not None:
        if current in seen:
            return True
        seen.add(current)
        above = nodes.get(current)
        current = above.parent if above is not None else None
    return False

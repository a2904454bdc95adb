"""Subagents: delegation as a durable tool over sessions that share, never copy.

``Agent(subagents=SubagentPolicy(...))`` binds a ``delegate`` tool. Each delegation runs a
child session in the same storage, linked to its parent (``SubagentLink``), under a budget
and a depth limit, with the parent's authorities and approver; its answer is the call's
result. See ``lodger.subagents.tool`` for the path of one delegation and its recovery.
"""

from lodger.subagents.family import FamilyNode, family_tree
from lodger.subagents.link import (
    ChildOutcome,
    SubagentLink,
    child_outcome,
    child_session_id,
    current_subagent,
    link_of,
)
from lodger.subagents.policy import Budget, SubagentPolicy, TreeBudget
from lodger.subagents.tool import Delegation, delegate_tool

__all__ = [
    "Budget",
    "ChildOutcome",
    "Delegation",
    "FamilyNode",
    "SubagentLink",
    "SubagentPolicy",
    "TreeBudget",
    "child_outcome",
    "child_session_id",
    "current_subagent",
    "delegate_tool",
    "family_tree",
    "link_of",
]

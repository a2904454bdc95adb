"""Subagents: delegation as a durable tool over sessions that share, never copy.

``Agent(subagents=SubagentPolicy(...))`` binds a ``delegate`` tool. Each delegation runs a
child session in the same storage, linked to its parent (``SubagentLink``), under a budget
and a depth limit, with the parent's authorities and approver; its answer is the call's
result. See ``lodger.subagents.tool`` for the path of one delegation and its recovery.
"""

import typing as _typing

from lodger import _lazy

if _typing.TYPE_CHECKING:
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

#: where each name lives, imported on first use: the delegation tool (and the engine it
#: drives) loads only in a process that delegates
_EXPORTS: dict[str, str] = {
    "Budget": "lodger.subagents.policy",
    "ChildOutcome": "lodger.subagents.link",
    "Delegation": "lodger.subagents.tool",
    "FamilyNode": "lodger.subagents.family",
    "SubagentLink": "lodger.subagents.link",
    "SubagentPolicy": "lodger.subagents.policy",
    "TreeBudget": "lodger.subagents.policy",
    "child_outcome": "lodger.subagents.link",
    "child_session_id": "lodger.subagents.link",
    "current_subagent": "lodger.subagents.link",
    "delegate_tool": "lodger.subagents.tool",
    "family_tree": "lodger.subagents.family",
    "link_of": "lodger.subagents.link",
}


def __getattr__(name: str) -> _typing.Any:
    return _lazy.resolve(__name__, _EXPORTS, globals(), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

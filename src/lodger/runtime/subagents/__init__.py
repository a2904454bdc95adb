"""Subagents: delegation as a durable tool over sessions that share, never copy.

``Agent(subagents=SubagentPolicy(...))`` binds a ``delegate`` tool. Each delegation runs a
child session in the same storage, linked to its parent (``SubagentLink``), under a budget
and a depth limit, with the parent's authorities and approver; its answer is the call's
result. See ``lodger.runtime.subagents.tool`` for the path of one delegation and its recovery.
"""

import typing as _typing

from lodger._core import lazy as _lazy

if _typing.TYPE_CHECKING:
    from lodger.runtime.subagents.family import FamilyNode, family_tree
    from lodger.runtime.subagents.link import (
        ChildOutcome,
        SubagentLink,
        child_outcome,
        child_session_id,
        current_subagent,
        link_of,
    )
    from lodger.runtime.subagents.policy import Budget, SubagentPolicy, TreeBudget
    from lodger.runtime.subagents.tool import Delegation, delegate_tool

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
    "Budget": "lodger.runtime.subagents.policy",
    "ChildOutcome": "lodger.runtime.subagents.link",
    "Delegation": "lodger.runtime.subagents.tool",
    "FamilyNode": "lodger.runtime.subagents.family",
    "SubagentLink": "lodger.runtime.subagents.link",
    "SubagentPolicy": "lodger.runtime.subagents.policy",
    "TreeBudget": "lodger.runtime.subagents.policy",
    "child_outcome": "lodger.runtime.subagents.link",
    "child_session_id": "lodger.runtime.subagents.link",
    "current_subagent": "lodger.runtime.subagents.link",
    "delegate_tool": "lodger.runtime.subagents.tool",
    "family_tree": "lodger.runtime.subagents.family",
    "link_of": "lodger.runtime.subagents.link",
}


def __getattr__(name: str) -> _typing.Any:
    return _lazy.resolve(__name__, _EXPORTS, globals(), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

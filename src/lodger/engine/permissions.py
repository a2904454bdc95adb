"""Permission: allow / deny / ask per call. Visibility never implies authority.

Rules match tool names with shell-style patterns, first match wins. Without a matching
rule a tool that declares ``approval=True`` asks and every other tool is allowed. An ask
goes to the ``Approver``; a run with no approver (non-interactive) denies, with a message
that says how to allow it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lodger.tools.spec import Tool

__all__ = ["Approver", "Decision", "PermissionPolicy", "Rule"]

Decision = Literal["allow", "deny", "ask"]

Approver = Callable[[Tool, dict[str, Any]], Awaitable[bool]]
"""Asked for a decision on one call; returns True to allow it."""


@dataclass(frozen=True, kw_only=True)
class Rule:
    pattern: str
    decision: Decision

    def matches(self, tool: Tool) -> bool:
        return fnmatch.fnmatchcase(tool.name, self.pattern) or fnmatch.fnmatchcase(
            f"{tool.group}:{tool.name}", self.pattern
        )


class PermissionPolicy:
    """``PermissionPolicy([Rule(pattern="shell", decision="deny")], approve_all=False)``."""

    def __init__(self, rules: Sequence[Rule] = (), *, approve_all: bool = False) -> None:
        self.rules = tuple(rules)
        self.approve_all = approve_all

    def decide(self, tool: Tool) -> tuple[Decision, str]:
        """The decision and why (``rule '<pattern>'``, ``approval required``, ``default``)."""
        for rule in self.rules:
            if rule.matches(tool):
                decision: Decision = rule.decision
                if decision == "ask" and self.approve_all:
                    return "allow", f"rule {rule.pattern!r} asks; --yes approves"
                return decision, f"rule {rule.pattern!r}"
        if tool.approval:
            if self.approve_all:
                return "allow", "approval required; --yes approves"
            return "ask", "approval required"
        return "allow", "default"

"""The permission policy: rules that decide allow, deny or ask for each tool call.

Rules match tool names (or ``group:name``) with shell-style patterns, first match wins; a
rule with an ``arguments`` pattern (``shell(git *)`` in ``lodger.toml``) applies only when
one of the call's string arguments matches it. Without a matching rule a tool that
declares ``approval=True`` asks and every other tool is allowed. The policy only decides;
the permission gate of the call path (``lodger.engine.permissions``) applies it, asks the
approver and records the decision.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lodger.tools.spec import Tool

__all__ = ["Decision", "PermissionPolicy", "Rule"]

Decision = Literal["allow", "deny", "ask"]


@dataclass(frozen=True, kw_only=True)
class Rule:
    pattern: str
    decision: Decision
    #: a shell-style pattern one of the call's string arguments must match (None: any call)
    arguments: str | None = None

    def matches(self, tool: Tool, arguments: dict[str, Any] | None = None) -> bool:
        named = fnmatch.fnmatchcase(tool.name, self.pattern) or fnmatch.fnmatchcase(
            f"{tool.group}:{tool.name}", self.pattern
        )
        if not named or self.arguments is None:
            return named
        return any(
            isinstance(value, str) and fnmatch.fnmatchcase(value, self.arguments)
            for value in (arguments or {}).values()
        )

    @property
    def text(self) -> str:
        """The rule as ``lodger.toml`` writes it: ``shell(rm *)``, ``read_file``."""
        return self.pattern if self.arguments is None else f"{self.pattern}({self.arguments})"

    @classmethod
    def parse(cls, text: str, decision: Decision) -> Rule:
        """``"read_file"``, ``"mcp:*"`` or ``"shell(git status*)"``."""
        name, paren, rest = text.partition("(")
        if paren and rest.endswith(")"):
            return cls(pattern=name.strip(), decision=decision, arguments=rest[:-1])
        return cls(pattern=text.strip(), decision=decision)


class PermissionPolicy:
    """``PermissionPolicy([Rule(pattern="shell", decision="deny")], approve_all=False)``."""

    def __init__(self, rules: Sequence[Rule] = (), *, approve_all: bool = False) -> None:
        self.rules = tuple(rules)
        self.approve_all = approve_all

    def decide(self, tool: Tool, arguments: dict[str, Any] | None = None) -> tuple[Decision, str]:
        """The decision and why (``rule '<pattern>'``, ``approval required``, ``default``)."""
        for rule in self.rules:
            if rule.matches(tool, arguments):
                decision: Decision = rule.decision
                if decision == "ask" and self.approve_all:
                    return "allow", f"rule {rule.text!r} asks; the run approves all"
                return decision, f"rule {rule.text!r}"
        if tool.approval:
            if self.approve_all:
                return "allow", "approval required; the run approves all"
            return "ask", "approval required"
        return "allow", "default"

    def decider(self, tool: Tool, arguments: dict[str, Any] | None = None) -> str:
        """Who decides the call when the policy does (``permission_decided.who``): the
        first matching rule (``rule 'shell(rm *)'``), else ``approve_all`` or ``default``."""
        for rule in self.rules:
            if rule.matches(tool, arguments):
                if rule.decision == "ask" and self.approve_all:
                    return "approve_all"  # the rule asks; the run's approve-all answers
                return f"rule {rule.text!r}"
        return "approve_all" if self.approve_all and tool.approval else "default"

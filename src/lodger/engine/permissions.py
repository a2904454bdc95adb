"""Permission: allow / deny / ask per call. Visibility never implies authority.

Rules match tool names with shell-style patterns, first match wins; a rule with an
``arguments`` pattern (``shell(git *)`` in ``lodger.toml``) applies only when one of the
call's string arguments matches it. Without a matching
rule a tool that declares ``approval=True`` asks and every other tool is allowed. An ask
goes to the ``Approver``; a run with no approver (non-interactive) denies, with a message
that says how to allow it.

An approver may answer ``"always"``: the call is allowed, and the fact that says so
(``permission_decided`` by ``user`` with the reason ``ALWAYS_REASON``) makes every later
ask for the same tool in the same session allowed without asking, in this run, a later
turn, or a resumed run (the gate reads the session's log). "Always" never overrides a
``deny`` rule: only calls the policy would ask about are affected.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from lodger.engine.checks import Rejection
from lodger.engine.context import Envelope
from lodger.events import ALWAYS_REASON, Event, PermissionDecided, PermissionRequested
from lodger.tools.spec import Tool

if TYPE_CHECKING:
    from lodger.engine.journal import Journal

__all__ = [
    "ALWAYS_REASON",
    "ApprovalAnswer",
    "Approver",
    "Decision",
    "PermissionGate",
    "PermissionPolicy",
    "Rule",
    "always_allowed_at",
]

Decision = Literal["allow", "deny", "ask"]

ApprovalAnswer = Literal["once", "always", "deny"]

Approver = Callable[[Tool, dict[str, Any]], Awaitable[bool | ApprovalAnswer]]
"""The approval dialogue: asked for a decision on one call, returns ``"once"`` (or
True) to allow it, ``"always"`` to allow this tool for the rest of the session,
``"deny"`` (or False) to refuse it. The CLI asks at the terminal; a host asks its
clients."""


def always_allowed_at(events: Sequence[Event], tool: str) -> int | None:
    """The offset of the fact by which the user allowed ``tool`` for the whole session."""
    for e in events:
        body = e.body
        if (
            isinstance(body, PermissionDecided)
            and body.tool == tool
            and body.by == "user"
            and body.decision == "allow"
            and body.reason == ALWAYS_REASON
        ):
            return e.offset
    return None


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
                    return "allow", f"rule {rule.pattern!r} asks; the run approves all"
                return decision, f"rule {rule.pattern!r}"
        if tool.approval:
            if self.approve_all:
                return "allow", "approval required; the run approves all"
            return "ask", "approval required"
        return "allow", "default"


class PermissionGate:
    """The permission stage of the call path: the policy decides, an ask goes to the
    ``Approver`` (one question at a time), and every decision that is not the silent
    default is a fact of the call."""

    def __init__(self, policy: PermissionPolicy, approver: Approver | None) -> None:
        self.policy = policy
        self.approver = approver
        self._lock = asyncio.Lock()

    async def permit(
        self, journal: Journal, t: Tool, arguments: dict[str, Any], env: Envelope
    ) -> None:
        """Return when the call may go on; raise ``Rejection("denied", ...)`` otherwise."""
        decision, why = self.policy.decide(t, arguments)
        if decision == "allow":
            if why != "default":
                await journal.fact(
                    PermissionDecided(tool=t.name, decision="allow", by="policy", reason=why),
                    env,
                )
            return
        if decision == "deny":
            await journal.fact(
                PermissionDecided(tool=t.name, decision="deny", by="policy", reason=why), env
            )
            raise Rejection("denied", f"calling {t.name} is denied by policy ({why})")
        granted = journal.state.always_allowed.get(t.name)
        if granted is not None:
            await journal.fact(
                PermissionDecided(
                    tool=t.name,
                    decision="allow",
                    by="user",
                    reason=f"allowed always for this session (offset {granted})",
                ),
                env,
            )
            return
        if self.approver is None:
            reason = "approval required and the run is not interactive"
            await journal.fact(
                PermissionDecided(tool=t.name, decision="deny", by="default", reason=reason),
                env,
            )
            raise Rejection(
                "denied",
                f"calling {t.name} needs approval and nobody can approve it in this run; "
                "the operator can approve it, or allow it in the project configuration "
                f'([permissions] allow = ["{t.name}"] in lodger.toml)',
            )
        await journal.fact(PermissionRequested(tool=t.name, summary=_summarize(arguments)), env)
        async with self._lock:  # one question at a time, and its answer logged before the next
            # A parallel call of the same tool may have been allowed always meanwhile.
            granted = journal.state.always_allowed.get(t.name)
            answer: bool | ApprovalAnswer = (
                "once" if granted is not None else await self.approver(t, arguments)
            )
            allowed = answer in (True, "once", "always")
            if granted is not None:
                reason = f"allowed always for this session (offset {granted})"
            else:
                reason = ALWAYS_REASON if answer == "always" else ""
            await journal.fact(
                PermissionDecided(
                    tool=t.name, decision="allow" if allowed else "deny", by="user", reason=reason
                ),
                env,
            )
        if not allowed:
            raise Rejection("denied", f"the user denied this call to {t.name}")


def _summarize(arguments: dict[str, Any], limit: int = 200) -> str:
    text = json.dumps(arguments, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."

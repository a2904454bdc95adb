"""Permission: allow / deny / ask per call. Visibility never implies authority.

The ``PermissionPolicy`` (``lodger.tools.policy``: rules matching tool names, first
match wins) decides; the gate here applies it on the call path. An ask goes to the
``Approver``; a run with no approver (non-interactive) denies, with a message that says
how to allow it.

An approver may answer ``"always"``: the call is allowed, and the fact that says so
(``permission_decided`` by ``user`` with the reason ``ALWAYS_REASON``) makes every later
ask for the same tool in the same session allowed without asking, in this run, a later
turn, or a resumed run (the gate reads the session's log). "Always" never overrides a
``deny`` rule: only calls the policy would ask about are affected.

An approver may also answer ``"park"``: nobody answers now, the answer will come from
outside the run (a worker's approval in the control plane). The gate records
``permission_decided`` with the decision ``park`` and raises ``ApprovalParked``; the call
is not dispatched, the batch settles its other calls and the run ends waiting. A resume
asks the approver again (the recovery plan's ``ask_permission``). A call inside a code
cell, or a re-dispatch by recovery, cannot wait like that: there ``park`` is a denial.

A session's permission mode (``permission_mode_changed``, folded by the session state)
adjusts what the policy decided, for the calls of every step whose ``step_started``
follows the switch in the log (``SessionState.mode_of_step``: a step that was running
when the switch came keeps its mode); a ``deny`` of the policy holds in every mode:

- ``plan``: read-only; a tool that writes (``Tool.writes``, or one with ``approval`` or
  ``expectations``, or a delegation to a subagent) is denied with an error the model
  reads;
- ``ask``: every call of a tool that writes asks the approver;
- ``accept_edits``: the file tools' edits (tools of the ``files`` group with
  ``expectations``, confined to the workspace) are allowed; other writes ask;
- ``full_auto``: whatever the policy would ask about is allowed, except a tool that
  declares ``approval`` itself (an unconfined shell: outside the sandbox), which asks.

While the approver runs, ``current_ask()`` names the call it is asked about (set in the
call's own task, so parallel calls never see each other's).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from lodger.engine.checks import Rejection
from lodger.engine.envelope import Envelope
from lodger.events import (
    ALWAYS_REASON,
    Event,
    PermissionDecided,
    PermissionMode,
    PermissionRequested,
)
from lodger.tools.policy import Decision, PermissionPolicy, Rule
from lodger.tools.spec import Tool

if TYPE_CHECKING:
    from lodger.engine.journal import Journal

__all__ = [
    "ALWAYS_REASON",
    "Answered",
    "ApprovalAnswer",
    "ApprovalParked",
    "Approver",
    "Asking",
    "Decision",
    "PermissionGate",
    "PermissionPolicy",
    "Rule",
    "always_allowed_at",
    "current_ask",
    "in_mode",
]
# ``Decision``, ``PermissionPolicy`` and ``Rule`` live with the tools they decide about
# (``lodger.tools.policy``); the gate's module names them too, as the policy it applies.

ApprovalAnswer = Literal["once", "always", "deny", "park"]


@dataclass(frozen=True)
class Answered:
    """An approver's answer with who gave it (``permission_decided.who``):
    ``Answered("once", "cli:alice")``, ``Answered(False, "token:tok_0123456789abcdef")``."""

    answer: bool | ApprovalAnswer
    who: str | None = None


Approver = Callable[[Tool, dict[str, Any]], Awaitable[bool | ApprovalAnswer | Answered]]
"""The approval dialogue: asked for a decision on one call, returns ``"once"`` (or
True) to allow it, ``"always"`` to allow this tool for the rest of the session,
``"deny"`` (or False) to refuse it, ``"park"`` to leave the call undispatched until the
answer comes from outside the run (the run ends waiting; a resume asks again); wrapped in
``Answered`` to say who answered. The CLI asks at the terminal; a host asks its clients;
a parking worker asks the control plane."""


@dataclass(frozen=True, kw_only=True)
class Asking:
    """The call an approver is asked about (``current_ask()``)."""

    call_id: str | None
    #: the call's arguments as the ``permission_requested`` fact summarizes them
    summary: str
    #: the code cell a nested call belongs to (None: a call the model proposed)
    parent_call_id: str | None = None
    #: whether ``"park"`` is an answer here (not inside a code cell, not a re-dispatch)
    may_park: bool = True


_ASKING: contextvars.ContextVar[Asking | None] = contextvars.ContextVar(
    "lodger_asking", default=None
)


def current_ask() -> Asking | None:
    """The call the permission gate is asking the approver about, in the approver."""
    return _ASKING.get()


class ApprovalParked(Exception):
    """Raised by the gate when the approver parked the call: it is not dispatched and
    the run ends waiting for the answer (``message`` says so to whoever reads it)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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


class PermissionGate:
    """The permission stage of the call path: the policy decides, an ask goes to the
    ``Approver`` (one question at a time), and every decision that is not the silent
    default is a fact of the call."""

    def __init__(self, policy: PermissionPolicy, approver: Approver | None) -> None:
        self.policy = policy
        self.approver = approver
        self._lock = asyncio.Lock()

    async def permit(
        self,
        journal: Journal,
        t: Tool,
        arguments: dict[str, Any],
        env: Envelope,
        *,
        may_park: bool = True,
    ) -> None:
        """Return when the call may go on; raise ``Rejection("denied", ...)`` otherwise,
        or ``ApprovalParked`` when the approver parked it (``may_park``, and only for a
        call the model proposed: inside a code cell a parked answer is a denial)."""
        decision, why = self.policy.decide(t, arguments)
        who = self.policy.decider(t, arguments)
        mode = journal.state.mode_of_step(env.step_id)
        if mode is not None and decision != "deny":  # the project's deny rules always win
            moded, why_mode = in_mode(mode, t, decision)
            if moded != decision or why_mode:
                decision, why, who = moded, why_mode or why, f"mode {mode}"
        if decision == "allow":
            if why != "default":
                await journal.fact(
                    PermissionDecided(
                        tool=t.name, decision="allow", by="policy", reason=why, who=who
                    ),
                    env,
                )
            return
        if decision == "deny":
            await journal.fact(
                PermissionDecided(tool=t.name, decision="deny", by="policy", reason=why, who=who),
                env,
            )
            if who.startswith("mode "):
                raise Rejection("denied", f"calling {t.name} is not allowed: {why}")
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
        await self._ask(journal, self.approver, t, arguments, env, may_park=may_park)

    async def _ask(
        self,
        journal: Journal,
        approver: Approver,
        t: Tool,
        arguments: dict[str, Any],
        env: Envelope,
        *,
        may_park: bool,
    ) -> None:
        """The policy asks and nobody allowed the tool always: ask ``approver`` (one
        question at a time) and record its answer; raise as ``permit`` says."""
        summary = _summarize(arguments)
        await journal.fact(PermissionRequested(tool=t.name, summary=summary), env)
        may_park = may_park and env.parent_call_id is None
        asking = Asking(
            call_id=env.call_id,
            summary=summary,
            parent_call_id=env.parent_call_id,
            may_park=may_park,
        )
        async with self._lock:  # one question at a time, and its answer logged before the next
            # A parallel call of the same tool may have been allowed always meanwhile.
            granted = journal.state.always_allowed.get(t.name)
            answer: bool | ApprovalAnswer
            who: str | None = None  # an "always" names its decider at its own offset
            if granted is not None:
                answer = "once"
            else:
                token = _ASKING.set(asking)
                try:
                    given = await approver(t, arguments)
                finally:
                    _ASKING.reset(token)
                answer, who = (
                    (given.answer, given.who) if isinstance(given, Answered) else (given, None)
                )
            if answer == "park" and may_park:
                await journal.fact(
                    PermissionDecided(
                        tool=t.name,
                        decision="park",
                        by="user",
                        reason="waiting for an answer given outside this run",
                        who=who,
                    ),
                    env,
                )
                raise ApprovalParked(
                    f"calling {t.name} waits for approval; it was not dispatched, and the "
                    "turn goes on once the approval is answered"
                )
            allowed = answer in (True, "once", "always")
            if granted is not None:
                reason = f"allowed always for this session (offset {granted})"
            elif answer == "park":  # the approver parked a call that cannot wait
                reason = (
                    "the approval cannot wait inside a code cell"
                    if env.parent_call_id is not None
                    else "the approval cannot wait in a re-dispatch by recovery"
                )
            else:
                reason = ALWAYS_REASON if answer == "always" else ""
            await journal.fact(
                PermissionDecided(
                    tool=t.name,
                    decision="allow" if allowed else "deny",
                    by="user",
                    reason=reason,
                    who=who,
                ),
                env,
            )
        if not allowed:
            if answer == "park":
                raise Rejection("denied", f"calling {t.name} needs approval, but {reason}: denied")
            raise Rejection("denied", f"the user denied this call to {t.name}")


def _writes(t: Tool) -> bool:
    # a delegation counts as an effect: its child session runs tools of its own, under
    # no mode of this session's
    return t.writes or t.approval or t.expectations is not None or t.group == "subagents"


def in_mode(mode: PermissionMode, t: Tool, decision: Decision) -> tuple[Decision, str]:
    """What ``mode`` makes of the policy's ``decision`` (never ``deny``) for a call of
    ``t``, and why (empty: the mode changes nothing)."""
    if not _writes(t):
        return decision, ""  # reading is what every mode allows as the policy does
    if mode == "plan":
        return "deny", (
            "the session is in plan mode (read-only): only tools that do not write run; "
            "describe the change instead, or ask the user to switch the mode"
        )
    if mode == "ask":
        return "ask", "the session is in ask mode: every effect asks"
    if mode == "accept_edits":
        if t.group == "files" and t.expectations is not None:
            return "allow", "the session accepts file edits in the workspace"
        return "ask", "the session accepts only file edits without asking"
    # full_auto: inside the sandbox everything goes; a tool that itself says it needs a
    # person (an unconfined shell) still asks
    if decision == "ask" and not t.approval:
        return "allow", "the session is in full_auto mode"
    return decision, ""


def _summarize(arguments: dict[str, Any], limit: int = 200) -> str:
    text = json.dumps(arguments, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."

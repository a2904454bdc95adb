"""Approvals of worker-run calls, asked and answered through the control plane.

A worker has no terminal and no client attached. Two ways to ask, one per worker mode:

- ``ControlApprovals`` (``lodger worker --approval-wait S``): when the permission gate
  asks about a call, it records the question in the control plane (``ask_approval``,
  with a deadline) and polls it for an answer, which any host answers with a conditional
  update (the first answer wins). The worker process stays up while it waits (the turn
  is not dormant): its lease heartbeat keeps running, so no other worker takes the
  session. When the deadline passes first, the question becomes ``expired`` and the
  call is denied (the gate commits the denial as a fact).
- ``ParkingApprovals`` (``lodger worker --approval-park``): the approver answers
  ``park`` unless the control plane already holds an answer for the call. The gate
  records ``permission_decided`` ``park``, the call is not dispatched, the run ends
  waiting and the worker releases the session, which is then dormant. Only after that
  fact is committed does the worker record the question (``Worker`` calls
  ``park_approval`` for each call the plan says waits for its approval), so a question
  in the control plane always has a log that knows the call waits. The question lives
  until its own expiry; answering it wakes the session, whose resume asks the approver
  again: ``allow`` runs the call, ``deny`` or an expired question denies it.

The gate names the call it asks about in the call's own task (``current_ask()``).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable
from typing import Any

from lodger.engine.permissions import Answered, ApprovalAnswer, Approver, current_ask
from lodger.errors import ControlPlaneError
from lodger.events import Event, PermissionRequested
from lodger.storage.control.interface import Approvals
from lodger.tools.spec import Tool

__all__ = ["DEFAULT_APPROVAL_EXPIRY_S", "ControlApprovals", "ParkingApprovals"]

#: how long a parked approval stays answerable by default: a day
DEFAULT_APPROVAL_EXPIRY_S = 24 * 3600.0

log = logging.getLogger("lodger.worker")

# (call id, summary) of the call the gate is asking about, set in the call's task
_ASKING: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "lodger_control_asking", default=None
)


class ControlApprovals:
    """Approvers for one worker: ask in the control plane, wait up to ``wait_s``."""

    def __init__(
        self, control: Approvals, *, holder: str, wait_s: float, poll_s: float = 0.25
    ) -> None:
        self.control = control
        self.holder = holder
        self.wait_s = wait_s
        self.poll_s = poll_s

    def observer(self) -> Callable[[Event], None]:
        """The ``on_event`` hook that tells the approver which call is asked about."""

        def on_event(event: Event) -> None:
            body = event.body
            if isinstance(body, PermissionRequested) and event.call_id is not None:
                _ASKING.set((event.call_id, body.summary))

        return on_event

    def approver(self, session_id: str) -> Approver:
        async def approve(tool: Tool, arguments: dict[str, Any]) -> bool | Answered:
            ask = current_ask()  # set by the gate in this call's own task
            asking = (ask.call_id, ask.summary) if ask and ask.call_id else _ASKING.get()
            if asking is None:  # the gate asked without a fact: never allow blindly
                return False
            call_id, summary = asking
            return await self.answered(session_id, call_id, tool=tool.name, summary=summary)

        return approve

    async def wait(self, session_id: str, call_id: str, *, tool: str, summary: str) -> bool:
        """Ask and wait for the answer: True only for ``allow``."""
        answered = await self.answered(session_id, call_id, tool=tool, summary=summary)
        return answered.answer is True

    async def answered(self, session_id: str, call_id: str, *, tool: str, summary: str) -> Answered:
        """Ask and wait for the answer: allowed only for ``allow``, with who answered."""
        asked = await self.control.ask_approval(
            session_id=session_id,
            call_id=call_id,
            tool=tool,
            summary=summary,
            holder=self.holder,
            wait_s=self.wait_s,
        )
        # The control plane's clock judges the deadline; this one only stops a worker
        # that cannot reach the control plane any more from waiting for ever.
        give_up = time.monotonic() + self.wait_s + 30.0
        status, who = asked.status, asked.answered_by
        while status == "pending":
            await asyncio.sleep(self.poll_s)
            try:
                found = await self.control.poll_approval(session_id=session_id, call_id=call_id)
            except ControlPlaneError as exc:
                log.warning("waiting for the approval of %s: %s", call_id, exc.message)
                if time.monotonic() >= give_up:
                    return Answered(False)
                continue
            status = "expired" if found is None else found.status
            who = None if found is None else found.answered_by
        if status == "expired":
            log.warning("approval of call %s in session %s expired: denied", call_id, session_id)
        return Answered(status == "allow", who if status in ("allow", "deny") else None)


class ParkingApprovals:
    """Approvers for a worker whose sessions go dormant while a person decides.

    The approver reads the control plane: an answer given (``allow``, ``deny``) is the
    decision, an expired question is a denial, and anything else parks the call (the
    worker records the question once the run has ended waiting). A call that cannot
    park (inside a code cell, or re-dispatched by recovery) and has no answer yet is
    denied at once, with the reason in the log."""

    def __init__(self, control: Approvals) -> None:
        self.control = control

    def approver(self, session_id: str) -> Approver:
        async def approve(tool: Tool, arguments: dict[str, Any]) -> ApprovalAnswer | Answered:
            ask = current_ask()
            if ask is None or ask.call_id is None:  # no call to ask about: never allow
                return "deny"
            try:
                found = await self.control.poll_approval(session_id=session_id, call_id=ask.call_id)
            except ControlPlaneError as exc:
                # nothing runs without an answer: park, and the next wake asks again
                log.warning("reading the approval of %s: %s", ask.call_id, exc.message)
                found = None
            if found is None or found.status == "pending":
                if not ask.may_park:
                    log.warning(
                        "call %s in session %s cannot wait for an approval here: denied",
                        ask.call_id, session_id,
                    )  # fmt: skip
                # the gate records the park or, where the call cannot wait (a code cell,
                # a re-dispatch by recovery), a denial that says why
                return "park"
            if found.status == "allow":
                return Answered("once", found.answered_by)
            if found.status == "expired":
                log.warning(
                    "approval of call %s in session %s expired: denied", ask.call_id, session_id
                )
                return "deny"
            return Answered("deny", found.answered_by)

        return approve

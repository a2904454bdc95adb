"""Approvals of worker-run calls, asked and answered through the control plane.

A worker has no terminal and no client attached: when the permission gate asks about a
call, ``ControlApprovals`` records the question in the control plane (``ask_approval``,
with a deadline) and polls it for an answer, which any host answers with a conditional
update (the first answer wins). The worker process stays up while it waits (the turn is
not dormant): its lease heartbeat keeps running, so no other worker takes the session.
When the deadline passes first, the question becomes ``expired`` and the call is denied
(the gate commits the denial as a fact).

The gate commits ``permission_requested`` just before it asks; the observer sees that
fact in the call's own task, so a context variable carries the call id to the approver.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable
from typing import Any

from lodger.control.interface import ControlPlane
from lodger.engine.permissions import Approver
from lodger.errors import ControlPlaneError
from lodger.events import Event, PermissionRequested
from lodger.tools.spec import Tool

__all__ = ["ControlApprovals"]

log = logging.getLogger("lodger.worker")

# (call id, summary) of the call the gate is asking about, set in the call's task
_ASKING: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "lodger_control_asking", default=None
)


class ControlApprovals:
    """Approvers for one worker: ask in the control plane, wait up to ``wait_s``."""

    def __init__(
        self, control: ControlPlane, *, holder: str, wait_s: float, poll_s: float = 0.25
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
        async def approve(tool: Tool, arguments: dict[str, Any]) -> bool:
            asking = _ASKING.get()
            if asking is None:  # the gate asked without a fact: never allow blindly
                return False
            call_id, summary = asking
            return await self.wait(session_id, call_id, tool=tool.name, summary=summary)

        return approve

    async def wait(self, session_id: str, call_id: str, *, tool: str, summary: str) -> bool:
        """Ask and wait for the answer: True only for ``allow``."""
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
        status = asked.status
        while status == "pending":
            await asyncio.sleep(self.poll_s)
            try:
                found = await self.control.poll_approval(session_id=session_id, call_id=call_id)
            except ControlPlaneError as exc:
                log.warning("waiting for the approval of %s: %s", call_id, exc.message)
                if time.monotonic() >= give_up:
                    return False
                continue
            status = "expired" if found is None else found.status
        if status == "expired":
            log.warning("approval of call %s in session %s expired: denied", call_id, session_id)
        return status == "allow"

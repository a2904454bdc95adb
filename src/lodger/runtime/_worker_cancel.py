"""Cancel a turn that a worker runs, through the control plane.

A sender (``lodger cancel --control``, a host in front of workers) records the request
for the session's current lease grant (``SessionCancels.request_cancel``: nothing when no
worker holds the session, the same row when asked twice). The worker that holds the
lease looks for it every ``every`` seconds while it works on the session, cancels the
running turn through its ``Sessions`` (the engine ends the turn ``cancelled``) and
settles the request with the outcome; a request still undelivered when the worker lets
the session go settles ``not_running`` as the wake ends (``end_wake``, in its
transaction: it never reaches a later run, it names the grant).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from lodger.engine.control import CancelOutcome
from lodger.errors import ControlPlaneError
from lodger.runtime.sessions import Sessions
from lodger.storage.control.fencing import LeaseGuard
from lodger.storage.control.interface import SessionCancels

__all__ = ["ask_worker_to_cancel", "deliver_cancels", "request_cancel"]

log = logging.getLogger("lodger.worker")

#: seconds a sender waits for the worker to settle its request
SETTLE_WAIT_S = 60.0


async def deliver_cancels(
    control: SessionCancels,
    guard: LeaseGuard,
    sessions: Sessions,
    session_id: str,
    turn: asyncio.Future[Any],
    *,
    every: float,
) -> None:
    """Deliver the cancel requests of the session while its lease is held, until
    ``turn`` (the wake's work) is done. The loop ends by itself then, not only when
    the worker cancels it: a cancellation can be lost on the way (Python 3.11's
    ``wait_for``, which the connection pool waits with when all its connections are
    lent, drops one that races a result), and a look that never ends kept the worker
    from stopping."""
    pending = None
    try:
        while not turn.done():
            # the first look after ``every``, not at once: the grant was just made (a
            # request made meanwhile waits that long), and a wake over sooner needs none
            # (its ``end_wake`` answers ``not_running``)
            await asyncio.wait([turn], timeout=every)
            lease = guard.lease(session_id) if not turn.done() else None
            if lease is not None:
                try:
                    pending = await control.pending_cancel(lease=lease)
                except ControlPlaneError as exc:
                    log.warning("reading cancels of %s: %s", session_id, exc.message)
                if pending is not None:
                    outcome = await sessions.cancel(
                        session_id, who=pending.who, reason=pending.reason
                    )
                    if outcome.status != "not_running":  # else: for the turn about to run
                        await control.settle_cancel(cancel_id=pending.id, status=outcome.status)
                        pending = None
    finally:
        if pending is not None:
            with contextlib.suppress(ControlPlaneError):
                await asyncio.shield(
                    control.settle_cancel(cancel_id=pending.id, status="not_running")
                )


async def request_cancel(
    dsn: str, session_id: str, *, who: str | None, reason: str
) -> CancelOutcome:
    """``ask_worker_to_cancel`` on the control plane ``dsn``."""
    from lodger.storage.control import open_control

    plane = open_control(dsn)
    await plane.start()
    try:
        return await ask_worker_to_cancel(plane, session_id, who=who, reason=reason)
    finally:
        await plane.close()


async def ask_worker_to_cancel(
    plane: SessionCancels,
    session_id: str,
    *,
    who: str | None,
    reason: str,
    wait_s: float = SETTLE_WAIT_S,
) -> CancelOutcome:
    """Ask the worker holding the session to cancel its turn, and wait (up to
    ``wait_s``) for its answer: ``requested`` when it has not answered by then."""
    made, created = await plane.request_cancel(session_id=session_id, who=who, reason=reason)
    if made is None:
        return CancelOutcome(session_id=session_id, status="not_running")
    if not created:
        return CancelOutcome(session_id=session_id, status="already_cancelling")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while loop.time() < deadline:
        now = await plane.get_cancel(cancel_id=made.id)
        if now is not None and now.status != "pending":
            status = now.status if now.status in _KNOWN else "not_running"
            return CancelOutcome(session_id=session_id, status=status)  # type: ignore[arg-type]
        await asyncio.sleep(0.1)
    return CancelOutcome(session_id=session_id, status="requested")


_KNOWN = ("cancelled", "already_cancelling", "not_running")

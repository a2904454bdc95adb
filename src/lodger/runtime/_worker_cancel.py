"""Cancel a turn that a worker runs, through the control plane.

A sender (``lodger cancel --control``, a host in front of workers) records the request
for the session's current lease grant (``SessionCancels.request_cancel``: nothing when no
worker holds the session, the same row when asked twice). The worker that holds the
lease looks for it every ``every`` seconds while it works on the session, cancels the
running turn through its ``Sessions`` (the engine ends the turn ``cancelled``) and
settles the request with the outcome (a request with policy ``interrupt``/``rollback``,
for a message sent with that policy, asks the turn to stop instead: ``deliver_stop``); a
request still undelivered when the worker lets the session go settles ``not_running`` as
the wake ends (``end_wake``, in its transaction: it never reaches a later run, it names
the grant). Permission-mode switches a host asked for (``session_modes``) are delivered
in the same loop (``deliver_modes``): through the running turn, as a switch of a turn
running here is; undelivered ones settle ``not_running`` when the worker lets go, and the
host then commits the switch itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from lodger.engine.control import CancelOutcome
from lodger.errors import ControlPlaneError
from lodger.runtime._session_control import ModeOutcome, check_mode
from lodger.runtime._worker_queue import deliver_stop
from lodger.runtime.sessions import Sessions
from lodger.storage.control.fencing import LeaseGuard
from lodger.storage.control.interface import (
    ModeRequests,
    SessionCancel,
    SessionCancels,
    SessionLease,
)

__all__ = [
    "Delivered",
    "ask_worker_to_cancel",
    "ask_worker_to_switch",
    "deliver_cancels",
    "deliver_modes",
    "request_cancel",
    "switch_through",
]

log = logging.getLogger("lodger.worker")


class Delivered(SessionCancels, ModeRequests, Protocol):
    """What a worker delivers while it holds a session: cancels and mode switches."""


#: seconds a sender waits for the worker to settle its request
SETTLE_WAIT_S = 60.0


async def deliver_cancels(
    control: Delivered,
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
    held: SessionLease | None = None
    try:
        while not turn.done():
            # the first look after ``every``, not at once: the grant was just made (a
            # request made meanwhile waits that long), and a wake over sooner needs none
            # (its ``end_wake`` answers ``not_running``)
            await asyncio.wait([turn], timeout=every)
            lease = guard.lease(session_id) if not turn.done() else None
            if lease is not None:
                held = lease
                try:
                    pending = await control.pending_cancel(lease=lease)
                    await deliver_modes(control, sessions, lease)
                except ControlPlaneError as exc:
                    log.warning("reading cancels of %s: %s", session_id, exc.message)
                if pending is not None:
                    status = await _deliver(sessions, session_id, pending)
                    if status is not None:  # else: for the turn about to run
                        await control.settle_cancel(cancel_id=pending.id, status=status)
                        pending = None
    finally:
        with contextlib.suppress(ControlPlaneError):
            await asyncio.shield(_let_go(control, pending, held))


async def _let_go(
    control: Delivered, pending: SessionCancel | None, held: SessionLease | None
) -> None:
    """What is still undelivered as the worker lets the session go: ``not_running`` (a
    mode switch's sender then commits it itself)."""
    if pending is not None:
        await control.settle_cancel(cancel_id=pending.id, status="not_running")
    if held is not None:
        for request in await control.pending_modes(lease=held):
            await control.settle_mode(request_id=request.id, status="not_running")


async def deliver_modes(control: ModeRequests, sessions: Sessions, lease: SessionLease) -> None:
    """Commit the permission-mode switches hosts asked for through the running turn
    (they wait for the turn about to run while none does)."""
    for request in await control.pending_modes(lease=lease):
        running = sessions.turns.get(lease.session_id)
        if running is None or not running.busy:
            return
        done = await sessions.set_permission_mode(lease.session_id, request.mode, who=request.who)
        await control.settle_mode(request_id=request.id, status=done.status, previous=done.previous)


async def _deliver(sessions: Sessions, session_id: str, pending: SessionCancel) -> str | None:
    """Deliver one request to the running turn: how it settles (None: no turn runs)."""
    if pending.policy != "cancel":  # a message sent with policy interrupt or rollback
        return deliver_stop(sessions.turns.get(session_id), pending)
    outcome = await sessions.cancel(
        session_id, who=pending.who, reason=pending.reason, settle_open=False
    )
    return None if outcome.status == "not_running" else outcome.status


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


async def ask_worker_to_switch(
    plane: ModeRequests,
    session_id: str,
    mode: str,
    *,
    who: str | None,
    wait_s: float = SETTLE_WAIT_S,
) -> ModeOutcome | None:
    """Ask the worker holding the session to switch its running turn's permission mode,
    and wait (up to ``wait_s``) for its answer: the outcome, or None when no worker took
    it (none holds the session, it let go first, or no answer in time): the caller then
    commits the switch itself, under the session's lease."""
    made = await plane.request_mode(session_id=session_id, mode=mode, who=who)
    if made is None:
        return None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while loop.time() < deadline:
        found = await plane.get_mode_request(request_id=made.id)
        if found is not None and found.status in ("changed", "unchanged"):
            previous = None if found.previous is None else check_mode(found.previous)
            return ModeOutcome(
                session_id=session_id,
                status="changed" if found.status == "changed" else "unchanged",
                mode=check_mode(mode),
                previous=previous,
            )
        if found is not None and found.status != "pending":
            return None
        await asyncio.sleep(0.05)
    return None


async def switch_through(
    dsn: str, session_id: str, mode: str, *, who: str | None
) -> ModeOutcome | None:
    """``ask_worker_to_switch`` on the control plane ``dsn``."""
    from lodger.storage.control import open_control

    plane = open_control(dsn)
    await plane.start()
    try:
        return await ask_worker_to_switch(plane, session_id, mode, who=who)
    finally:
        await plane.close()

"""Steering sessions that run on workers (``lodger.engine.steering`` over the control
plane's ``Steers``).

While a worker's turn runs, ``relay_steers`` takes the steers hosts added for the
session and commits each through the running turn's journal (``steer_received``; the
engine delivers it at the next provider boundary), then marks them done. A steer whose
id the log already holds (a worker died between its commit and ``done_steers``) is not
committed again. What no turn took is sent as a wake once the worker has let the
session go (``requeue_left``): it is the session's next message. Follow-up messages the
turn queued in the log (a steer that came after its last step) run as turns before the
worker lets go (``run_followups``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from lodger.engine.loop import TurnResult
from lodger.engine.queue import logged_steer_ids
from lodger.errors import ControlPlaneError
from lodger.runtime._worker_queue import relay_urgent
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage.control.interface import FollowUps, Steers

__all__ = ["Relayed", "relay_steers", "requeue_left", "run_followups"]

log = logging.getLogger("lodger.worker")


class Relayed(Steers, FollowUps, Protocol):
    """What the relay reads: steers, and the follow-up queue's urgent messages."""


async def relay_steers(
    control: Relayed,
    sessions: Sessions,
    session_id: str,
    holder: str,
    turn: asyncio.Future[Any],
    *,
    poll_s: float,
) -> None:
    """Hand the session's steers to its running turn until ``turn`` is done."""
    while not turn.done():
        running = sessions.turns.get(session_id)
        if running is not None and running.busy and running.state is not None:
            try:
                await _relay_once(control, sessions, session_id, holder)
                # an interrupt or rollback message queued for the session stops its turn
                await relay_urgent(control, sessions, session_id, holder)
            except ControlPlaneError as exc:
                log.warning("taking steers of %s: %s", session_id, exc.message)
        await asyncio.wait([turn], timeout=poll_s)


async def _relay_once(control: Steers, sessions: Sessions, session_id: str, holder: str) -> None:
    running = sessions.turns.get(session_id)
    if running is None or running.state is None:
        return
    rows = await control.take_steers(session_id=session_id, holder=holder)
    if not rows:
        return
    done = logged_steer_ids(running.state.events, (r.steer_id for r in rows))
    for row in rows:
        if row.steer_id in done:
            continue
        steered = await running.steer(row.steer_id, row.text, row.who)
        if steered is None:
            break  # the turn's writer is closing: what is left becomes a wake
        done.add(row.steer_id)
    if done:
        await control.done_steers(session_id=session_id, steer_ids=sorted(done))


async def requeue_left(control: Steers, sessions: Sessions, session_id: str, holder: str) -> int:
    """Once the session is let go: the steers no turn took, sent as wakes."""
    left = await control.take_steers(session_id=session_id, holder=f"{holder}:requeue")
    if not left:
        return 0
    skip: set[str] = set()
    if await sessions.storage.log.exists(session_id):
        state = await sessions.state(session_id)
        skip = logged_steer_ids(state.events, (r.steer_id for r in left))
    return await control.requeue_steers(session_id=session_id, skip=sorted(skip))


async def run_followups(sessions: Sessions, session_id: str, binding: Binding) -> list[TurnResult]:
    """Run the follow-up messages the session's log queued, one turn each, while the
    turns complete (a turn that waits or parks leaves the rest for a later wake)."""
    results: list[TurnResult] = []
    while True:
        queue = await sessions.queue(session_id)
        if not queue:
            return results
        result = await sessions.run_queued(session_id, binding=binding)
        if result is None:
            return results
        results.append(result)
        if any(m.message_id == queue[0].message_id for m in await sessions.queue(session_id)):
            return results  # not delivered: the open turn did not settle first
        if result.status not in ("completed", "cancelled", "abandoned", "failed", "step_limit"):
            return results

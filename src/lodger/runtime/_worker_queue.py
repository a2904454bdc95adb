"""The follow-up queue of sessions that run on workers (the control plane's
``FollowUps``, ``session_queue``), delivered the way the log's own queue is.

A host queues a message in the control plane, where it can be listed, edited, moved and
retracted (each change names its author) until a worker takes it. The worker holding
the session takes an ``interrupt`` or ``rollback`` message into its running turn at once
(``relay_urgent``: a ``message_queued`` fact through the turn's journal, then the stop
request the library's queue makes), so the turn stops at its safe point and the message
runs next. An ``enqueue`` message waits until the worker's turn settles
(``take_into_log``): it is committed to the log as ``message_queued`` and run as the
next turn by ``run_followups``. A message whose id the log holds already (a worker died
between the commit and ``done_queued``) is not committed twice. Whatever is left when
the worker lets the session go is woken for (``wake_queued``).

A stop asked by a message sent with policy ``interrupt``/``rollback`` (not queued: a
wake) comes as a ``session_cancels`` request with that policy (``deliver_stop``).
"""

from __future__ import annotations

from lodger.engine.queue import StopRequest, check_message, logged_steer_ids
from lodger.engine.steering import TurnControl
from lodger.events import MessageQueued
from lodger.runtime._followups import session_fact
from lodger.runtime.sessions import Sessions
from lodger.storage.control.interface import FollowUps, QueuedRow, SessionCancel

__all__ = ["deliver_stop", "relay_urgent", "take_into_log"]


def _fact(row: QueuedRow) -> MessageQueued:
    return MessageQueued(
        message_id=row.message_id,
        text=row.text,
        policy=check_message(row.text, row.policy),
        who=row.who,
    )


async def relay_urgent(
    control: FollowUps, sessions: Sessions, session_id: str, holder: str
) -> None:
    """Take the interrupt and rollback messages queued for the session into its running
    turn, and ask that turn to stop for them (the first stop asked wins)."""
    while True:
        running = sessions.turns.get(session_id)
        if running is None or not running.busy or running.state is None:
            return
        row = await control.take_queued(session_id=session_id, holder=holder, urgent_only=True)
        if row is None:
            return
        logged = logged_steer_ids(running.state.events, (row.message_id,))
        if not logged and await running.record(_fact(row)) is None:
            return  # the turn's writer is closing: the message is taken after it
        running.request_stop(StopRequest(message_id=row.message_id, policy=_fact(row).policy))
        await control.done_queued(session_id=session_id, message_id=row.message_id)


async def take_into_log(
    control: FollowUps, sessions: Sessions, session_id: str, holder: str
) -> bool:
    """Commit the first message the control plane queued for the settled session to
    its log (the next turn ``run_followups`` runs); False when none waits."""
    row = await control.take_queued(session_id=session_id, holder=holder)
    if row is None:
        return False
    state = await sessions.state(session_id)
    if not logged_steer_ids(state.events, (row.message_id,)):
        await session_fact(sessions, session_id, _fact(row))
    await control.done_queued(session_id=session_id, message_id=row.message_id)
    return True


def deliver_stop(running: TurnControl | None, request: SessionCancel) -> str | None:
    """A stop asked through ``session_cancels`` for a message sent with policy
    ``interrupt``/``rollback`` (``reason`` names the message): how it settles, or None
    while no turn runs to stop (it waits for the turn about to run)."""
    if running is None or not running.busy:
        return None
    policy = check_message(" ", request.policy)
    running.request_stop(StopRequest(message_id=request.reason, policy=policy))
    return "stopped"

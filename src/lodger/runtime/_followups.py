"""The doors to steering and the follow-up queue (``lodger.engine.steering``), for the
agent and for the sessions service.

A fact for a session whose turn runs in this process goes through that turn's journal
(its ``TurnControl``); otherwise the door opens the session's writer for it. A steer
for a session with no turn running here becomes its next message.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Literal, Protocol

from lodger.engine.checkpoint import open_fold
from lodger.engine.journal import Journal
from lodger.engine.queue import QueuedMessage, Steered, StopRequest, check_message
from lodger.engine.state import SessionState
from lodger.engine.steering import RunningTurns
from lodger.errors import HostConflictError, SessionNotFoundError, UsageError
from lodger.events import Body, Event, MessageQueued, QueueChanged
from lodger.ids import IdFactory
from lodger.storage import EventLog, SessionWriter, check_session_id


class Door(Protocol):
    """What these functions use of their owner (an ``Agent``, or ``Sessions``)."""

    @property
    def turns(self) -> RunningTurns: ...
    @property
    def ids(self) -> IdFactory: ...
    @property
    def log(self) -> EventLog: ...

    def open_session(
        self, session_id: str
    ) -> AbstractAsyncContextManager[tuple[SessionWriter, SessionState]]: ...

    def journal_for(self, writer: SessionWriter, state: SessionState) -> Journal: ...


__all__ = ["Door", "change_queued", "enqueue", "queue_of", "session_fact", "steer"]

Change = Literal["edit", "move", "retract"]


async def _own_fact(agent: Door, session_id: str, body: Body) -> Event:
    """Commit ``body`` with a writer of the agent's own (no turn of it runs here)."""
    async with agent.open_session(session_id) as (writer, state):
        if not state.events:
            raise SessionNotFoundError(f"no log for session {session_id!r}", session_id=session_id)
        return await agent.journal_for(writer, state).fact(body)


async def session_fact(agent: Door, session_id: str, body: Body) -> Event:
    """Commit a session fact: through the turn running here, or with our own writer."""
    control = agent.turns.get(session_id)
    if control is not None:
        event = await control.record(body)
        if event is not None:
            return event
        await control.done()  # its writer is closing: ours opens after it
    return await _own_fact(agent, session_id, body)


async def steer(agent: Door, session_id: str, text: str, who: str | None) -> Steered:
    check_session_id(session_id)
    check_message(text)
    steer_id = agent.ids.new_id()
    control = agent.turns.get(session_id)
    if control is not None:
        steered = await control.steer(steer_id, text, who)
        if steered is not None:
            return steered
        await control.done()
    # no turn runs here: the steer is the session's next message
    event = await _own_fact(
        agent, session_id, MessageQueued(message_id=steer_id, text=text, who=who)
    )
    return Steered(steer_id=steer_id, status="queued", offset=event.offset)


async def enqueue(
    agent: Door, session_id: str, text: str, policy: str, who: str | None
) -> QueuedMessage:
    check_session_id(session_id)
    checked = check_message(text, policy)
    control = agent.turns.get(session_id)
    busy = control is not None and control.busy
    if checked == "reject" and busy:
        raise HostConflictError(
            f"session {session_id!r} is running a turn, and the message's policy is reject",
            hint="send it again once the turn has ended, or with policy enqueue",
            code="session_busy",
            session_id=session_id,
        )
    message_id = agent.ids.new_id()
    body = MessageQueued(message_id=message_id, text=text, policy=checked, who=who)
    event = await session_fact(agent, session_id, body)
    if control is not None and checked in ("interrupt", "rollback"):
        control.request_stop(StopRequest(message_id=message_id, policy=checked))
    return QueuedMessage(
        message_id=message_id, text=text, policy=checked, who=who, offset=event.offset
    )


async def _state(agent: Door, session_id: str) -> SessionState:
    control = agent.turns.get(session_id)
    if control is not None and control.state is not None:
        return control.state  # the running turn's fold: as current as the log
    if not await agent.log.exists(session_id):
        raise SessionNotFoundError(f"no log for session {session_id!r}", session_id=session_id)
    return await open_fold(agent.log, session_id)


async def queue_of(agent: Door, session_id: str) -> list[QueuedMessage]:
    check_session_id(session_id)
    return list((await _state(agent, session_id)).queue)


async def change_queued(
    agent: Door,
    session_id: str,
    message_id: str,
    action: Change,
    *,
    text: str | None = None,
    position: int | None = None,
    who: str | None = None,
) -> list[QueuedMessage]:
    """Edit, move or retract a queued message; the queue after the change."""
    check_session_id(session_id)
    if action == "edit":
        check_message(text or "")
    if action == "move" and (type(position) is not int or position < 0):
        raise UsageError(
            "a move needs a position of 0 or more (0: the front of the queue)",
            code="usage",
        )
    state = await _state(agent, session_id)
    if not any(m.message_id == message_id for m in state.queue):
        raise UsageError(
            f"no message {message_id!r} waits in the queue of session {session_id!r}",
            hint="list the queue: a message leaves it once delivered or retracted",
            code="not_queued",
            session_id=session_id,
        )
    change = QueueChanged(
        message_id=message_id,
        action=action,
        text=text if action == "edit" else None,
        position=position if action == "move" else None,
        who=who,
    )
    await session_fact(agent, session_id, change)
    return list((await _state(agent, session_id)).queue)

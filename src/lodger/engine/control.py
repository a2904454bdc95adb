"""Control of a running turn from outside it: a cancel request, a permission-mode switch.

A session has one writer, the run that drives its open turn; everything a person does to
that turn while it runs goes through that run. ``RunningTurns`` keeps, per session, the
turn running in this process (``TurnControl``: its task and its journal), so a door
(``Agent.cancel``, the host, a worker polling the control plane, a CLI process watching
the state directory) reaches it by session id alone.

A cancel is a request, not a kill: ``TurnControl.cancel`` records who asked and why, and
cancels the turn's task once the engine drives the turn (``driving``). The engine then
does what it does for any stop from outside (queued calls never start, calls past T1
settle and are recorded), and because a request is there it ends the turn instead of
leaving it open: ``cancel_requested``, ``run_ended`` cancelled and ``turn_ended``
cancelled, committed together. The request is read with ``requested_cancel()`` only in
the turn's own task: a subagent's run inside one of its calls is stopped like any call.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    from lodger.engine.journal import Journal

__all__ = [
    "CancelOutcome",
    "CancelRequest",
    "CancelStatus",
    "RunningTurns",
    "TurnControl",
    "requested_cancel",
]

T = TypeVar("T")

#: ``cancelled``: the running turn ended cancelled by this request; ``requested``: the
#: request was handed to the process running the turn (it ends the turn when it reads
#: it); ``already_cancelling``: a cancel of this turn was asked before (nothing new was
#: written); ``not_running``: no turn of the session runs (nothing was written);
#: ``unknown_session``: there is no such session
CancelStatus = Literal[
    "cancelled", "requested", "already_cancelling", "not_running", "unknown_session"
]


@dataclass(frozen=True, kw_only=True)
class CancelRequest:
    """Who asked to cancel the running turn, and why (``cancel_requested``'s fields)."""

    who: str | None = None
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class CancelOutcome:
    """What a cancel did: ``status`` (``CancelStatus``), the turn it was for, and, when
    this call saw the turn end, how it ended."""

    session_id: str
    status: CancelStatus
    turn_id: str | None = None
    #: how the turn settled (``cancelled``, or how it ended first), when known
    turn_status: str | None = None

    @property
    def written(self) -> bool:
        """Whether this request is (or will be) the one ``cancel_requested`` fact."""
        return self.status in ("cancelled", "requested")

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "status": self.status,
            "turn_id": self.turn_id,
            "turn_status": self.turn_status,
        }


class TurnControl:
    """One turn running in this process: its task, its journal, and a cancel request
    once one came."""

    def __init__(self, session_id: str, journal: Journal) -> None:
        self.session_id = session_id
        self.journal = journal
        self.task: asyncio.Task[Any] | None = None
        self.request: CancelRequest | None = None
        #: set by the engine while it drives the turn's steps: a cancel then stops the
        #: task; before that the engine reads the request when it starts driving
        self.driving = False
        #: held while a permission-mode switch reads the mode and commits the change
        self.mode_lock = asyncio.Lock()
        self._driven: str | None = None

    @property
    def turn_id(self) -> str | None:
        """The turn the engine drives (or the session's open turn, before it does)."""
        return self._driven or self.journal.state.open_turn

    def cancel(self, request: CancelRequest) -> bool:
        """Ask the turn to stop; False when a cancel was asked before (nothing changes)."""
        if self.request is not None:
            return False
        self.request = request
        if self.driving and self.task is not None and not self.task.done():
            self.task.cancel()
        return True

    def start_driving(self, turn_id: str) -> None:
        """The engine drives ``turn_id`` now (it checks ``request`` itself right after)."""
        self.driving = True
        self._driven = turn_id

    def stop_driving(self) -> None:
        """The run commits its end now: a cancel no longer stops the task, which would
        otherwise find its end committed (or being committed) and end it a second time."""
        self.driving = False

    async def settled(self) -> None:
        """Wait until the turn's task is done, without being stopped by it."""
        task = self.task
        if task is None or _CURRENT.get() is self:
            return  # asked from inside the turn (a tool): it cannot wait for itself
        await asyncio.wait({task})


_CURRENT: contextvars.ContextVar[TurnControl | None] = contextvars.ContextVar(
    "lodger_turn_control", default=None
)


def current_control() -> TurnControl | None:
    """The control of the turn whose own task this is (None in any other task: a call's,
    a subagent's)."""
    control = _CURRENT.get()
    if control is None or control.task is not asyncio.current_task():
        return None
    return control


def requested_cancel() -> CancelRequest | None:
    """The cancel request of the turn running in this task, if one came."""
    control = current_control()
    return control.request if control is not None else None


class RunningTurns:
    """The turns running in this process, by session (share one between the agents of a
    service, as ``Sessions`` does, so any of them can reach any running turn)."""

    def __init__(self) -> None:
        self._turns: dict[str, TurnControl] = {}

    def get(self, session_id: str) -> TurnControl | None:
        return self._turns.get(session_id)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._turns))

    def __len__(self) -> int:
        return len(self._turns)

    async def run(self, session_id: str, journal: Journal, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` (the engine on ``journal``) as the session's running turn, in a
        task of its own so a cancel can stop it; a cancellation of the caller stops it
        too and propagates once it settled."""
        control = TurnControl(session_id, journal)
        context = contextvars.copy_context()
        context.run(_CURRENT.set, control)
        task = asyncio.get_running_loop().create_task(work, context=context)
        control.task = task
        self._turns[session_id] = control  # one writer per session: one running turn
        try:
            return await task  # a cancel of the caller cancels the task and waits for it
        finally:
            if self._turns.get(session_id) is control:
                del self._turns[session_id]

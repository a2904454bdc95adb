"""Steering a running turn, and the follow-up queue, as facts of the session's log.

A steer is a message for the turn that is running. ``steer_received`` commits as soon as
it arrives, through the running turn's journal (which serializes every append of the
run, so a steer that lands while a tool runs joins the group commit of the step's own
facts instead of racing them). The model reads it at the next provider boundary: before
the next step's request is built, the engine commits ``steer_delivered`` naming the
steers and that step's index, and the projection (``lodger.context``) shows each
delivered steer's text there as a user message. Replays and forks read the same facts,
so they show what the model knew when. A steer still undelivered when the turn ends is
committed, with the turn's end, as the next turn's input (``message_queued``); one that
arrives once the turn has ended is queued the same way.

The follow-up queue is a projection of the log too (``lodger.engine.queue``): each
``message_queued`` adds a message with its policy (``interrupt`` and ``rollback``
messages go ahead of the ``enqueue`` ones), each ``queue_changed`` edits, moves, retracts
or delivers one (a delivery commits with the ``turn_started`` of the turn it became).
Policies: ``enqueue`` waits for the running turn; ``reject`` is refused while a turn
runs; ``interrupt`` stops the running turn at the next step boundary, once the calls in
flight have settled, and runs next; ``rollback`` abandons the running turn before any
call it proposes next starts, and runs next.

``TurnControl`` is what other tasks of the process may do to one running turn (steer
it, queue a message that stops it, cancel it, switch its permission mode);
``RunningTurns`` finds it by session. It is the one registry of running turns: steering,
the queue, a cancel (``lodger.engine.control``) and a mode switch all go through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from typing import Any, Literal, TypeVar

from lodger.engine.control import CancelRequest
from lodger.engine.envelope import Envelope
from lodger.engine.journal import Journal
from lodger.engine.queue import Steered, StopRequest
from lodger.engine.state import SessionState
from lodger.events import Body, Event, MessageQueued, SteerDelivered, SteerReceived
from lodger.storage.branches import root_of

__all__ = [
    "RunningTurns",
    "TurnControl",
    "current_control",
    "enclosing_cancel",
    "requested_cancel",
]

T = TypeVar("T")

_Phase = Literal["starting", "running", "ending", "closed"]


class TurnControl:
    """What other tasks of this process may do to the turn running on one session.

    The engine ``attach``es its journal when it drives a turn; until then a steer waits.
    ``steer`` commits ``steer_received`` through that journal while the turn runs, or
    ``message_queued`` once its end is being committed (the turn has taken its last
    step). ``record`` commits a queue fact through it. After ``seal`` (the writer is
    about to close) both answer None: the caller then writes with a writer of its own.

    The agent ``run``s the turn's work in a task of its own, so ``cancel`` can stop it
    once the engine drives the turn (``start_driving``; ``stop_driving`` as the run's
    end commits: a cancel then stops nothing, so no second ``turn_ended`` is written).
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._lock = asyncio.Lock()
        self._journal: Journal | None = None
        self._env = Envelope()
        self._phase: _Phase = "starting"
        self._pending: list[SteerReceived] = []
        self._attached = asyncio.Event()
        self._sealed = asyncio.Event()
        self._done = asyncio.Event()
        #: the queued message that asked the turn to stop, if one did
        self.stop: StopRequest | None = None
        # ---- cancel and permission modes (``lodger.engine.control``)
        #: the task running the turn's work (``run``), once it runs
        self.task: asyncio.Task[Any] | None = None
        #: the cancel asked for the turn, once one came (the first one wins)
        self.request: CancelRequest | None = None
        #: set while the engine drives the turn's steps: a cancel then stops the task;
        #: before that the engine reads the request when it starts driving
        self.driving = False
        #: held while a permission-mode switch reads the mode and commits the change
        self.mode_lock = asyncio.Lock()
        self._run_journal: Journal | None = None
        self._driven: str | None = None

    @property
    def busy(self) -> bool:
        """Whether a turn is (about to be) driven here and has not begun to end."""
        return self._phase in ("starting", "running")

    def attach(self, journal: Journal, env: Envelope, pending: Sequence[SteerReceived]) -> None:
        """A run of a turn starts driving (``env``: its turn and run); ``pending`` are the
        turn's undelivered steers the log holds (a resume's, say)."""
        self._journal, self._env = journal, env
        self._pending = list(pending)
        self._phase = "running"
        self._attached.set()

    async def _ready(self) -> None:
        if self._attached.is_set() or self._sealed.is_set():
            return
        attached = asyncio.ensure_future(self._attached.wait())
        sealed = asyncio.ensure_future(self._sealed.wait())
        try:
            await asyncio.wait((attached, sealed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            attached.cancel()
            sealed.cancel()

    async def steer(self, steer_id: str, text: str, who: str | None) -> Steered | None:
        """Commit a steer for the running turn (None: sealed, write it elsewhere)."""
        await self._ready()
        async with self._lock:
            journal = self._journal
            if journal is None or self._phase == "closed":
                return None
            if self._phase == "running":
                body = SteerReceived(steer_id=steer_id, text=text, who=who)
                event = await journal.fact(body, self._env)
                self._pending.append(body)
                return Steered(steer_id=steer_id, status="steer", offset=event.offset)
            late = MessageQueued(message_id=steer_id, text=text, who=who)
            event = await journal.fact(late)
            return Steered(steer_id=steer_id, status="queued", offset=event.offset)

    async def record(self, body: Body) -> Event | None:
        """Commit a session fact (a queue change) through the turn's journal (None:
        sealed before a turn attached)."""
        await self._ready()
        async with self._lock:
            if self._journal is None or self._phase == "closed":
                return None
            return await self._journal.fact(body)

    def request_stop(self, request: StopRequest) -> None:
        """Ask the turn to stop at its next safe point (the first request wins)."""
        if self.stop is None and self.busy:
            self.stop = request

    def stopping(self, *, before_calls: bool = False) -> StopRequest | None:
        """The stop the engine acts on now: at a step boundary any; before the calls of a
        step only a rollback (an interrupt lets the step's calls run)."""
        stop = self.stop
        if stop is None or (before_calls and stop.policy != "rollback"):
            return None
        return stop

    async def deliver(self, step: int, env: Envelope) -> None:
        """Commit ``steer_delivered`` for the waiting steers, as step ``step``'s request
        is about to be built (nothing when none waits)."""
        if not self._pending or self._journal is None:
            return
        async with self._lock:
            ids = tuple(s.steer_id for s in self._pending)
            if not ids:
                return
            self._pending = []
            await self._journal.fact(SteerDelivered(steer_ids=ids, step=step), env)

    @contextlib.asynccontextmanager
    async def ending(self) -> AsyncIterator[list[MessageQueued]]:
        """Held while the turn's end commits: yields the steers no step carried, as the
        ``message_queued`` facts to commit with the end; later steers queue themselves."""
        async with self._lock:
            self._phase = "ending"
            self.stop = None  # acted on (or moot): the turn ends now
            left, self._pending = self._pending, []
            yield [MessageQueued(message_id=s.steer_id, text=s.text, who=s.who) for s in left]

    async def seal(self) -> None:
        """The turn's writer is about to close: nothing more goes through its journal."""
        async with self._lock:
            self._phase = "closed"
            self._journal = None
        self._sealed.set()

    @property
    def state(self) -> SessionState | None:
        """The session's fold as the running turn's journal feeds it (None: not attached)."""
        return self._journal.state if self._journal is not None else None

    async def done(self) -> None:
        """Wait until the turn's writer is closed (``RunningTurns.end``)."""
        await self._done.wait()

    # ------------------------------------------------------------ cancel and modes

    @property
    def journal(self) -> Journal | None:
        """The journal of the run driving the turn (None before it runs, once sealed)."""
        return None if self._phase == "closed" else self._run_journal

    @property
    def turn_id(self) -> str | None:
        """The turn the engine drives (or the session's open turn, before it does)."""
        if self._driven is not None:
            return self._driven
        journal = self._run_journal
        return self._env.turn_id or (journal.state.open_turn if journal is not None else None)

    def events(self) -> Sequence[Event]:
        """The session's facts as the run's journal holds them (none before it ran)."""
        journal = self._run_journal
        return journal.state.events if journal is not None else ()

    async def ready(self) -> Journal | None:
        """Wait until the engine drives the turn; its journal then (None: sealed first)."""
        await self._ready()
        return self._journal if self._phase != "closed" else None

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

    async def run(self, journal: Journal, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` (the engine on ``journal``) as the turn, in a task of its own so a
        cancel can stop it; a cancellation of the caller stops it too and propagates
        once it settled."""
        self._run_journal = journal
        context = contextvars.copy_context()
        context.run(_CURRENT.set, self)
        task = asyncio.get_running_loop().create_task(work, context=context)
        self.task = task
        return await task  # a cancel of the caller cancels the task and waits for it

    async def settled(self) -> None:
        """Wait until the turn's work is done (or, when it never ran, its writer closed),
        without being stopped by it."""
        if _CURRENT.get() is self:
            return  # asked from inside the turn (a tool): it cannot wait for itself
        task = self.task
        if task is not None:
            await asyncio.wait({task})
            return
        done = asyncio.ensure_future(self._done.wait())
        try:
            await asyncio.wait({done})
        finally:
            done.cancel()


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


def enclosing_cancel() -> CancelRequest | None:
    """The cancel request of the turn this task works for, from any of its tasks (a
    call's, a subagent's run inside one): how a child learns its parent was cancelled."""
    control = _CURRENT.get()
    return control.request if control is not None else None


def requested_cancel() -> CancelRequest | None:
    """The cancel request of the turn running in this task, if one came."""
    control = current_control()
    return control.request if control is not None else None


class RunningTurns:
    """The turns this process is driving, by session (one per session: one writer)."""

    def __init__(self) -> None:
        self._turns: dict[str, TurnControl] = {}

    def get(self, session_id: str) -> TurnControl | None:
        return self._turns.get(session_id)

    def of_session(self, name: str) -> TurnControl | None:
        """The turn running on ``name``, or on a branch of the session named ``name`` (a
        rewound session's turn is registered under its branch, ``S..rN``)."""
        found = self._turns.get(name)
        if found is not None:
            return found
        return next((c for k, c in self._turns.items() if root_of(k) == name), None)

    def begin(self, session_id: str) -> TurnControl:
        """A control for a turn about to open the session (registered unless another
        turn holds the session here: its writer will refuse this one anyway)."""
        control = TurnControl(session_id)
        self._turns.setdefault(session_id, control)
        return control

    def end(self, control: TurnControl) -> None:
        """The turn's writer is closed: writes for the session go elsewhere now."""
        if self._turns.get(control.session_id) is control:
            del self._turns[control.session_id]
        control._sealed.set()
        control._done.set()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._turns))

    def __len__(self) -> int:
        return len(self._turns)

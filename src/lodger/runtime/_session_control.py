"""Cancel a session's running turn, switch its permission mode: what ``Agent.cancel`` and
``Agent.set_permission_mode`` do, wherever the turn runs.

A turn running in this process is reached through ``RunningTurns``
(``lodger.engine.steering``, the registry steers use too); one that another process on
this machine runs, through the state directory (``lodger.runtime._local_control``). A
mode switch of a session nobody runs is committed here, through the session's own
writer. A cancel of a session nobody runs ends its open turn (interrupted, parked)
cancelled, through the session's own writer; with no open turn it writes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

from lodger.engine.control import CancelOutcome, CancelRequest
from lodger.engine.envelope import Envelope
from lodger.engine.journal import Journal
from lodger.engine.resume import cancel_open
from lodger.engine.state import SessionState
from lodger.engine.steering import RunningTurns, TurnControl
from lodger.errors import SessionNotFoundError, UsageError
from lodger.events import Event, PermissionMode, PermissionModeChanged, TurnEnded
from lodger.ids import Clock, IdFactory
from lodger.runtime import _local_control
from lodger.runtime.rewind import open_branch
from lodger.storage import SessionWriter, Storage

__all__ = [
    "PERMISSION_MODES",
    "ModeOutcome",
    "branch_of",
    "cancel_turn",
    "check_mode",
    "commit_cancel",
    "commit_mode",
    "request_handler",
    "switch_mode",
]

PERMISSION_MODES: tuple[str, ...] = get_args(PermissionMode)

#: seconds a sender waits for the process running the turn to take a request
_REPLY_WAIT_S = 10.0
#: seconds ``cancel`` waits for a turn another process runs to settle
_SETTLE_WAIT_S = 60.0
#: how many of the last facts are read for how that turn ended
_TAIL = 16


@dataclass(frozen=True, kw_only=True)
class ModeOutcome:
    """A switch of the permission mode: ``changed`` (a ``permission_mode_changed`` fact
    was committed) or ``unchanged`` (the session was in ``mode`` already: nothing was
    written)."""

    session_id: str
    status: Literal["changed", "unchanged"]
    mode: PermissionMode
    previous: PermissionMode | None = None
    #: the fact, when this process committed it; ``outside_run``: through the session's
    #: own writer, not a run's journal (whose observers saw it): a host publishes it
    event: Event | None = field(default=None, compare=False, repr=False)
    outside_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "status": self.status,
            "mode": self.mode,
            "previous": self.previous,
        }


def check_mode(mode: str) -> PermissionMode:
    if mode not in PERMISSION_MODES:
        raise UsageError(
            f"unknown permission mode {mode!r}",
            hint="use one of: " + ", ".join(PERMISSION_MODES),
            code="permission_mode",
        )
    return cast(PermissionMode, mode)


async def branch_of(turns: RunningTurns, storage: Storage, session_id: str) -> str:
    """The log a door for ``session_id`` reaches: the one its turn running here is
    registered under (found at once, so requests keep the order they came in), else the
    branch the name leads to now (a rewound session's current one)."""
    if turns.get(session_id) is not None:
        return session_id
    return await open_branch(storage, session_id)


# ---------------------------------------------------------------- cancel


async def _cancel_here(control: TurnControl, request: CancelRequest) -> CancelOutcome:
    sid = control.session_id
    if not control.cancel(request):
        return CancelOutcome(session_id=sid, status="already_cancelling", turn_id=control.turn_id)
    await control.settled()
    return _outcome_from(sid, control.turn_id, control.events())


def _outcome_from(session_id: str, turn_id: str | None, events: Any) -> CancelOutcome:
    """How the turn ended: by the cancel (``cancel_requested`` commits with its end), or
    otherwise first (then nothing of the cancel was written); ``not_running`` without a
    ``turn_status`` when it is still open (stopped by other means)."""
    for e in reversed(events):
        if e.turn_id == turn_id and isinstance(e.body, TurnEnded):
            status = e.body.status
            return CancelOutcome(
                session_id=session_id,
                status="cancelled" if status == "cancelled" else "not_running",
                turn_id=turn_id,
                turn_status=status,
            )
    return CancelOutcome(session_id=session_id, status="not_running", turn_id=turn_id)


#: ends an open turn nobody runs as cancelled: (session id, request) -> the outcome
IdleCancel = Callable[[str, CancelRequest], Awaitable[CancelOutcome]]


async def cancel_turn(
    turns: RunningTurns,
    storage: Storage,
    session_id: str,
    request: CancelRequest,
    *,
    idle: IdleCancel | None = None,
) -> CancelOutcome:
    """Cancel the session's running turn, here or in another process on this machine;
    with ``idle``, an open turn nobody runs (interrupted, parked) is ended cancelled
    through the session's own writer (``lodger.engine.resume.cancel_open``)."""
    control = turns.get(session_id)
    if control is not None:
        return await _cancel_here(control, request)
    if storage.control_dir is not None:
        body = {"kind": "cancel", "who": request.who, "reason": request.reason}
        reply = await asyncio.to_thread(
            _local_control.send_request,
            storage.control_dir,
            session_id,
            body,
            wait_s=_REPLY_WAIT_S,
        )
        if reply is not None:
            return await _settled_elsewhere(storage, session_id, reply)
    if not await storage.log.exists(session_id):
        return CancelOutcome(session_id=session_id, status="unknown_session")
    if idle is not None:
        return await idle(session_id, request)
    return CancelOutcome(session_id=session_id, status="not_running")


async def commit_cancel(
    writer: SessionWriter,
    state: SessionState,
    request: CancelRequest,
    *,
    clock: Clock,
    ids: IdFactory,
) -> CancelOutcome:
    """End the open turn nobody runs as cancelled (``not_running``: none is open)."""
    sid = writer.session_id
    turn_id = state.open_turn
    made = await cancel_open(
        writer, state, who=request.who, reason=request.reason, clock=clock, ids=ids
    )
    if not made:
        return CancelOutcome(session_id=sid, status="not_running")
    return CancelOutcome(
        session_id=sid, status="cancelled", turn_id=turn_id, turn_status="cancelled"
    )


async def _settled_elsewhere(
    storage: Storage, session_id: str, reply: dict[str, Any]
) -> CancelOutcome:
    """The runner took the request: wait (bounded) until its turn has ended, then read
    how from the log."""
    status = reply.get("status")
    turn_id = reply.get("turn_id") if isinstance(reply.get("turn_id"), str) else None
    if status != "accepted":
        known = ("already_cancelling", "not_running")
        return CancelOutcome(
            session_id=session_id,
            status=status if status in known else "not_running",
            turn_id=turn_id,
        )
    state_dir = storage.control_dir
    assert state_dir is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _SETTLE_WAIT_S
    runner = reply.get("token")
    while loop.time() < deadline:
        now = await asyncio.to_thread(_local_control.runner_of, state_dir, session_id)
        if now is None or now.token != runner:
            break
        await asyncio.sleep(_local_control.POLL_S)
    else:
        return CancelOutcome(session_id=session_id, status="requested", turn_id=turn_id)
    head = (await storage.log.head(session_id)).high_water
    # the turn's end is among the last facts (with its cancel and snapshot, if any)
    events = await storage.log.read(session_id, start=max(head - _TAIL, 0))
    found = _outcome_from(session_id, turn_id, events)
    if found.status == "not_running" and found.turn_status is None:
        # another turn may follow in the same process: the cancel was delivered
        return CancelOutcome(session_id=session_id, status="requested", turn_id=turn_id)
    return found


# ---------------------------------------------------------------- modes


async def _switch_here(
    control: TurnControl, mode: PermissionMode, who: str | None
) -> ModeOutcome | None:
    """Switch through the running turn's journal (None: its writer closed before the
    engine drove it; the switch goes through the session's own writer then)."""
    journal = await control.ready()
    if journal is None:
        return None
    async with control.mode_lock:  # two switches at once: each sees the other's
        previous = journal.state.permission_mode
        if previous == mode:
            return ModeOutcome(
                session_id=control.session_id, status="unchanged", mode=mode, previous=mode
            )
        # a fact of the running turn and run (shown with them), of no step or call
        state = journal.state
        env = Envelope(
            turn_id=state.open_turn, run_id=state.last_run_id if state.run_open else None
        )
        await journal.fact(PermissionModeChanged(mode=mode, previous=previous, who=who), env)
    return ModeOutcome(
        session_id=control.session_id, status="changed", mode=mode, previous=previous
    )


async def commit_mode(
    writer: SessionWriter,
    state: SessionState,
    mode: PermissionMode,
    who: str | None,
    *,
    clock: Clock,
    ids: IdFactory,
) -> ModeOutcome:
    """Commit a switch through the session's own writer (nobody runs its turns)."""
    sid = writer.session_id
    previous = state.permission_mode
    if previous == mode:
        return ModeOutcome(session_id=sid, status="unchanged", mode=mode, previous=mode)
    journal = Journal(writer, state, clock=clock, ids=ids)
    made = await journal.fact(PermissionModeChanged(mode=mode, previous=previous, who=who))
    return ModeOutcome(
        session_id=sid,
        status="changed",
        mode=mode,
        previous=previous,
        event=made,
        outside_run=True,
    )


#: commits a switch of a session nobody runs: (session id, mode, who) -> the outcome
IdleSwitch = Callable[[str, PermissionMode, str | None], Awaitable[ModeOutcome]]


async def switch_mode(
    turns: RunningTurns,
    storage: Storage,
    session_id: str,
    mode: PermissionMode,
    who: str | None,
    *,
    idle: IdleSwitch,
) -> ModeOutcome:
    """Switch the session's permission mode, through whoever writes its log now."""
    control = turns.get(session_id)
    if control is not None:
        switched = await _switch_here(control, mode, who)
        if switched is not None:
            return switched
        await control.done()  # its writer is closing: ours opens after it
    elif storage.control_dir is not None:
        body = {"kind": "mode", "mode": mode, "who": who}
        reply = await asyncio.to_thread(
            _local_control.send_request, storage.control_dir, session_id, body, wait_s=_REPLY_WAIT_S
        )
        if reply is not None and "status" in reply:
            return ModeOutcome(
                session_id=session_id,
                status=reply["status"],
                mode=mode,
                previous=reply.get("previous"),
            )
    if not await storage.log.exists(session_id):
        raise SessionNotFoundError(
            f"no log for session {session_id!r}: a permission mode is switched on a session "
            "that has run a turn",
            hint="run the session's first turn, then switch its mode",
            session_id=session_id,
        )
    return await idle(session_id, mode, who)


# ---------------------------------------------------------------- requests from elsewhere


def request_handler(turns: RunningTurns, session_id: str, token: str) -> _local_control.Handler:
    """What the process running the session's turn (announced with ``token``) does with a
    request another process sent through the state directory
    (``lodger.runtime._local_control``)."""

    async def handle(body: dict[str, Any]) -> dict[str, Any]:
        control = turns.get(session_id)
        if control is None:
            return {"status": "not_running"}
        if body.get("kind") == "cancel":
            who, reason = body.get("who"), body.get("reason")
            request = CancelRequest(
                who=who if isinstance(who, str) else None,
                reason=reason if isinstance(reason, str) else "",
            )
            accepted = control.cancel(request)
            return {
                "status": "accepted" if accepted else "already_cancelling",
                "turn_id": control.turn_id,
                "token": token,
            }
        if body.get("kind") == "mode":
            who = body.get("who")
            done = await _switch_here(
                control, check_mode(str(body.get("mode"))), who if isinstance(who, str) else None
            )
            return {} if done is None else done.to_dict()  # {}: the sender writes it
        return {"error": {"code": "usage", "message": f"unknown request {body.get('kind')!r}"}}

    return handle

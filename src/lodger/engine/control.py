"""Control of a running turn from outside it: a cancel request, a permission-mode switch.

A session has one writer, the run that drives its open turn; everything a person does to
that turn while it runs goes through that run. The registry of the turns running in this
process is steering's (``lodger.engine.steering``: ``RunningTurns`` and one
``TurnControl`` per running turn, holding its task and its journal), so a door
(``Agent.cancel``, the host, a worker polling the control plane, a CLI process watching
the state directory) reaches a turn by session id alone, as a steer does. This module
holds what a cancel is and what it did.

A cancel is a request, not a kill: ``TurnControl.cancel`` records who asked and why, and
cancels the turn's task once the engine drives the turn (``driving``). The engine then
does what it does for any stop from outside (queued calls never start, calls past T1
settle and are recorded), and because a request is there it ends the turn instead of
leaving it open: ``cancel_requested``, ``run_ended`` cancelled and ``turn_ended``
cancelled, committed together. The request is read with ``requested_cancel()`` only in
the turn's own task (``lodger.engine.steering.requested_cancel``): a subagent's run
inside one of its calls is stopped like any call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["CancelOutcome", "CancelRequest", "CancelStatus"]

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

"""Where a fact belongs: the typed envelope of an event and the context of a run.

``Envelope`` is what every event of a run shares with its neighbours (turn, run, step,
call, origin, visibility); the journal turns a body and an envelope into a draft, so no
envelope is ever a loose ``dict``. ``RunContext`` is the frozen context one run of one
turn executes in: the session, the ids and clock it takes new ids and times from, the
journal its facts go through, and the workspace its tools work in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lodger.events import Origin, Visibility
from lodger.ids import Clock, IdFactory

if TYPE_CHECKING:
    from lodger.engine.journal import Journal

__all__ = ["Envelope", "RunContext"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """Where an event sits: its turn, run, step and call, who made it, who may see it."""

    turn_id: str | None = None
    run_id: str | None = None
    step_id: str | None = None
    call_id: str | None = None
    parent_call_id: str | None = None
    origin: Origin = "runtime"
    visibility: Visibility = "model"

    def at_step(self, step_id: str) -> Envelope:
        # spelled out: ``dataclasses.replace`` costs twice as much, several times a call
        return Envelope(
            turn_id=self.turn_id,
            run_id=self.run_id,
            step_id=step_id,
            call_id=self.call_id,
            parent_call_id=self.parent_call_id,
            origin=self.origin,
            visibility=self.visibility,
        )

    def with_origin(self, origin: Origin) -> Envelope:
        return Envelope(
            turn_id=self.turn_id,
            run_id=self.run_id,
            step_id=self.step_id,
            call_id=self.call_id,
            parent_call_id=self.parent_call_id,
            origin=origin,
            visibility=self.visibility,
        )

    def for_call(
        self,
        call_id: str,
        *,
        parent_call_id: str | None = None,
        origin: Origin | None = None,
        visibility: Visibility | None = None,
    ) -> Envelope:
        return Envelope(
            turn_id=self.turn_id,
            run_id=self.run_id,
            step_id=self.step_id,
            call_id=call_id,
            parent_call_id=parent_call_id,
            origin=origin if origin is not None else self.origin,
            visibility=visibility if visibility is not None else self.visibility,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """One run of one turn: every fact it commits carries ``envelope``'s turn and run."""

    session_id: str
    turn_id: str
    run_id: str
    clock: Clock
    ids: IdFactory
    journal: Journal
    workspace: Path | None = None
    hidden: tuple[Path, ...] = ()

    @property
    def envelope(self) -> Envelope:
        return Envelope(turn_id=self.turn_id, run_id=self.run_id)

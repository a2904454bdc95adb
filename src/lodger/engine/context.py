"""Where a fact belongs: the typed envelope of an event and the context of a run.

``Envelope`` is what every event of a run shares with its neighbours (turn, run, step,
call, origin, visibility); the journal turns a body and an envelope into a draft, so no
envelope is ever a loose ``dict``. ``RunContext`` is the frozen context one run of one
turn executes in: the session, the ids and clock it takes new ids and times from, the
journal its facts go through, and the workspace its tools work in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from lodger.events import Origin, Visibility
from lodger.ids import Clock, IdFactory

if TYPE_CHECKING:
    from lodger.engine.journal import Journal

__all__ = ["Envelope", "RunContext"]


class Envelope(NamedTuple):
    """Where an event sits: its turn, run, step and call, who made it, who may see it.

    Immutable; a named tuple because several are made per call and a frozen dataclass
    costs four times as much to build (build it by keyword: the order is not a contract).
    """

    turn_id: str | None = None
    run_id: str | None = None
    step_id: str | None = None
    call_id: str | None = None
    parent_call_id: str | None = None
    origin: Origin = "runtime"
    visibility: Visibility = "model"

    # positional below: the field order is the class's, spelled out once here

    def at_step(self, step_id: str) -> Envelope:
        return Envelope(
            self.turn_id,
            self.run_id,
            step_id,
            self.call_id,
            self.parent_call_id,
            self.origin,
            self.visibility,
        )

    def with_origin(self, origin: Origin) -> Envelope:
        return Envelope(
            self.turn_id,
            self.run_id,
            self.step_id,
            self.call_id,
            self.parent_call_id,
            origin,
            self.visibility,
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
            self.turn_id,
            self.run_id,
            self.step_id,
            call_id,
            parent_call_id,
            origin if origin is not None else self.origin,
            visibility if visibility is not None else self.visibility,
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
    #: the envelope of the run's own facts (its turn and run), made once
    envelope: Envelope = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "envelope", Envelope(turn_id=self.turn_id, run_id=self.run_id))

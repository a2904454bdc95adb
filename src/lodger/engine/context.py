"""The context of a run.

``RunContext`` is the frozen context one run of one turn executes in: the session, the
ids and clock it takes new ids and times from, the journal its facts go through (which
turns a body and an ``Envelope``, ``lodger.engine.envelope``, into a draft), and the
workspace its tools work in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lodger.engine.envelope import Envelope
from lodger.engine.journal import Journal
from lodger.engine.steering import TurnControl
from lodger.ids import Clock, IdFactory

__all__ = ["RunContext"]


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
    #: what other tasks may do to the turn (steer it, stop it; ``lodger.engine.steering``)
    control: TurnControl | None = None
    #: the envelope of the run's own facts (its turn and run), made once
    envelope: Envelope = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "envelope", Envelope(turn_id=self.turn_id, run_id=self.run_id))

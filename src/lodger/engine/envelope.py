"""Where a fact belongs: the typed envelope of an event.

``Envelope`` is what every event of a run shares with its neighbours (turn, run, step,
call, origin, visibility); the journal turns a body and an envelope into a draft, so no
envelope is ever a loose ``dict``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from lodger.events import Origin, Visibility

__all__ = ["Envelope", "streaming_at", "streaming_envelope"]


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


# The step whose provider request is streaming text in this task (see ``streaming_at``).
_STREAMING: contextvars.ContextVar[Envelope | None] = contextvars.ContextVar(
    "lodger_streaming_step", default=None
)


def streaming_envelope() -> Envelope | None:
    """Where the text a model is streaming now belongs (its turn, run and step), for a
    text sink that labels its deltas; None outside a step's provider request. The step's
    own facts are not committed yet while its text streams (L9), so a sink learns the
    step's id here, not from the log."""
    return _STREAMING.get()


@contextmanager
def streaming_at(env: Envelope) -> Iterator[None]:
    """Within the block, ``streaming_envelope()`` is ``env`` (in this task and those it
    starts)."""
    token = _STREAMING.set(env)
    try:
        yield
    finally:
        _STREAMING.reset(token)

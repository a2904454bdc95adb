"""The text deltas of the turns a worker runs, relayed to the hosts.

A worker on a control plane that relays text (``TextNotices``: PostgreSQL's ``NOTIFY``)
wraps each binding's text sink: every delta is labelled with its session, turn and step
(``lodger.engine.envelope.streaming_envelope``) and with one past the newest fact the
worker had committed then, and queued; one task sends what is queued, pieces of one step
joined, a statement at a time. The queue is bounded: past ``max_chars`` a step's deltas
are dropped from the first that does not fit to its end, so what a host gets of a step is
a prefix of its text (its ``model_output`` fact holds all of it). Nothing here is a
fact: a relay that fails loses deltas, never facts, and never stops the turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque

from lodger.engine.envelope import streaming_envelope
from lodger.errors import ControlPlaneError
from lodger.events import Event
from lodger.runtime.sessions import Binding
from lodger.storage.control.interface import TextNotices, TextPiece

__all__ = ["TextRelay"]

_log = logging.getLogger("lodger.worker")


class TextRelay:
    def __init__(self, plane: TextNotices, *, max_chars: int = 64_000) -> None:
        self.plane = plane
        self.max_chars = max_chars
        self._pending: deque[TextPiece] = deque()
        self._chars = 0
        self._ready = asyncio.Event()
        self._heads: dict[str, int] = {}
        self._lossy: tuple[str, str, str] | None = None
        #: deltas dropped (the queue was full, or a send failed)
        self.dropped = 0

    def bind(self, session_id: str, binding: Binding) -> Binding:
        """``binding`` with its text relayed (and its facts watched for the head)."""
        on_event, on_text = binding.on_event, binding.on_text

        def seen(event: Event) -> None:
            self._heads[session_id] = event.offset + 1
            if on_event is not None:
                on_event(event)

        def text(delta: str) -> None:
            if on_text is not None:
                on_text(delta)
            where = streaming_envelope()
            if delta and where is not None and where.turn_id and where.step_id:
                after = self._heads.get(session_id, 0)
                self._push(TextPiece(session_id=session_id, turn_id=where.turn_id,
                                     step_id=where.step_id, after=after, text=delta))  # fmt: skip

        return dataclasses.replace(binding, on_event=seen, on_text=text)

    def forget(self, session_id: str) -> None:
        """The worker let the session go: its head is read anew next time."""
        self._heads.pop(session_id, None)

    def _push(self, piece: TextPiece) -> None:
        step = (piece.session_id, piece.turn_id, piece.step_id)
        if step == self._lossy or self._chars + len(piece.text) > self.max_chars:
            self._lossy = step
            self.dropped += 1
            return
        tail = self._pending[-1] if self._pending else None
        if tail is not None and (tail.session_id, tail.turn_id, tail.step_id, tail.after) == (
            *step,
            piece.after,
        ):
            self._pending[-1] = dataclasses.replace(tail, text=tail.text + piece.text)
        else:
            self._pending.append(piece)
        self._chars += len(piece.text)
        self._ready.set()

    async def run(self) -> None:
        """Send what is queued, until cancelled."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            pieces = list(self._pending)
            self._pending.clear()
            self._chars = 0
            try:
                await self.plane.notify_text(pieces=pieces)
            except ControlPlaneError as exc:  # deltas are best effort: the facts are not
                self.dropped += len(pieces)
                _log.warning("relaying text deltas: %s", exc)

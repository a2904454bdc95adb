"""A turn as an async iterator of typed items: streamed text, committed facts, the end.

    async with agent.stream("fix the failing test") as stream:
        async for item in stream:
            match item:
                case TextDelta(text=text):
                    print(text, end="")
                case FactCommitted(event=event):
                    log(event.offset, event.kind)
                case TurnFinished(result=result):
                    print(result.status, result.usage.total_tokens)

``stream.steer("use the other file")`` sends a message to the running turn: the model
reads it at its next provider boundary (``lodger.engine.steering``).

Text deltas are live display only; a ``FactCommitted`` item is yielded after its event is
durable, so whatever the consumer does with it is backed by the log. The turn runs in a
task the stream owns: leaving the ``async with`` block early stops the turn the way a
Ctrl-C does (every call settles and is recorded; the turn stays open to resume), while
``await stream.cancel(who=..., reason=...)`` ends the turn ``cancelled`` as
``Agent.cancel`` does (the stream then yields its ``TurnFinished``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lodger.engine.queue import Steered

from lodger.errors import UsageError
from lodger.events import Event

if TYPE_CHECKING:
    from lodger.engine.control import CancelOutcome
    from lodger.engine.loop import TurnResult

__all__ = ["FactCommitted", "StreamItem", "TextDelta", "TurnFinished", "TurnStream"]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the model's text as it streams (not yet a fact)."""

    text: str


@dataclass(frozen=True, slots=True)
class FactCommitted:
    """An event that is now durable in the session's log."""

    event: Event


@dataclass(frozen=True, slots=True)
class TurnFinished:
    """The last item: how the turn settled."""

    result: TurnResult


StreamItem = TextDelta | FactCommitted | TurnFinished

Starter = Callable[[Callable[[Event], None], Callable[[str], None]], Awaitable["TurnResult"]]
Steerer = Callable[[str, "str | None"], Awaitable["Steered"]]
#: (who, reason) -> what the cancel of the stream's turn did
Canceller = Callable[[str | None, str], Awaitable["CancelOutcome"]]


class TurnStream:
    """Owns the task running one turn and hands its items out in order."""

    def __init__(
        self,
        start: Starter,
        *,
        session_id: str | None = None,
        steer: Steerer | None = None,
        cancel: Canceller | None = None,
    ) -> None:
        self._start = start
        #: the session the turn runs on
        self.session_id = session_id
        self._steer = steer
        self._cancel = cancel
        self._queue: asyncio.Queue[StreamItem | BaseException] = asyncio.Queue()
        self._task: asyncio.Task[TurnResult] | None = None
        self._finished = False
        self._result: TurnResult | None = None

    @property
    def result(self) -> TurnResult:
        """The turn's result, once the stream has yielded ``TurnFinished``."""
        if self._result is None:
            raise UsageError(
                "the turn has not finished yet",
                hint="iterate the stream to its end first",
                code="stream_unfinished",
            )
        return self._result

    def _begin(self) -> None:
        if self._task is not None:
            return

        async def run() -> TurnResult:
            try:
                result = await self._start(
                    lambda e: self._queue.put_nowait(FactCommitted(e)),
                    lambda t: self._queue.put_nowait(TextDelta(t)),
                )
            except BaseException as exc:
                self._queue.put_nowait(exc)
                raise
            self._queue.put_nowait(TurnFinished(result))
            return result

        self._task = asyncio.ensure_future(run())

    async def __aenter__(self) -> TurnStream:
        self._begin()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the turn if it still runs, and wait until it has settled."""
        task = self._task
        if task is None:
            return
        if not task.done():
            task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are being cancelled ourselves: pass it on
        except Exception:
            if not self._finished:
                raise  # the consumer never saw it

    async def cancel(self, *, who: str | None = None, reason: str = "") -> CancelOutcome:
        """End the running turn ``cancelled`` (see ``Agent.cancel``); iterating goes on
        to the ``TurnFinished`` item."""
        if self._cancel is None:
            raise UsageError(
                "this stream cannot cancel its turn",
                hint="make the stream with Agent.stream",
                code="usage",
            )
        return await self._cancel(who, reason)

    def __aiter__(self) -> TurnStream:
        return self

    async def __anext__(self) -> StreamItem:
        if self._finished:
            raise StopAsyncIteration
        self._begin()
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        if isinstance(item, TurnFinished):
            self._finished = True
            self._result = item.result
        return item

    async def steer(self, text: str, *, who: str | None = None) -> Steered:
        """Send ``text`` to this turn (``Agent.steer`` on its session): delivered at its
        next provider boundary, or queued as the next turn once it has taken its last step."""
        if self._steer is None:
            raise UsageError("this stream cannot be steered", code="usage")
        return await self._steer(text, who)

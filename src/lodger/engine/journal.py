"""The journal: the one place a run appends facts to its session's log.

It serializes appends from concurrent calls (the log needs an expected offset), stamps
ids and times from the injected context, feeds every committed batch to the session's
``SessionState``, and stops everything after the first failed commit: once a commit has
failed, the log's state is unknown to this run, so no new fact and no new side effect
may follow. Appends are shielded from cancellation so an interrupted caller never
loses track of a commit that completed on the storage thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from lodger.engine.context import Envelope
from lodger.engine.state import SessionState
from lodger.errors import CommitFailedError, StorageError
from lodger.events import Body, Event, EventDraft, new_draft
from lodger.ids import Clock, IdFactory
from lodger.storage import SessionWriter

__all__ = ["Journal"]

_NO_ENVELOPE = Envelope()


class Journal:
    def __init__(
        self,
        writer: SessionWriter,
        state: SessionState,
        *,
        clock: Clock,
        ids: IdFactory,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.writer = writer
        self.session_id = writer.session_id
        self.state = state
        self.clock = clock
        self.ids = ids
        self._on_event = on_event
        self._lock = asyncio.Lock()
        self._deferred: list[EventDraft] = []
        self.failure: CommitFailedError | None = None
        #: durable appends (each one atomic and synced) made through this journal
        self.commits = 0

    @property
    def events(self) -> list[Event]:
        """Every committed event of the session (the state's list; it only grows)."""
        return self.state.events

    def draft(self, body: Body, env: Envelope = _NO_ENVELOPE) -> EventDraft:
        # Built without validating again: the body is a validated model and the envelope
        # is typed (mypy checks it); sealing dumps the draft once, canonically.
        return new_draft(
            id=self.ids.new_id(),
            ts=self.clock.now_us(),
            body=body,
            turn_id=env.turn_id,
            run_id=env.run_id,
            step_id=env.step_id,
            call_id=env.call_id,
            parent_call_id=env.parent_call_id,
            origin=env.origin,
            visibility=env.visibility,
        )

    def defer(self, draft: EventDraft) -> None:
        """Commit ``draft`` together with the next ``record`` (saves a sync when nothing
        may act on the fact before then, e.g. a step's start before the model answers)."""
        self._deferred.append(draft)

    def committed(self, draft: EventDraft) -> bool:
        """Whether ``draft`` is in the log (asked after an interrupted ``record``)."""
        return any(e.id == draft.id for e in reversed(self.events))

    async def claim(self, draft: EventDraft) -> Event:
        """Append ``draft`` exactly at the current head, or raise ``AppendConflictError``
        untouched (a resume's claim of its prefix: losing it is an answer, not a failure)."""
        async with self._lock:
            events = await self.writer.append([draft], expected_offset=len(self.events))
            self.commits += 1
            self.state.feed(events)
        self._notify(events)
        return events[0]

    async def record(self, *drafts: EventDraft) -> list[Event]:
        """Append ``drafts`` atomically; raise ``CommitFailedError`` if that cannot be proven."""
        async with self._lock:
            if self._deferred:
                drafts = (*self._deferred, *drafts)
                self._deferred.clear()
            if self.failure is not None:
                raise CommitFailedError(
                    f"session {self.session_id!r} stopped after a failed commit; "
                    "no new fact or side effect may follow",
                    hint="the committed prefix is intact; recover the session to continue",
                    session_id=self.session_id,
                ) from self.failure
            task = asyncio.ensure_future(
                self.writer.append(drafts, expected_offset=len(self.events))
            )
            try:
                events = await _settle(task)
            except asyncio.CancelledError:
                # Cancelled while the append ran: if it committed, memory must still match
                # the log (the next append names the offset after it), and the caller can
                # tell the fact is durable.
                if task.done() and not task.cancelled():
                    error = task.exception()
                    if error is None:
                        self.commits += 1
                        self.state.feed(task.result())
                        self._notify(task.result())
                    elif isinstance(error, StorageError):
                        self.failure = self._failed(error)
                raise
            except StorageError as exc:
                self.failure = self._failed(exc)
                raise self.failure from exc
            self.commits += 1
            self.state.feed(events)
        self._notify(events)
        return events

    def _failed(self, exc: StorageError) -> CommitFailedError:
        return CommitFailedError(
            f"commit to session {self.session_id!r} at offset {len(self.events)} "
            f"failed: {exc.message}",
            hint="nothing after the last committed fact ran; recover the session to see "
            "what is indeterminate",
            session_id=self.session_id,
            offset=len(self.events),
        )

    def _notify(self, events: Sequence[Event]) -> None:
        if self._on_event is not None:
            for event in events:
                self._on_event(event)

    async def fact(self, body: Body, env: Envelope = _NO_ENVELOPE) -> Event:
        return (await self.record(self.draft(body, env)))[0]


async def _settle(task: asyncio.Future[list[Event]]) -> list[Event]:
    """Await ``task`` to the end even if we are cancelled meanwhile, then re-raise."""
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result

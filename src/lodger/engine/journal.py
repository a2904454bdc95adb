"""The journal: the one place a run appends facts to its session's log.

It serializes appends from concurrent calls (the log needs an expected offset), stamps
ids and times from the injected context, feeds every committed batch to the session's
``SessionState``, and stops everything after the first failed commit: once a commit has
failed, the log's state is unknown to this run, so no new fact and no new side effect
may follow. Appends are shielded from cancellation so an interrupted caller never
loses track of a commit that completed on the storage thread.

Group commit: facts recorded while another append is in flight (the T1s and T2s of a
parallel batch) are committed together. Each ``record`` joins a queue; whoever gets the
append lock next takes every fact queued so far, in arrival order, and writes them as one
append (one segment put on the object store, one transaction on SQLite), then hands each
caller its own events. Nothing waits to gather a group: a commit with nothing in flight
goes at once. A group is atomic as a whole, and a failed group fails every caller in it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from lodger._core.eager import Finished, finish_shielded
from lodger.engine.envelope import Envelope
from lodger.engine.history import History
from lodger.engine.state import SessionState
from lodger.errors import CommitFailedError, LodgerError, StorageError
from lodger.events import Body, Event, EventDraft, new_draft
from lodger.ids import Clock, IdFactory
from lodger.storage import SessionWriter

__all__ = ["Journal"]

_NO_ENVELOPE = Envelope()


@dataclass(eq=False)
class _Ticket:
    """One ``record`` call waiting for the group commit that writes its drafts."""

    drafts: tuple[EventDraft, ...]
    outcome: asyncio.Future[list[Event]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


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
        self._queue: list[_Ticket] = []
        self.failure: CommitFailedError | None = None
        #: durable appends (each one atomic and synced) made through this journal
        self.commits = 0
        #: ``record`` calls served (more than ``commits`` when calls were grouped)
        self.records = 0

    @property
    def events(self) -> History:
        """Every committed event of the session (the state's history; it only grows)."""
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
        """Append ``drafts`` atomically; raise ``CommitFailedError`` if that cannot be proven.

        Concurrent calls are group-committed (see the module docstring). A caller
        cancelled before its group was taken writes nothing; one cancelled while its group
        is being written waits for the outcome first, so ``committed`` tells the truth.
        """
        if not self._queue and not self._lock.locked():
            # Nobody writes or waits: this call is a group of its own, written at once
            # (no ticket to hand the outcome through). Taking the free lock does not
            # suspend; if a claim holds it after all, whoever queued meanwhile goes first.
            async with self._lock:
                if not self._queue:
                    return await self._write_alone(drafts)
        ticket = _Ticket(drafts)
        self._queue.append(ticket)
        try:
            async with self._lock:
                if ticket in self._queue:  # nobody took it yet: lead the next group
                    await self._commit_group()
        except asyncio.CancelledError:
            if ticket in self._queue:
                self._queue.remove(ticket)  # never written
                raise
            if not ticket.outcome.done():
                await _wait_out(ticket.outcome)
            if ticket.outcome.done() and not ticket.outcome.cancelled():
                ticket.outcome.exception()  # retrieved: the caller learns it from the log
            raise
        return ticket.outcome.result()

    async def _commit_group(self) -> None:
        """Write every queued ticket as one append (called holding the lock)."""
        group, self._queue = self._queue, []
        try:
            await self._write(group)
        finally:
            unsettled = [t for t in group if not t.outcome.done()]
            if unsettled:
                failure = self._interrupted()
                for ticket in unsettled:
                    ticket.outcome.set_exception(failure)

    def _interrupted(self) -> CommitFailedError:
        """The append itself was cancelled or broke unexpectedly: whether it committed is
        unknown, so nothing more may follow on this journal."""
        if self.failure is None:
            self.failure = CommitFailedError(
                f"commit to session {self.session_id!r} at offset "
                f"{len(self.events)} was interrupted; its outcome is unknown",
                hint="recover the session to see what is committed",
                session_id=self.session_id,
                offset=len(self.events),
            )
        return self.failure

    def _stopped(self) -> CommitFailedError:
        error = CommitFailedError(
            f"session {self.session_id!r} stopped after a failed commit; "
            "no new fact or side effect may follow",
            hint="the committed prefix is intact; recover the session to continue",
            session_id=self.session_id,
        )
        error.__cause__ = self.failure
        return error

    async def _append(self, drafts: list[EventDraft]) -> Finished[list[Event]]:
        """Append ``drafts`` at the head, to the end whatever happens to the caller.

        The append starts in the caller's task: a store that answers without suspending
        (the memory twin) finishes right here. One that suspends (a thread, a socket) is
        driven on in the same task through any cancellation (``finish_shielded``), so
        memory always learns whether the log took the batch."""
        try:
            coro = self.writer.append(drafts, expected_offset=len(self.events))
            first = coro.send(None)
        except StopIteration as stop:
            return Finished(stop.value, None, False)
        except BaseException as exc:  # noqa: BLE001 - judged by the caller
            return Finished(None, exc, False)
        return await finish_shielded(coro, first)

    def _judge(self, error: BaseException) -> BaseException:
        """What an append's error means for this journal, and what to raise for it.

        A storage error: the commit failed, and so does every later one. Another lodger
        error: the batch was refused before anything was written (a draft that cannot be
        sealed, say). Anything else, a cancellation of the append itself included: its
        outcome is unknown, so nothing more may follow either."""
        if isinstance(error, StorageError):
            self.failure = self._failed(error)
            return self.failure
        if isinstance(error, LodgerError):
            return error
        self._interrupted()
        return error

    async def _write_alone(self, drafts: tuple[EventDraft, ...]) -> list[Event]:
        """``_write`` of a group of one that nobody else waits for, called holding the
        lock: each outcome ``_write`` would hand a lone ticket is raised or returned
        here instead (a refused batch takes the deferred facts with it, as there)."""
        if self.failure is not None:
            raise self._stopped()
        deferred, self._deferred = self._deferred, []
        done = await self._append([*deferred, *drafts])
        if done.error is not None:
            raised = self._judge(done.error)
            if done.cancelled:
                raise asyncio.CancelledError
            raise raised
        events = cast(list[Event], done.value)
        self.commits += 1
        self.records += 1
        self.state.feed(events)
        self._notify(events)
        if done.cancelled:
            # the append completed as the caller was cancelled: memory matches the log
            raise asyncio.CancelledError
        return events[len(deferred) :] if deferred else events

    async def _write(self, group: list[_Ticket]) -> None:
        """Append the drafts of ``group`` as one batch and settle each ticket's outcome."""
        if self.failure is not None:
            for ticket in group:
                ticket.outcome.set_exception(self._stopped())
            return
        deferred, self._deferred = self._deferred, []
        done = await self._append([*deferred, *(d for t in group for d in t.drafts)])
        if done.error is not None:
            error = done.error
            if (
                not done.cancelled
                and isinstance(error, LodgerError)
                and not isinstance(error, StorageError)
                and len(group) > 1
            ):
                # refused before anything was written: one bad caller must not fail the
                # others, so each goes again on its own (the deferred facts go with the
                # first; alone, a caller fails as before)
                self._deferred = deferred
                for ticket in group:
                    await self._write([ticket])
                return
            raised = self._judge(error)
            # an unknown outcome fails every caller as the journal's failure; the
            # leader's own record raises the error itself (below)
            shared = raised if isinstance(error, LodgerError) else self.failure
            assert shared is not None
            for ticket in group:
                ticket.outcome.set_exception(shared)
            if done.cancelled:
                raise asyncio.CancelledError
            if raised is error and not isinstance(error, LodgerError):
                raise error  # unexpected: the leader sees it as it is
            return
        events = cast(list[Event], done.value)
        self.commits += 1
        self.records += len(group)
        self.state.feed(events)
        at = len(deferred)
        for ticket in group:
            ticket.outcome.set_result(events[at : at + len(ticket.drafts)])
            at += len(ticket.drafts)
        self._notify(events)
        if done.cancelled:
            # Cancelled while the append ran and it committed: memory matches the log
            # (the next append names the offset after it), and the callers can tell
            # their facts are durable.
            raise asyncio.CancelledError

    def _failed(self, exc: StorageError) -> CommitFailedError:
        return CommitFailedError(
            f"commit to session {self.session_id!r} at offset {len(self.events)} "
            f"failed: {exc.message}",
            hint=self._undecided_hint(),
            session_id=self.session_id,
            offset=len(self.events),
        )

    def _undecided_hint(self) -> str:
        """What a failed commit leaves undecided: the calls whose T1 is committed and
        whose T2 is not (their effects may have run), or nothing when there are none."""
        open_calls = [
            f"{call.call_id} ({call.tool})"
            for call in self.state.calls.values()
            if call.status() == ("indeterminate", "t1_without_t2")
        ]
        if not open_calls:
            return (
                "nothing after the last committed fact ran; recover the session to see "
                "what is indeterminate"
            )
        shown = ", ".join(open_calls[:5]) + (" and more" if len(open_calls) > 5 else "")
        one = len(open_calls) == 1
        return (
            f"{'call' if one else 'calls'} {shown} {'was' if one else 'were'} dispatched but "
            f"{'its result was' if one else 'their results were'} not recorded, so "
            f"{'its effect' if one else 'their effects'} may have run and "
            f"{'is' if one else 'are'} undecided; recover the session (lodger recover) to "
            "decide"
        )

    def _notify(self, events: Sequence[Event]) -> None:
        if self._on_event is not None:
            for event in events:
                self._on_event(event)

    async def fact(self, body: Body, env: Envelope = _NO_ENVELOPE) -> Event:
        return (await self.record(self.draft(body, env)))[0]


async def _wait_out(outcome: asyncio.Future[list[Event]]) -> None:
    """Wait until ``outcome`` is settled, through any number of cancellations."""
    while not outcome.done():
        try:
            await asyncio.wait([outcome])
        except asyncio.CancelledError:
            continue

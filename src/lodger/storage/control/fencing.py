"""Fencing a worker's commits with its session lease.

A worker writes a session's log only through a ``FencedLogStore``: before every append it
asks the control plane whether the lease it holds on that session (holder and epoch) is
still current, judged by the control plane's clock. A worker that was paused (SIGSTOP, a
long GC, a VM migration) past its lease's expiry wakes up to a refused commit
(``LeaseLostError``, which the journal turns into a failed commit: nothing runs after it),
however its own clock reads.

Between that check and the store's put there is a window (a pause exactly there). The
object store closes it for the log: every append is a create-only put of the next
offset, so if the session's new holder has committed since, the stale put is refused
(``WriterFencedError``); if it has not, the stale fact lands first and the new holder,
which appends at the same offset when it starts, is the one refused and retries from
the longer log. Either way one writer per offset, and no later commit of the stale
worker passes the check.
"""

from __future__ import annotations

from collections.abc import Sequence

from lodger.errors import LeaseLostError
from lodger.storage.branches import root_of
from lodger.storage.control.interface import SessionLease, SessionLeases
from lodger.storage.logstore import ForwardingLogStore, LogStore, Record

__all__ = ["FencedLogStore", "LeaseGuard"]


class LeaseGuard:
    """The session leases one worker holds; ``check`` is the commit guard."""

    def __init__(self, control: SessionLeases) -> None:
        self.control = control
        self._leases: dict[str, SessionLease] = {}
        #: a delivered message's wake and offset, recorded with the session's next check
        self._starts: dict[str, tuple[int, int]] = {}
        #: commits checked (and refused) through this guard
        self.checked = 0
        self.refused = 0

    def hold(self, lease: SessionLease) -> None:
        self._leases[lease.session_id] = lease

    def drop(self, session_id: str, *, epoch: int | None = None) -> None:
        """Forget the session's lease; with ``epoch``, only that grant's (a newer one,
        taken by another slot once this one was released, stays)."""
        held = self._leases.get(session_id)
        if epoch is not None and held is not None and held.epoch != epoch:
            return
        self._leases.pop(session_id, None)
        self._starts.pop(session_id, None)

    def starting(self, session_id: str, *, wake_id: int, offset: int) -> None:
        """The wake's message is about to be delivered at ``offset``: record that
        (``mark_wake_started``) with the session's next commit check, before anything
        of the turn is committed, rather than in a round trip of its own."""
        self._starts[session_id] = (wake_id, offset)

    def lease(self, session_id: str) -> SessionLease | None:
        return self._leases.get(session_id)

    async def check(self, session_id: str) -> None:
        # a session's lease covers its branches (``S..rN``: a rewound session's logs)
        lease = self._leases.get(session_id) or self._leases.get(root_of(session_id))
        self.checked += 1
        if lease is None:
            self.refused += 1
            raise LeaseLostError(
                f"this worker holds no lease on session {session_id!r}",
                hint="take the session's lease before writing its log",
                session_id=session_id,
            )
        started = self._starts.pop(session_id, None) or self._starts.pop(lease.session_id, None)
        try:
            await self.control.check_session(lease=lease, wake_started=started)
        except LeaseLostError:
            self.refused += 1
            raise


class FencedLogStore(ForwardingLogStore):
    """A ``LogStore`` whose appends pass ``guard.check`` first; everything else delegates."""

    def __init__(self, inner: LogStore, guard: LeaseGuard) -> None:
        super().__init__(inner)
        self.guard = guard

    async def append_records(
        self, *, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        await self.guard.check(session_id)
        await self.inner.append_records(
            session_id=session_id, records=records, expected_offset=expected_offset
        )

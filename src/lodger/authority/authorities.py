"""The authorities of one process, and one call's reservation across them.

The runtime calls ``reserve`` for every call of a batch in the model's emission order,
before any of them is granted; each call then ``acquire``s its reservation after its
permission is decided and ``close``s it after T2. Reserving first is what makes
conflicting calls run in emission order even though their permission checks finish in
any order, while calls that conflict with nothing never wait for anyone.

A reservation acquires in a fixed order (files, then actors, then capacity). File and
actor leases wait only for leases reserved before them, and a capacity unit is taken
last, when the call already holds everything else and only has to run, so no cycle of
waits can form.

>>> authorities = Authorities(capacity=CapacityAuthority({"mcp:github": 4}))
>>> reservation = authorities.reserve("call-1", claims)
>>> await reservation.acquire()
>>> ...  # T1, execute, T2
>>> reservation.close()
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from lodger.authority.actors import ActorAuthority
from lodger.authority.capacity import CapacityAuthority
from lodger.authority.common import AuthorityStatistics, Lease, QueueAuthority, ResourceClaim
from lodger.authority.files import FileLeaseAuthority
from lodger.authority.revisions import RevisionStore
from lodger.errors import AuthorityMisuseError

__all__ = ["Authorities", "Reservation"]


class Reservation:
    """One call's claims, reserved in its authorities' queues; acquired once, closed once."""

    def __init__(
        self,
        owner: str,
        claims: tuple[ResourceClaim, ...],
        reserved: list[Lease],
        capacity: CapacityAuthority,
        clock: Callable[[], float],
    ) -> None:
        self.owner = owner
        self.claims = claims
        self._leases = reserved
        self._capacity = capacity
        self._clock = clock
        self._acquired = False
        self.wait_seconds = 0.0

    def __repr__(self) -> str:
        return f"<Reservation owner={self.owner!r} {self.resources()}>"

    def resources(self) -> tuple[str, ...]:
        """The claims as recorded in T1: ``("write file:a.txt", "actor:shell")``."""
        return tuple(c.render() for c in self.claims)

    @property
    def held(self) -> bool:
        return self._acquired and all(lease.state == "held" for lease in self._leases)

    async def acquire(self) -> None:
        """Wait for every lease, files first; cancellation gives back whatever was granted."""
        if self._acquired:
            raise AuthorityMisuseError(
                f"the reservation of call {self.owner!r} ({', '.join(self.resources())}) "
                "was already acquired",
                owner=self.owner,
                holder=self.owner,
                hint="a call acquires its claims once",
            )
        self._acquired = True
        started = self._clock()
        try:
            for lease in list(self._leases):
                await lease.acquire()
            units = [c for c in self.claims if c.kind == "capacity"]
            if units:
                lease = self._capacity.request(self.owner, units)
                self._leases.append(lease)
                await lease.acquire()
        except BaseException:
            self.close()
            raise
        self.wait_seconds = self._clock() - started

    def close(self) -> None:
        """Release what is held and withdraw what is queued; safe to call more than once."""
        for lease in reversed(self._leases):
            lease.close()


class Authorities:
    """Files, actors and capacity for the calls of one process; revisions for tools' state.

    Pass the authorities to every ``Agent`` that shares a workspace so their calls meet
    on the same leases. ``statistics()`` is the debugging view: holders and waiters now,
    acquisitions and waits so far.
    """

    def __init__(
        self,
        *,
        files: FileLeaseAuthority | None = None,
        actors: ActorAuthority | None = None,
        capacity: CapacityAuthority | None = None,
        revisions: Sequence[RevisionStore[Any]] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.files = files or FileLeaseAuthority(clock=clock)
        self.actors = actors or ActorAuthority(clock=clock)
        self.capacity = capacity or CapacityAuthority(clock=clock)
        self.revisions = list(revisions)

    def reserve(self, owner: str, claims: Sequence[ResourceClaim]) -> Reservation:
        """Take the call's place in the file and actor queues now, synchronously."""
        unique = tuple(dict.fromkeys(claims))
        reserved: list[Lease] = []
        queues: tuple[QueueAuthority, ...] = (self.files, self.actors)
        try:
            for authority in queues:
                mine = [c for c in unique if c.kind in authority.kinds]
                if mine:
                    reserved.append(authority.request(owner, mine))
        except BaseException:
            for lease in reserved:
                lease.close()
            raise
        return Reservation(owner, unique, reserved, self.capacity, self.clock)

    def statistics(self) -> tuple[AuthorityStatistics, ...]:
        return (
            self.files.statistics(),
            self.actors.statistics(),
            self.capacity.statistics(),
            *(store.statistics() for store in self.revisions),
        )

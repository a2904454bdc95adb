"""Actors: single-state resources (a shell session, a browser) that do one thing at a time.

A resource that keeps state between operations (a terminal's working directory and
environment, a browser's page) cannot take two operations at once, whatever they touch.
Its actor runs operations one at a time, in the order they arrived; different actors are
independent. A call that claims ``ResourceClaim.actor("shell")`` holds the shell's actor
from T1 to T2; code that is not a call can use ``run``:

>>> actors = ActorAuthority()
>>> await actors.run("op-1", "browser", lambda: page.goto(url))
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from lodger.authority.common import Lease, QueueAuthority, ResourceClaim

__all__ = ["ActorAuthority"]

T = TypeVar("T")


class ActorAuthority(QueueAuthority):
    """One operation at a time per actor, in arrival order; actors never wait on each other."""

    name = "actors"
    kinds = frozenset({"actor"})

    def _blocks(self, earlier: Lease, later: Lease) -> bool:
        mine = {c.key for c in later.claims}
        return any(c.key in mine for c in earlier.claims)

    async def run(self, owner: str, actor: str, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation`` as the next turn of ``actor`` once every earlier one is done."""
        lease = await self.acquire(owner, [ResourceClaim.actor(actor)])
        try:
            return await operation()
        finally:
            lease.release(owner=owner)

    def busy(self, actor: str) -> str | None:
        """The owner whose operation the actor is running now, if any."""
        for lease in self._held:
            if any(c.key == actor for c in lease.claims):
                return lease.owner
        return None

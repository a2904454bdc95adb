"""Remote capacity: semaphores that limit how many calls use a server at once.

Each MCP server, provider or API quota has a configured limit. A call that claims
``ResourceClaim.capacity("mcp:github")`` takes one unit while it runs; when all units are
taken the next call waits, in arrival order. A limit never serializes unrelated work:
below the limit calls run together, and different keys never wait on each other.
A key with no configured limit uses ``default_limit``; ``None`` means unlimited (the
use is still counted in the statistics).

>>> capacity = CapacityAuthority(limits={"mcp:github": 2})
>>> lease = await capacity.acquire("call-1", [ResourceClaim.capacity("mcp:github")])
>>> capacity.in_use("mcp:github")
1
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from lodger.authority.common import Lease, QueueAuthority
from lodger.errors import UsageError

__all__ = ["CapacityAuthority"]


class CapacityAuthority(QueueAuthority):
    """Counting semaphores keyed by remote resource, fair in arrival order per key."""

    name = "capacity"
    kinds = frozenset({"capacity"})

    def __init__(
        self,
        limits: Mapping[str, int] | None = None,
        *,
        default_limit: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(clock=clock)
        self.limits = dict(limits or {})
        self.default_limit = default_limit
        configured = [*self.limits.items(), ("the default", default_limit)]
        for key, limit in configured:
            if limit is not None and limit < 1:
                raise UsageError(
                    f"capacity limit for {key!r} is {limit}; a limit is at least 1",
                    hint="leave a key out of the limits to make it unlimited",
                    code="claim",
                )

    def limit(self, key: str) -> int | None:
        """The configured number of units of ``key`` (None: unlimited)."""
        return self.limits.get(key, self.default_limit)

    def in_use(self, key: str) -> int:
        return sum(1 for lease in self._held for c in lease.claims if c.key == key)

    def _blocks(self, earlier: Lease, later: Lease) -> bool:
        # Fairness only: a later request for a key waits behind an earlier waiting one.
        mine = {c.key for c in later.claims}
        return any(c.key in mine for c in earlier.claims)

    def _fits(self, lease: Lease) -> bool:
        for claim in lease.claims:
            limit = self.limit(claim.key)
            if limit is not None and self.in_use(claim.key) >= limit:
                return False
        return True

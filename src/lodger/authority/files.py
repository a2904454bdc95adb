"""File leases: shared reads, exclusive writes, on files or whole subtrees, writer-fair.

Keys are canonical identities: ``ResourceClaim.file`` resolves the real path, so
``a.txt``, ``./sub/../a.txt``, an absolute spelling and a symlink to the file all meet on
one key. Two claims conflict when their areas overlap and at least one writes:

- an ``exact`` claim covers one path;
- a ``subtree`` claim covers a directory and everything under it (``shell`` in the
  workspace claims the workspace subtree), so it overlaps any claim inside it and any
  subtree claim above it.

Fairness comes from the queue (``QueueAuthority``): a lease waits for every earlier lease
it conflicts with, held or queued, so a reader that arrives after a queued writer never
overtakes it, and leases that conflict with nothing are granted at once.

>>> files = FileLeaseAuthority()
>>> lease = await files.acquire("call-1", [ResourceClaim.file("a.txt", mode="write")])
>>> files.statistics().holders[0].owner
'call-1'
>>> lease.release(owner="call-1")
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from lodger.authority.common import Lease, QueueAuthority, ResourceClaim

__all__ = ["FileLeaseAuthority", "claims_conflict", "covers"]


def covers(area: ResourceClaim, path: str) -> bool:
    """Whether ``path`` (a canonical key) lies in the area a file claim covers."""
    if area.scope == "exact":
        return path == area.key
    if path == area.key:
        return True
    prefix = area.key if area.key.endswith(os.sep) else area.key + os.sep
    return path.startswith(prefix)


def claims_conflict(a: ResourceClaim, b: ResourceClaim) -> bool:
    """Two file claims conflict when their areas overlap and at least one of them writes."""
    if a.mode == "read" and b.mode == "read":
        return False
    return covers(a, b.key) or covers(b, a.key)


class FileLeaseAuthority(QueueAuthority):
    """Read/write leases on canonical file identities, exact or subtree, writer-fair."""

    name = "files"
    kinds = frozenset({"file"})

    def _blocks(self, earlier: Lease, later: Lease) -> bool:
        return any(claims_conflict(a, b) for a in earlier.claims for b in later.claims)

    def holders_of(self, claim: ResourceClaim) -> list[str]:
        """The owners whose held leases conflict with ``claim`` (for debugging)."""
        return [
            lease.owner
            for lease in self._held
            if any(claims_conflict(held, claim) for held in lease.claims)
        ]

    def request(self, owner: str, claims: Sequence[ResourceClaim]) -> Lease:
        # A call that reads and writes one file needs only the write; keeping both is
        # harmless (a lease never conflicts with itself) but clutters statistics.
        writes = {c.key for c in claims if c.mode == "write" and c.scope == "exact"}
        kept = [
            c for c in claims if not (c.mode == "read" and c.scope == "exact" and c.key in writes)
        ]
        return super().request(owner, kept)

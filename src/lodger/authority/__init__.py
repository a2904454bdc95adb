"""Authorities beside the resources decide when calls may touch them (DESIGN section 7).

- ``FileLeaseAuthority``: shared-read / exclusive-write leases on canonical paths, exact
  or subtree, writer-fair;
- ``ActorAuthority``: single-state resources that run one operation at a time;
- ``CapacityAuthority``: semaphores with a configured limit per remote resource;
- ``RevisionStore``: compare-and-swap on a revision for state tools keep.

``Authorities`` bundles them for the runtime; ``ResourceClaim`` is what tools declare.
"""

from lodger.authority.actors import ActorAuthority
from lodger.authority.authorities import Authorities, Reservation
from lodger.authority.capacity import CapacityAuthority
from lodger.authority.common import (
    AuthorityStatistics,
    Holder,
    Lease,
    ResourceClaim,
)
from lodger.authority.files import FileLeaseAuthority
from lodger.authority.revisions import Revision, RevisionStore

__all__ = [
    "ActorAuthority",
    "Authorities",
    "AuthorityStatistics",
    "CapacityAuthority",
    "FileLeaseAuthority",
    "Holder",
    "Lease",
    "Reservation",
    "ResourceClaim",
    "Revision",
    "RevisionStore",
]

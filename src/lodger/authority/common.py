"""What every authority shares: the typed claim, the lease and its queue, the statistics.

A tool declares what it touches as ``ResourceClaim`` values; an authority beside the
resource decides when a call may hold them (DESIGN section 7). The lease state machine::

    reserved --acquire()--> waiting --granted--> held --release(owner)--> released
        \\________________________\\--withdraw(owner)--> withdrawn

A ``reserved`` lease already has its place in the queue (so conflicting requests that
arrive later line up behind it) but is not granted until its owner asks for it: the
runtime reserves a batch's claims in the model's emission order, then acquires each after
that call's permission is decided. ``close()`` ends a lease from any state and is what
structured cleanup uses; ``release`` and ``withdraw`` are strict and name their owner, so a
release by another call or a second release raises ``AuthorityMisuseError``.
"""

from __future__ import annotations

import asyncio
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lodger._core.text import visible_text
from lodger.errors import AuthorityMisuseError, UsageError

__all__ = [
    "AuthorityStatistics",
    "ClaimKind",
    "ClaimMode",
    "ClaimScope",
    "Holder",
    "Lease",
    "LeaseState",
    "QueueAuthority",
    "ResourceClaim",
]

ClaimKind = Literal["file", "actor", "capacity"]
ClaimMode = Literal["read", "write"]
ClaimScope = Literal["exact", "subtree"]
LeaseState = Literal["reserved", "waiting", "held", "released", "withdrawn"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ResourceClaim:
    """One resource a call needs while it runs.

    ``file`` claims are keyed by the resolved real path (build them with
    ``ResourceClaim.file`` so every spelling of a file meets on one key); ``mode`` is
    shared ``read`` or exclusive ``write`` and ``scope`` the file itself or the subtree
    under a directory. ``actor`` claims name a single-state resource (``"shell"``) and
    ``capacity`` claims a remote limit (``"mcp:github"``). ``label`` is only how the claim
    is shown (workspace-relative for files) and does not take part in equality.

    >>> ResourceClaim.file("/w/src/../a.txt", mode="read", root="/w").render()
    'read file:a.txt'
    """

    kind: ClaimKind
    key: str
    mode: ClaimMode = "write"
    scope: ClaimScope = "exact"
    label: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.key:
            raise UsageError(f"a {self.kind} claim needs a key", code="claim")
        if self.kind == "file" and os.path.normpath(self.key) != self.key:
            raise UsageError(
                f"file claim key {self.key!r} is not a canonical path",
                hint="build file claims with ResourceClaim.file(path, ...)",
                code="claim",
            )
        if self.kind == "file" and not os.path.isabs(self.key):
            raise UsageError(
                f"file claim key {self.key!r} is not absolute",
                hint="build file claims with ResourceClaim.file(path, ...)",
                code="claim",
            )
        if self.kind != "file" and self.scope != "exact":
            raise UsageError(f"only file claims have a subtree scope, not {self.kind}")

    @classmethod
    def file(
        cls,
        path: str | os.PathLike[str],
        *,
        mode: ClaimMode,
        scope: ClaimScope = "exact",
        root: str | os.PathLike[str] | None = None,
    ) -> ResourceClaim:
        """A file claim on the real path of ``path`` (symlinks and ``..`` resolved).

        With ``root`` the label is relative to it, so logs do not name the machine's paths.
        """
        key = os.path.realpath(path)
        label = None
        if root is not None:
            real_root = Path(os.path.realpath(root))
            if Path(key) == real_root or Path(key).is_relative_to(real_root):
                label = Path(key).relative_to(real_root).as_posix()
        return cls(kind="file", key=key, mode=mode, scope=scope, label=label)

    @classmethod
    def actor(cls, name: str) -> ResourceClaim:
        """One operation at a time on a single-state resource such as ``"shell"``."""
        return cls(kind="actor", key=name)

    @classmethod
    def capacity(cls, name: str) -> ResourceClaim:
        """One unit of a remote limit such as ``"mcp:github"`` or ``"provider:openai"``."""
        return cls(kind="capacity", key=name)

    def render(self) -> str:
        """The string recorded in T1 ``resources``: ``write file:src/a.py``, ``actor:shell``.

        A path that is not UTF-8 is written with its bytes escaped (``lodger._core.text``)."""
        name = visible_text(self.label if self.label is not None else self.key)
        if self.kind != "file":
            return f"{self.kind}:{name}"
        if self.scope == "subtree":
            name = f"{name.rstrip('/')}/**" if name != "/" else "/**"
        return f"{self.mode} file:{name}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Holder:
    """A lease as statistics show it: whose, what, and since when (monotonic seconds)."""

    owner: str
    resources: tuple[str, ...]
    since: float


@dataclass(frozen=True, kw_only=True, slots=True)
class AuthorityStatistics:
    """A snapshot for debugging: who holds, who waits, and counters since creation.

    ``waits`` counts grants that were not immediate, ``wait_seconds`` their total wait;
    ``conflicts`` counts stale compare-and-swap writes (revisions only).
    """

    authority: str
    holders: tuple[Holder, ...] = ()
    waiters: tuple[Holder, ...] = ()
    acquisitions: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    withdrawals: int = 0
    conflicts: int = 0


class Lease:
    """One owner's request for some claims from one authority (see the module docstring)."""

    def __init__(
        self, authority: QueueAuthority, owner: str, claims: tuple[ResourceClaim, ...]
    ) -> None:
        self.authority = authority
        self.owner = owner
        self.claims = claims
        self.state: LeaseState = "reserved"
        self.requested_at = authority.clock()
        self.granted_at: float | None = None
        self._granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def __repr__(self) -> str:
        return f"<Lease {self.state} owner={self.owner!r} {self.describe()}>"

    def describe(self) -> str:
        return ", ".join(c.render() for c in self.claims) or "nothing"

    @property
    def wait_seconds(self) -> float:
        """How long the lease waited for its grant (0 until granted)."""
        return 0.0 if self.granted_at is None else self.granted_at - self.requested_at

    async def acquire(self) -> None:
        """Ask for the grant and wait for it; cancellation withdraws the request."""
        if self.state != "reserved":
            raise self._misuse(self.owner, f"cannot be acquired: it is already {self.state}")
        self.state = "waiting"
        self.requested_at = self.authority.clock()
        self.authority._grant()
        if self._granted.done():
            return  # granted at once: nothing was in the way
        try:
            await self._granted
        except asyncio.CancelledError:
            self.close()  # withdraws it, or releases a grant that raced the cancellation
            raise
        self.authority._count_wait(self)

    def release(self, *, owner: str) -> None:
        """End a held lease; only its owner may, and only once."""
        self._check_owner(owner, "released")
        if self.state != "held":
            what = {
                "released": "was already released",
                "withdrawn": "was withdrawn and never held",
            }.get(self.state, "has not been granted yet; withdraw it instead")
            raise self._misuse(owner, f"cannot be released: it {what}")
        self.authority._finish(self, "released")

    def withdraw(self, *, owner: str) -> None:
        """Leave the queue before the grant; only its owner may, and only once."""
        self._check_owner(owner, "withdrawn")
        if self.state not in ("reserved", "waiting"):
            what = "is held; release it instead" if self.state == "held" else f"is {self.state}"
            raise self._misuse(owner, f"cannot be withdrawn: it {what}")
        self.authority._finish(self, "withdrawn")

    def close(self) -> None:
        """End the lease whatever its state (release, withdraw, or nothing); idempotent."""
        if self.state == "held":
            self.authority._finish(self, "released")
        elif self.state in ("reserved", "waiting"):
            self.authority._finish(self, "withdrawn")

    def _check_owner(self, owner: str, action: str) -> None:
        if owner != self.owner:
            raise self._misuse(
                owner, f"cannot be {action} by call {owner!r}, which does not own it"
            )

    def _misuse(self, owner: str, what: str) -> AuthorityMisuseError:
        return AuthorityMisuseError(
            f"the {self.authority.name} lease of call {self.owner!r} on {self.describe()} {what}",
            owner=owner,
            holder=self.owner,
            hint="a lease is acquired once and ended once, by the call that asked for it",
        )


class QueueAuthority(ABC):
    """A fair queue of leases: granted in arrival order among those that conflict.

    A lease is granted when it fits beside the held leases and no earlier lease still in
    the queue (reserved or waiting) blocks it, so a later request never overtakes an
    earlier conflicting one, and requests that conflict with nothing never wait.
    """

    name = "queue"
    kinds: frozenset[str] = frozenset()

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._queue: list[Lease] = []
        self._held: list[Lease] = []
        self._acquisitions = 0
        self._waits = 0
        self._wait_seconds = 0.0
        self._withdrawals = 0

    @abstractmethod
    def _blocks(self, earlier: Lease, later: Lease) -> bool:
        """Whether ``later`` must wait while ``earlier`` is queued ahead of it."""

    def _fits(self, lease: Lease) -> bool:
        """Whether ``lease`` can be held beside the held leases."""
        return not any(self._blocks(held, lease) for held in self._held)

    def request(self, owner: str, claims: Sequence[ResourceClaim]) -> Lease:
        """Take a place in the queue now (``reserved``); ``await lease.acquire()`` later."""
        wrong = [c for c in claims if c.kind not in self.kinds]
        if wrong:
            raise UsageError(
                f"the {self.name} authority does not handle {wrong[0].kind} claims",
                code="claim",
            )
        for lease in (*self._queue, *self._held):
            if lease.owner == owner:
                raise AuthorityMisuseError(
                    f"call {owner!r} already has a {self.name} lease ({lease.describe()}, "
                    f"{lease.state}); a call requests its claims once",
                    owner=owner,
                    holder=owner,
                    hint="put every claim of the call in one request",
                )
        lease = Lease(self, owner, tuple(dict.fromkeys(claims)))
        self._queue.append(lease)
        return lease

    async def acquire(self, owner: str, claims: Sequence[ResourceClaim]) -> Lease:
        """Request and wait for the grant; the caller must ``release(owner=...)`` it."""
        lease = self.request(owner, claims)
        await lease.acquire()
        return lease

    def statistics(self) -> AuthorityStatistics:
        def show(lease: Lease, since: float | None) -> Holder:
            resources = tuple(c.render() for c in lease.claims)
            return Holder(owner=lease.owner, resources=resources, since=since or 0.0)

        return AuthorityStatistics(
            authority=self.name,
            holders=tuple(show(lease, lease.granted_at) for lease in self._held),
            waiters=tuple(show(lease, lease.requested_at) for lease in self._queue),
            acquisitions=self._acquisitions,
            waits=self._waits,
            wait_seconds=self._wait_seconds,
            withdrawals=self._withdrawals,
        )

    # ---------------------------------------------------------------- state changes

    def _count_wait(self, lease: Lease) -> None:
        self._waits += 1
        self._wait_seconds += lease.wait_seconds

    def _finish(self, lease: Lease, state: Literal["released", "withdrawn"]) -> None:
        if lease.state == "held":
            self._held.remove(lease)
        else:
            self._queue.remove(lease)
            self._withdrawals += 1
        lease.state = state
        if not lease._granted.done():
            # Its owner may be waiting in acquire() (withdrawn from elsewhere): wake it with
            # a precise error rather than a cancellation it never asked for.
            lease._granted.set_exception(
                lease._misuse(lease.owner, "was withdrawn while its owner waited for it")
            )
            lease._granted.exception()  # retrieved: nobody waiting is not an error
        self._grant()

    def _grant(self) -> None:
        """Grant every waiting lease that fits and that no earlier queued lease blocks."""
        ahead: list[Lease] = []
        for lease in list(self._queue):
            if lease._granted.cancelled():
                # its owner was cancelled while waiting and is about to withdraw it: it
                # can neither take a grant nor hold back the leases behind it
                continue
            if (
                lease.state == "waiting"
                and not any(self._blocks(earlier, lease) for earlier in ahead)
                and self._fits(lease)
            ):
                self._queue.remove(lease)
                self._held.append(lease)
                lease.state = "held"
                lease.granted_at = self.clock()
                self._acquisitions += 1
                lease._granted.set_result(None)
            else:
                ahead.append(lease)

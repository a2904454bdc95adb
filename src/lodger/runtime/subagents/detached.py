"""Subagents over the control plane: children on any worker, parents dormant meanwhile.

With a launcher in the policy (a worker sets ``ControlPlaneChildren``), a delegation
does not run its child inline:

    parent's worker   T1 (child id) -> child's first event (link, arguments)
                      -> wake the child (key ``subagent-start:<child>``) -> the call
                      suspends (no T2) -> the run ends waiting, the turn stays open
                      -> snapshot, index ``waiting``, release: the parent is dormant
    any worker        the child's wake: run (or resume) its one turn from its own log
                      -> when it settles, wake the parent (key ``subagent-settled:<child>``)
    any worker        the parent's wake: resume; each ``delegate`` call's probe reads its
                      child: settled -> its answer is the result (nothing runs again)
                      and its workspace edits are applied to the parent's (three-way,
                      from the snapshot it started from); still open -> ``pending``,
                      and the run ends waiting again

Both wakes carry idempotency keys, so a worker that dies after sending one, and the one
that takes over and sends it again, wake once. The parent's probe calls ``start`` again
for an open child: a wake lost to a crash between the child's first event and its
``send`` is made good there, and a seen key enqueues nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from lodger.errors import ToolCallError
from lodger.runtime.subagents.link import SubagentLink
from lodger.storage.artifacts import ArtifactStore
from lodger.storage.control.fencing import LeaseGuard
from lodger.storage.control.interface import ControlPlane, SessionRow

__all__ = ["ControlPlaneChildren", "parent_key", "start_key"]

_RESERVE_WAIT = 30.0  # seconds a delegation waits for another worker's reservation
#: the tree lease is not renewed: it outlives a slow walk of the tree's logs (a holder
#: that dies holds up the tree's delegations this long at most)
_RESERVE_TTL = 10.0


def start_key(child: SubagentLink) -> str:
    """The idempotency key of the wake that starts a child."""
    return f"subagent-start:{child.session_id}"


def parent_key(child: SubagentLink) -> str:
    """The idempotency key of the wake a settled child sends its parent."""
    return f"subagent-settled:{child.session_id}"


class ControlPlaneChildren:
    """A ``ChildLauncher`` that runs children on the control plane's workers."""

    def __init__(
        self,
        control: ControlPlane,
        artifacts: ArtifactStore,
        *,
        guard: LeaseGuard,
        holder: str,
        ttl_s: float,
    ) -> None:
        self.control = control
        self.artifacts = artifacts
        self.guard = guard
        self.holder = holder
        self.ttl_s = ttl_s

    @contextlib.asynccontextmanager
    async def writing(self, session_id: str) -> AsyncIterator[None]:
        """Hold the child's lease (the worker's log writes are fenced by it) while its
        first events are written."""
        lease = await self.control.acquire_session(
            session_id=session_id, holder=self.holder, ttl_s=self.ttl_s
        )
        if lease is None:
            raise ToolCallError(
                f"the subagent session {session_id!r} is busy on another worker; delegate again",
                code="subagent_exists",
            )
        self.guard.hold(lease)
        try:
            yield
        finally:
            current = self.guard.lease(session_id) or lease
            self.guard.drop(session_id)
            await self.control.release_session(lease=current)

    async def start(self, *, child: SubagentLink, snapshot: str | None) -> None:
        """Enqueue the child's wake. With a ``snapshot`` of the parent's workspace (a
        first start), the child's index row names it first, so the worker that runs the
        child restores the parent's files as they were when it delegated (a copy: the
        child's edits come back to the parent when it wakes, ``lodger.storage.merge``)."""
        if (
            snapshot is not None
            and await self.control.get_session(session_id=child.session_id) is None
        ):
            await self.control.record_session(
                row=SessionRow(
                    session_id=child.session_id,
                    status="started",
                    last_activity=await self.control.now(),
                    events=1,
                    snapshot=snapshot,
                )
            )
        await self.control.send(
            session_id=child.session_id, message=None, idempotency_key=start_key(child)
        )

    @contextlib.asynccontextmanager
    async def reserving(self, root: str) -> AsyncIterator[None]:
        """The named lease ``subagent-tree:<root>``: delegations of one tree on different
        workers read its spending and write their children's first events one at a time.
        Held for a few reads and one append; a holder that dies frees it at its expiry."""
        name = f"subagent-tree:{root}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _RESERVE_WAIT
        while True:
            lease = await self.control.acquire_named(
                name=name, holder=self.holder, ttl_s=max(self.ttl_s, _RESERVE_TTL)
            )
            if lease is not None:
                break
            if loop.time() > deadline:
                raise ToolCallError(
                    f"the budget of session tree {root!r} is busy (another worker is "
                    "delegating); delegate again",
                    code="subagent_busy",
                )
            await asyncio.sleep(0.02)
        try:
            yield
        finally:
            await self.control.release_named(lease=lease)

    async def final_snapshot(self, *, child: SubagentLink) -> str | None:
        """The snapshot the child's worker indexed when its turn settled."""
        row = await self.control.get_session(session_id=child.session_id)
        return row.snapshot if row is not None else None

    async def settled(self, *, child: SubagentLink) -> None:
        await self.control.send(
            session_id=child.parent_session, message=None, idempotency_key=parent_key(child)
        )

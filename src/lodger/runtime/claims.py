"""Global claims: a tool's resources that span sessions, workers and machines.

The in-process authorities (``lodger.authority``) order the calls of one process. A
resource shared by every worker (an external API's concurrency, a request quota, one
browser tab or remote session) needs the control plane. A tool declares those claims by
being wrapped::

    browser = with_global_claims(
        browser_tool, control,
        GlobalClaims(permits={"api:github": 4}, quotas={"api:github": Quota(per_minute=60)},
                     leases=("browser:tab-1",)),
    )

Around each run of the handler the wrapper takes the named leases (in name order, so two
tools never wait on each other in a cycle), then a request from each quota, then a permit
of each semaphore, waiting for each in turn; it releases them when the handler returns.
The fencing token of each named lease reaches the handler as
``ctx.extras["fencing_tokens"][name]``: pass it on with every write, and let the resource
refuse a stale one (``ControlPlane.admit_token`` is that check when the resource is ours).
The global claims are also recorded in T1 (``capacity:global:NAME``, unlimited in-process).

They are taken when the handler starts, after T1: a worker that dies while waiting
leaves an operation that recovery treats by the tool's policy, like any other crash.
Leases and permits last ``ttl_s`` and are not renewed: a handler that may run longer
must rely on the fencing token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lodger.authority.common import ResourceClaim
from lodger.errors import UsageError
from lodger.storage.control.interface import GlobalAuthorities, NamedLease
from lodger.tools.spec import Tool, ToolContext

__all__ = ["GlobalClaims", "Quota", "with_global_claims"]


@dataclass(frozen=True, kw_only=True)
class Quota:
    per_minute: int | None = None
    per_hour: int | None = None


@dataclass(frozen=True, kw_only=True)
class GlobalClaims:
    #: counting semaphores: name -> how many holders at once, across every worker
    permits: Mapping[str, int] = field(default_factory=dict)
    #: request quotas: name -> requests per minute and/or hour
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    #: exclusive named leases with fencing tokens
    leases: Sequence[str] = ()

    def names(self) -> list[str]:
        return sorted({*self.permits, *self.quotas, *self.leases})


def with_global_claims(
    t: Tool,
    control: GlobalAuthorities,
    claims: GlobalClaims,
    *,
    ttl_s: float = 300.0,
    poll_s: float = 0.05,
    holder: str | None = None,
) -> Tool:
    """``t`` with ``claims`` taken from ``control`` around each run of its handler."""
    for name, limit in claims.permits.items():
        if limit < 1:
            raise UsageError(f"global permit {name!r} has limit {limit}; at least 1",
                             code="claim")  # fmt: skip
    who = holder or f"{os.uname().nodename}:{os.getpid()}"
    inner = t.handler
    inner_claims = t.claims

    async def handler(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        leases: list[NamedLease] = []
        permits: list[tuple[str, str]] = []
        try:
            for name in sorted(set(claims.leases)):
                leases.append(await _lease(control, name, f"{who}:{ctx.call_id}", ttl_s, poll_s))
            for name, quota in sorted(claims.quotas.items()):
                await _quota(control, name, quota)
            for name, limit in sorted(claims.permits.items()):
                permits.append((name, await _permit(control, name, limit, who, ttl_s, poll_s)))
            tokens = {lease.name: lease.token for lease in leases}
            extras = {**ctx.extras, "fencing_tokens": tokens}
            return await inner(arguments, dataclasses.replace(ctx, extras=extras))
        finally:
            await asyncio.shield(_release(control, leases, permits))

    def with_claims(arguments: dict[str, Any], ctx: ToolContext) -> Sequence[ResourceClaim]:
        own = list(inner_claims(arguments, ctx)) if inner_claims is not None else []
        return [*own, *(ResourceClaim.capacity(f"global:{n}") for n in claims.names())]

    return dataclasses.replace(t, handler=handler, claims=with_claims)


async def _lease(
    control: GlobalAuthorities, name: str, holder: str, ttl_s: float, poll_s: float
) -> NamedLease:
    while True:  # the control plane is polled: it has no notifications
        lease = await control.acquire_named(name=name, holder=holder, ttl_s=ttl_s)
        if lease is not None:
            return lease
        await asyncio.sleep(poll_s)


async def _permit(
    control: GlobalAuthorities, name: str, limit: int, holder: str, ttl_s: float, poll_s: float
) -> str:
    while True:
        permit = await control.acquire_permit(name=name, limit=limit, holder=holder, ttl_s=ttl_s)
        if permit is not None:
            return permit
        await asyncio.sleep(poll_s)


async def _quota(control: GlobalAuthorities, name: str, quota: Quota) -> None:
    while True:
        wait = await control.take_quota(
            name=name, per_minute=quota.per_minute, per_hour=quota.per_hour
        )
        if not wait:
            return
        await asyncio.sleep(min(wait, 1.0))


async def _release(
    control: GlobalAuthorities, leases: list[NamedLease], permits: list[tuple[str, str]]
) -> None:
    for name, permit in reversed(permits):
        await control.release_permit(name=name, permit=permit)
    for lease in reversed(leases):
        await control.release_named(lease=lease)

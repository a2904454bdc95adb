"""The host's routes, one module per resource, each an ``APIRouter``.

``ROUTERS`` is the order ``create_app`` includes them in, which is the order of the paths
in the served OpenAPI document. What the routes share (the host's parts, the token's
grant, the path's session) comes from ``lodger.host.routes._deps``.
"""

from __future__ import annotations

from fastapi import APIRouter

from lodger.host.routes import (
    ag_ui,
    ai_sdk,
    approvals,
    artifacts,
    compaction,
    console,
    control,
    elicitations,
    events,
    mcp_auth,
    messages,
    operations,
    recovery,
    replay,
    rewind,
    sessions,
    steering,
    timeline,
    tokens,
    webhooks,
)
from lodger.host.routes._deps import HostParts

__all__ = ["ROUTERS", "HostParts"]

ROUTERS: tuple[APIRouter, ...] = (
    tokens.router,
    sessions.router,
    events.router,
    messages.router,
    steering.router,
    approvals.router,
    elicitations.router,
    recovery.router,
    rewind.router,
    control.router,
    artifacts.router,
    webhooks.router,
    operations.router,
    timeline.router,
    compaction.router,
    replay.router,
    console.router,
    ai_sdk.router,
    ag_ui.router,
    mcp_auth.router,
)

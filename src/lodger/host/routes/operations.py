"""Operations: the host's metrics, in the Prometheus text format (admin only)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from lodger.host.auth import require_admin
from lodger.host.routes._deps import Grant, Parts

__all__ = ["router"]

router = APIRouter()


@router.get("/metrics", response_class=PlainTextResponse, tags=["operations"])
async def metrics_text(who: Grant, host: Parts) -> PlainTextResponse:
    """Prometheus text format (admin only)."""
    require_admin(who)
    hub = host.hub
    text = host.metrics.render(pending_approvals=await hub.pending_count(), turns=hub.turns_run)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

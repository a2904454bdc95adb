"""Artifacts: a tool's long output (a fetched page, an MCP server's answer), served inert.

An artifact is stored once by its SHA-256 for every session; a session reaches only those
its own log refers to.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from lodger.errors import UsageError
from lodger.events import ArtifactStored, ToolResponded
from lodger.host.routes._deps import Parts, Session

__all__ = ["router"]

router = APIRouter()


@router.get(
    "/v1/sessions/{session_id}/artifacts/{sha256}",
    tags=["events"],
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}},
)
async def artifact(
    session_id: Session,
    sha256: Annotated[str, Path(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")],
    host: Parts,
) -> Response:
    """An artifact the session's log refers to (never another session's)."""
    media = None
    for event in await host.sessions.storage.log.read(session_id):
        body = event.body
        refs = (
            body.artifacts
            if isinstance(body, ToolResponded)
            else (body.artifact,)
            if isinstance(body, ArtifactStored)
            else ()
        )
        for ref in refs:
            if ref.sha256 == sha256:
                media = ref.media_type
    if media is None:
        raise UsageError(
            f"session {session_id!r} refers to no artifact {sha256}",
            code="artifact_missing",
            session_id=session_id,
        )
    data = await host.sessions.storage.artifacts.get(sha256)
    # a tool's output, served on the API's own origin: never sniffed, never run as a
    # page (its scripts would reach the API with the timeline's cookie), saved instead
    inert = {
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox",
        "Content-Disposition": f'attachment; filename="{sha256}"',
    }
    return Response(data, media_type=media, headers=inert)

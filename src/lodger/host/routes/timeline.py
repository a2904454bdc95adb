"""The timeline page: a session's facts as they commit, in a browser.

The page is static and needs no token to load: it holds no data, and asks the API for the
session's with the token given in the URL fragment (which never reaches the server),
traded once for the HttpOnly cookie its EventSource sends (``POST /v1/auth/cookie``).
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from lodger.host.routes._deps import SessionId

__all__ = ["router"]

router = APIRouter()


@router.get("/timeline/{session_id}", response_class=HTMLResponse, tags=["timeline"])
async def timeline(session_id: SessionId) -> HTMLResponse:
    """The timeline page (static; it asks the API for data with the token given in
    the URL fragment, which never reaches the server)."""
    page = resources.files("lodger.host").joinpath("timeline.html").read_text("utf-8")
    return HTMLResponse(page, headers={"Cache-Control": "no-store"})

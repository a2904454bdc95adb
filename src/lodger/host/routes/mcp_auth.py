"""OAuth logins to a session's MCP servers through the host (admin only).

``POST /v1/mcp/logins`` starts a login for one server of a session's composition (the
servers its workspace's ``lodger.toml`` binds, with ``oauth`` set) and answers the
authorization URL to send a person to; the authorization server sends them back to
``GET /oauth/mcp/callback``, which finishes it. The callback carries no bearer token (a
browser follows it): the ``state`` it must carry, unguessable and good for one use within
10 minutes, is what ties it to the admin's start. Logins are kept where the host's
sessions read them (the host's keyring or config directory); ``GET /v1/mcp/logins`` and
``POST /v1/mcp/logins/{server}/logout`` show and end them. No answer holds a token.
"""

from __future__ import annotations

import html
from collections import OrderedDict
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from lodger.errors import McpAuthError
from lodger.host.auth import require_admin
from lodger.host.routes._deps import Grant, Input, Parts
from lodger.runtime.mcp_logins import McpLogins

__all__ = [
    "LoginStarted",
    "LoginsStatus",
    "LogoutDone",
    "LogoutSession",
    "StartLogin",
    "router",
]

_MAX_PENDING = 64  # logins waiting for their callback; the oldest is dropped past it
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$"


class StartLogin(Input):
    session_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    server: str = Field(pattern=_NAME)


class LogoutSession(Input):
    session_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class LoginStarted(BaseModel):
    server: str
    authorization_url: str
    redirect_uri: str


class LoginsStatus(BaseModel):
    servers: list[dict[str, Any]]


class LogoutDone(BaseModel):
    server: str
    revoked: list[str]
    deleted: bool
    problem: str | None = None


ServerName = Annotated[str, Path(pattern=_NAME)]

router = APIRouter()


def _pending(request: Request) -> OrderedDict[str, McpLogins]:
    found: OrderedDict[str, McpLogins] | None = getattr(request.app.state, "mcp_logins", None)
    if found is None:
        found = OrderedDict()
        request.app.state.mcp_logins = found
    return found


async def _logins(host: Parts, session_id: str) -> McpLogins:
    await host.hub.require(session_id)
    binding = await host.hub.binding(session_id)
    return McpLogins(binding.mcp)


@router.post("/v1/mcp/logins", status_code=201, tags=["mcp"])
async def start_login(body: StartLogin, who: Grant, host: Parts, request: Request) -> LoginStarted:
    """Start an OAuth login to MCP server ``server`` of the session's composition (admin
    only): the answer's ``authorization_url`` is where a person approves it."""
    require_admin(who)
    logins = await _logins(host, body.session_id)
    redirect = str(request.url_for("finish_login"))
    pending = await logins.begin(body.server, redirect_uri=redirect)
    waiting = _pending(request)
    waiting[pending.state] = logins
    while len(waiting) > _MAX_PENDING:
        waiting.popitem(last=False)
    return LoginStarted(
        server=body.server, authorization_url=pending.authorization_url, redirect_uri=redirect
    )


_PAGE = {"content": {"text/html": {"schema": {"type": "string"}}}}


@router.get(
    "/oauth/mcp/callback",
    response_class=HTMLResponse,
    tags=["mcp"],
    responses={
        200: {"description": "The login is kept.", **_PAGE},
        400: {"description": "The login failed (the page says why).", **_PAGE},
        404: {"description": "No login in progress has this state.", **_PAGE},
    },
)
async def finish_login(
    request: Request,
    state: str | None = Query(default=None, max_length=512),
    code: str | None = Query(default=None, max_length=4096),
    iss: str | None = Query(default=None, max_length=2048),
    error: str | None = Query(default=None, max_length=200),
) -> HTMLResponse:
    """Where the authorization server sends the person back: finishes the login the
    ``state`` names (once). No bearer token: the state is the proof."""
    logins = _pending(request).pop(state or "", None)
    if logins is None:
        text = (
            "The login failed: this callback matches no login in progress (its state is "
            "unknown, spent or expired); lodger refuses it."
        )
        return _page(404, text)
    try:
        if error is not None:
            raise McpAuthError(f"the authorization server refused the login ({error[:80]!r})")
        login = await logins.finish(state=state, code=code, iss=iss)
    except McpAuthError as exc:
        return _page(400, f"The login failed: {exc.message}")
    return _page(200, f"Logged in to MCP server {login.server!r}. You can close this tab.")


def _page(status: int, text: str) -> HTMLResponse:
    body = f"<!doctype html><meta charset=utf-8><title>lodger</title><p>{html.escape(text)}</p>"
    return HTMLResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


@router.get("/v1/mcp/logins", tags=["mcp"])
async def login_status(
    who: Grant,
    host: Parts,
    session_id: str = Query(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"),
) -> LoginsStatus:
    """Who is logged in to each OAuth MCP server of the session's composition, and until
    when (admin only; never a token)."""
    require_admin(who)
    logins = await _logins(host, session_id)
    return LoginsStatus(servers=await logins.status())


@router.post("/v1/mcp/logins/{server}/logout", tags=["mcp"])
async def logout(server: ServerName, body: LogoutSession, who: Grant, host: Parts) -> LogoutDone:
    """Revoke the server's tokens where it offers revocation, then forget them (admin
    only)."""
    require_admin(who)
    logins = await _logins(host, body.session_id)
    done = await logins.logout(server)
    return LogoutDone(
        server=server,
        revoked=list(done.get("revoked", [])),
        deleted=bool(done.get("deleted")),
        problem=done.get("problem"),
    )

"""What every route shares: the host's parts, who asks (the token's grant), which session.

``create_app`` builds one ``HostParts`` and keeps it on ``app.state.host``; a route takes
it as a ``Parts`` parameter instead of closing over the app's locals:

    @router.get("/v1/sessions/{session_id}/approvals")
    async def approvals(session_id: Session, host: Parts) -> ApprovalList: ...

``Grant`` authenticates the request (``lodger.host.auth``); ``Session`` authenticates it
for the path's session and checks that the session exists. Neither adds a parameter of its
own to the OpenAPI document but the path's ``session_id`` and the bearer scheme.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, ConfigDict

from lodger.host.auth import Authenticator, bearer, require_session
from lodger.host.feed import Feeds
from lodger.host.hub import Hub
from lodger.host.metrics import HostMetrics
from lodger.host.webhooks import HookConfig
from lodger.runtime.sessions import Sessions
from lodger.storage.control.host_index import HostControl, TokenGrant

__all__ = [
    "Grant",
    "HostParts",
    "Input",
    "Parts",
    "Session",
    "SessionId",
    "host_parts",
    "json_number",
]

SessionId = Annotated[
    str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]


def json_number(value: Any) -> Any:
    """A before-validator for an integer field: pydantic's lax integers would read
    ``true`` as 1 and ``"2"`` as 2; a JSON number (``2`` or ``2.0``) goes on to the int
    type and its bounds. Use it as ``_n = field_validator("at", mode="before")(json_number)``."""
    if isinstance(value, (bool, str, bytes)):
        raise ValueError("must be a JSON number, not a boolean or a string")
    return value


class Input(BaseModel):
    """A request body: an unknown field is refused, not ignored."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True, kw_only=True)
class HostParts:
    """The parts of one host that its routes use (``create_app`` builds them)."""

    sessions: Sessions
    control: HostControl
    hub: Hub
    feeds: Feeds
    metrics: HostMetrics
    auth: Authenticator
    hooks: Mapping[str, HookConfig]
    #: a stream with nothing to send for this long sends a comment, so proxies keep it
    heartbeat_s: float


def host_parts(request: Request) -> HostParts:
    parts: HostParts = request.app.state.host
    return parts


Parts = Annotated[HostParts, Depends(host_parts)]


async def _grant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    host: Parts,
) -> TokenGrant:
    return await host.auth.grant(request, credentials)


Grant = Annotated[TokenGrant, Depends(_grant)]


async def _session(session_id: SessionId, who: Grant, host: Parts) -> str:
    require_session(who, session_id)
    await host.hub.require(session_id)
    return session_id


Session = Annotated[str, Depends(_session)]

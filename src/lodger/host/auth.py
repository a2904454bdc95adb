"""Bearer tokens: minted here, kept as hashes in the control index, checked per request.

A token is ``lgr_`` and 43 characters of URL-safe base64 (256 random bits). Only its
SHA-256 is stored; the plain token is shown once, when it is made. An ``admin`` token may
do everything; a ``session`` token only what concerns its one session. A request carries
it as ``Authorization: Bearer <token>``; the timeline page, whose EventSource cannot set a
header, trades it once for an HttpOnly, SameSite=Strict cookie. Tokens never appear in a
log, an event or a trace: nothing here logs, and errors name the scope, never the token.
"""

from __future__ import annotations

import secrets

from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from lodger.errors import HostAuthError
from lodger.host.control import HostControl, TokenGrant, hash_token

__all__ = ["COOKIE", "TOKEN_ENVVAR", "Authenticator", "bearer", "new_token"]

TOKEN_ENVVAR = "LODGER_HOST_TOKEN"
COOKIE = "lodger_token"

bearer = HTTPBearer(
    auto_error=False, description="a token made by `lodger serve` or POST /v1/tokens"
)


def new_token() -> str:
    return "lgr_" + secrets.token_urlsafe(32)


class Authenticator:
    """Resolves a request's token to its grant (cached: grants never change)."""

    def __init__(self, control: HostControl) -> None:
        self.control = control
        self._cache: dict[str, TokenGrant] = {}

    async def grant(
        self, request: Request, credentials: HTTPAuthorizationCredentials | None
    ) -> TokenGrant:
        token = credentials.credentials if credentials is not None else None
        if token is None:
            token = request.cookies.get(COOKIE)
        if not token:
            raise HostAuthError(
                "this request needs a bearer token",
                hint="send Authorization: Bearer <token>; `lodger serve` prints an admin token",
            )
        digest = hash_token(token)
        grant = self._cache.get(digest)
        if grant is None:
            grant = await self.control.grant(token)
            if grant is None:
                raise HostAuthError(
                    "the bearer token is not known to this host",
                    hint="use a token this host made (they are kept per state directory)",
                )
            self._cache[digest] = grant
        return grant


def require_session(grant: TokenGrant, session_id: str) -> None:
    if not grant.allows(session_id):
        raise HostAuthError(
            f"this token is scoped to another session than {session_id!r}",
            hint="use an admin token or the token made for this session",
            code="forbidden",
            session_id=session_id,
        )


def require_admin(grant: TokenGrant) -> None:
    if grant.scope != "admin":
        raise HostAuthError(
            "this request needs an admin token",
            hint="a session token reaches only its own session",
            code="forbidden",
        )

"""Bearer tokens: minted here, kept as hashes in the control index, checked per request.

A token is ``lgr_`` and 43 characters of URL-safe base64 (256 random bits). Only its
SHA-256 is stored (in the host's index, or in the control plane when several hosts share
one: ``lodger.storage.control.shared_host_index``); the plain token is shown once, when
it is made. An
``admin`` token may do everything; a ``session`` token only what concerns its one session.
A request carries it as ``Authorization: Bearer <token>``; the timeline page, whose
EventSource cannot set a header, trades it once for an HttpOnly, SameSite=Strict cookie.
Tokens never appear in a log, an event or a trace: nothing here logs, and errors name the
scope, never the token.
"""

from __future__ import annotations

import secrets
import time

from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from lodger.errors import HostAuthError
from lodger.storage.branches import root_of
from lodger.storage.control.host_index import HostControl, TokenGrant, hash_token, token_id

__all__ = ["COOKIE", "TOKEN_ENVVAR", "Authenticator", "bearer", "new_token"]

TOKEN_ENVVAR = "LODGER_HOST_TOKEN"
_CACHE_LIMIT = 10_000
COOKIE = "lodger_token"

bearer = HTTPBearer(
    auto_error=False, description="a token made by `lodger serve` or POST /v1/tokens"
)


def new_token() -> str:
    return "lgr_" + secrets.token_urlsafe(32)


class Authenticator:
    """Resolves a request's token to its grant. A grant never widens, but a shared one can
    be revoked on another host, so a grant is cached for ``ttl_s`` seconds only."""

    def __init__(self, control: HostControl, *, ttl_s: float = 5.0) -> None:
        self.control = control
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, TokenGrant]] = {}

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
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        grant = await self.control.grant(token)
        if grant is None:
            self._cache.pop(digest, None)
            raise HostAuthError(
                "the bearer token is not known to this host",
                hint="use a token made by `lodger serve` or POST /v1/tokens (embedded: on "
                "this host's state directory; distributed: on any host of its control plane)",
            )
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()  # bounded: a flood of distinct tokens cannot grow it
        self._cache[digest] = (now + self.ttl_s, grant)
        return grant

    @staticmethod
    def presented(request: Request) -> str | None:
        """The hash of the token ``request`` carries (bearer header, else cookie)."""
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        token = value.strip() if scheme.lower() == "bearer" else ""
        token = token or request.cookies.get(COOKIE, "")
        return hash_token(token) if token else None

    def who(self, request: Request) -> str:
        """Who a request is, for the facts it decides (``permission_decided.who``): its
        token's public id, ``token:tok_...`` (never the token, which only hashes reach)."""
        digest = self.presented(request)
        return f"token:{token_id(digest)}" if digest else "token:unknown"

    def forget_hash(self, token_hash: str) -> None:
        """Drop a token's cached grant (it was revoked here: refuse it from now on)."""
        self._cache.pop(token_hash, None)


def require_session(grant: TokenGrant, session_id: str) -> None:
    # a session's token reaches its branches too (``S..r1``: what a rewind made of it)
    if not (grant.allows(session_id) or grant.allows(root_of(session_id))):
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

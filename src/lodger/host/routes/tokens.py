"""Tokens: make one (admin only), list them, revoke one, trade one for the page's cookie.

Only a token's hash is kept (``lodger.host.auth``): a token is shown once, when it is
made, and listed by its public ``id``.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lodger.errors import HostConflictError
from lodger.host.auth import COOKIE, new_token, require_admin
from lodger.host.routes._deps import Grant, Input, Parts
from lodger.storage.control.host_index import hash_token, token_id

__all__ = [
    "MakeToken",
    "RevokeToken",
    "TokenList",
    "TokenListed",
    "TokenOut",
    "TokenRevoked",
    "router",
]


class MakeToken(Input):
    session_id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
    )
    label: str = Field(default="", max_length=200)


def _exactly_one_name(schema: dict[str, Any]) -> None:
    """The document says what the validator holds: exactly one of ``token`` and ``id``,
    each a string (an explicit null names nothing and is refused)."""
    props = schema["properties"]
    for name in _REVOKE_BY:
        (string,) = [s for s in props[name].pop("anyOf") if s.get("type") == "string"]
        props[name].update(string)
        props[name].pop("default", None)
    schema["oneOf"] = [{"required": [name]} for name in _REVOKE_BY]


_REVOKE_BY = ("token", "id")


class RevokeToken(Input):
    """Name the token itself, or (admin only) its ``id`` from ``GET /v1/tokens``: exactly
    one of the two."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_exactly_one_name)

    token: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")
    id: str | None = Field(default=None, pattern=r"^tok_[0-9a-f]{16}$")

    @model_validator(mode="after")
    def _one_of(self) -> RevokeToken:
        named = [name for name in _REVOKE_BY if name in self.model_fields_set]
        if len(named) != 1 or getattr(self, named[0]) is None:
            raise ValueError("name exactly one of token and id, as a string")
        return self


class TokenRevoked(BaseModel):
    revoked: bool


class TokenOut(BaseModel):
    token: str
    id: str
    scope: str
    session_id: str | None = None


class TokenListed(BaseModel):
    id: str
    scope: str
    session_id: str | None
    label: str
    revoked: bool
    created_at: float | None


class TokenList(BaseModel):
    tokens: list[TokenListed]


router = APIRouter()


@router.post("/v1/tokens", status_code=201, tags=["auth"])
async def make_token(body: MakeToken, who: Grant, host: Parts) -> TokenOut:
    """Make a token (admin only): scoped to one session, or admin when no session is
    named. The token is shown once; only its hash is kept."""
    require_admin(who)
    if body.session_id is not None:
        await host.hub.require(body.session_id)
    token = new_token()
    scope: Literal["admin", "session"] = "session" if body.session_id else "admin"
    await host.control.add_token(token, scope=scope, session_id=body.session_id, label=body.label)
    return TokenOut(
        token=token, id=token_id(hash_token(token)), scope=scope, session_id=body.session_id
    )


@router.get("/v1/tokens", tags=["auth"])
async def list_tokens(who: Grant, host: Parts) -> TokenList:
    """Every token this host's index records (admin only), revoked ones included: each
    by its public ``id``, never the token (only hashes are kept)."""
    require_admin(who)
    listed = await host.control.tokens()
    return TokenList(tokens=[TokenListed(**info.to_dict()) for info in listed])


@router.post("/v1/tokens/revoke", tags=["auth"])
async def revoke_token(
    body: RevokeToken, request: Request, who: Grant, host: Parts
) -> TokenRevoked:
    """Revoke a token for good (every host of a shared control plane refuses it within
    seconds). An admin token may revoke any token; any token may revoke itself.
    ``revoked`` is false when the token was unknown or revoked already."""
    if body.token is not None:
        digest = hash_token(body.token)
        if who.scope != "admin" and digest != host.auth.presented(request):
            require_admin(who)  # raises: a session token revokes only itself
    else:
        require_admin(who)  # by id: admin only
        named = [info for info in await host.control.tokens() if info.id == body.id]
        if not named:
            return TokenRevoked(revoked=False)
        if len(named) > 1:  # two hashes share 64 bits: name the token itself
            raise HostConflictError(
                f"token id {body.id} names {len(named)} tokens",
                hint="revoke with the token itself",
                code="conflict",
            )
        digest = named[0].token_hash
    revoked = await host.control.revoke_hash(digest)
    host.auth.forget_hash(digest)
    return TokenRevoked(revoked=revoked)


@router.post("/v1/auth/cookie", status_code=204, tags=["auth"])
async def cookie(request: Request, who: Grant) -> Response:
    """Trade the bearer token for an HttpOnly cookie (for the timeline page, whose
    EventSource cannot send headers)."""
    # the token that authenticated: a bearer header's, else the cookie's (another
    # scheme's header, such as a proxy's Basic auth, is not a token of ours)
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    token = value.strip() if scheme.lower() == "bearer" else ""
    token = token or request.cookies.get(COOKIE, "")
    response = Response(status_code=204)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
    return response

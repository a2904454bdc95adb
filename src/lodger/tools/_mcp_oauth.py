"""OAuth 2.1 for MCP servers over streamable HTTP: discovery, registration, login, refresh.

    [mcp.servers.linear]
    url = "https://mcp.linear.app/mcp"
    oauth = true                                  # discover, register, log in
    # or a pre-registered client (its secret from the environment, never the file):
    # oauth = { client_id = "abc", client_secret = "${LINEAR_SECRET}", redirect_port = 8765 }

``lodger mcp login NAME`` runs ``begin_login`` then ``finish_login``: the server's 401
names its protected-resource metadata (RFC 9728), which names the authorization server,
whose metadata (RFC 8414) gives the endpoints; lodger registers itself (RFC 7591) unless
a client id is configured, and sends the user to the authorization endpoint with PKCE
(S256) and a fresh ``state``; the code comes back to a loopback redirect and is traded
for tokens, which a ``CredentialStore`` keeps (``lodger.tools._mcp_credentials``).

The SDK's models and discovery helpers (``mcp.client.auth``, ``mcp.shared.auth``) do the
parsing; lodger drives the steps itself (discovery and registration in
``_mcp_discovery``) so that each can be refused on its own terms and a login can be
split over two HTTP requests (the host's start and callback routes):

- every endpoint must be https, or http on a loopback address; the authorization
  server's endpoints must be on its issuer's origin unless ``allowed_origins`` names
  theirs; the metadata's issuer must be the one the resource named;
- the authorization server must offer S256 PKCE;
- a registration that comes back with other redirect URIs than lodger asked for, an
  authorization endpoint that carries its own ``redirect_uri`` or ``state``, a callback
  whose ``state`` differs, or an ``iss`` of another issuer is refused;
- every OAuth answer is read up to 64 KiB and no redirect is followed;
- no message ever holds a token, a code, a secret or a verifier.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from lodger.errors import ConfigError, McpAuthError
from lodger.tools._mcp_discovery import (
    check_url,
    discover,
    exchange,
    oauth_error,
    register,
)

if TYPE_CHECKING:
    import httpx2

    from lodger.tools._mcp_credentials import CredentialStore

__all__ = [
    "NEEDS_LOGIN",
    "Login",
    "McpOAuth",
    "PendingLogin",
    "begin_login",
    "finish_login",
    "refresh_login",
    "revoke_login",
]

MAX_TOKEN_CHARS = 16 * 1024
#: in every message saying a server needs a new login (``_mcp_bearer``)
NEEDS_LOGIN = "needs an OAuth login"
REFRESH_EARLY_S = 30.0  # a token this close to its expiry is refreshed before use


@dataclass(frozen=True, kw_only=True)
class McpOAuth:
    """OAuth for one MCP HTTP server (``McpServerConfig(auth=McpOAuth())``).

    Without ``client_id`` lodger registers itself with the authorization server (dynamic
    client registration); with one it uses that pre-registered client, whose secret (if
    it has one) comes from the environment or the program, never from ``lodger.toml``.
    ``redirect_port`` fixes the loopback port of ``lodger mcp login`` (a pre-registered
    client's redirect URI names one); 0 takes a free port. ``store`` keeps the login
    (default: the OS keyring or the user's config directory)."""

    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    scopes: tuple[str, ...] = ()
    redirect_port: int = 0
    #: origins besides the issuer's that the authorization server's endpoints may be on
    allowed_origins: tuple[str, ...] = ()
    client_name: str = "lodger"
    store: CredentialStore | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.redirect_port <= 65535:
            raise ConfigError("oauth.redirect_port must be a port number (0: any free one)")
        if self.client_secret is not None and self.client_id is None:
            raise ConfigError("oauth.client_secret needs a client_id")
        for origin in self.allowed_origins:
            check_url(origin, "an allowed origin")

    def credentials(self) -> CredentialStore:
        from lodger.tools._mcp_credentials import default_credential_store

        return self.store if self.store is not None else default_credential_store()


@dataclass(frozen=True, kw_only=True)
class Login:
    """One server's login, as a credential store keeps it. Never logged or shown:
    ``public()`` is what a status view may print."""

    server: str
    server_url: str
    resource: str
    issuer: str
    token_endpoint: str
    revocation_endpoint: str | None
    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    auth_method: str | None = None
    access_token: str = field(repr=False)
    refresh_token: str | None = field(default=None, repr=False)
    expires_at: float | None = None
    scope: str | None = None
    obtained_at: float = 0.0

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Login:
        try:
            return cls(**{k: record[k] for k in cls.__dataclass_fields__ if k in record})
        except TypeError:
            raise ConfigError("a stored MCP login is incomplete; log in again") from None

    def expired(self, now: float | None = None) -> bool:
        moment = time.time() if now is None else now
        return self.expires_at is not None and moment >= self.expires_at - REFRESH_EARLY_S

    def public(self, now: float | None = None) -> dict[str, Any]:
        moment = time.time() if now is None else now
        return {
            "server": self.server,
            "url": self.server_url,
            "issuer": self.issuer,
            "client_id": self.client_id,
            "scope": self.scope,
            "expires_at": self.expires_at,
            "expired": self.expires_at is not None and moment >= self.expires_at,
            "refreshable": self.refresh_token is not None,
            "revocable": self.revocation_endpoint is not None,
            "obtained_at": self.obtained_at,
        }


@dataclass(frozen=True, kw_only=True)
class PendingLogin:
    """A login between the authorization URL and the callback (kept in memory only)."""

    server: str
    server_url: str
    resource: str
    authorization_url: str
    redirect_uri: str
    state: str = field(repr=False)
    verifier: str = field(repr=False)
    issuer: str
    iss_required: bool
    token_endpoint: str
    revocation_endpoint: str | None
    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    auth_method: str | None = None
    #: the client was registered by this login (its secret, if any, is kept with it)
    registered: bool = False
    scope: str | None = None
    created_at: float = field(default_factory=time.time)


def _pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(64)[:96]
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).decode().rstrip("=")


async def begin_login(
    *,
    server: str,
    server_url: str,
    oauth: McpOAuth,
    redirect_uri: str,
    http: httpx2.AsyncClient,
) -> PendingLogin:
    """Discover, register if needed, and make the authorization URL (with PKCE and a
    fresh state) the user opens; ``finish_login`` takes the callback's values."""
    resource, found = await discover(http, server_url, allowed_origins=oauth.allowed_origins)
    scope = " ".join(oauth.scopes or found.scopes)
    registered = oauth.client_id is None
    if oauth.client_id is not None:
        client_id, secret = oauth.client_id, oauth.client_secret
        method: str | None = "client_secret_post" if secret else "none"
    else:
        client_id, secret, method = await register(
            http, found, client_name=oauth.client_name, redirect_uri=redirect_uri, scope=scope
        )
    own = dict(parse_qsl(urlsplit(found.authorization).query))
    reserved = {"redirect_uri", "state", "code_challenge", "client_id", "response_type"}
    if own.keys() & reserved:
        raise McpAuthError(
            "the authorization endpoint carries its own "
            + ", ".join(sorted(own.keys() & reserved))
            + "; lodger refuses it"
        )
    verifier, challenge = _pkce()
    state = secrets.token_urlsafe(32)
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "state": state,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "resource": resource,
        **({"scope": scope} if scope else {}),
    }
    joiner = "&" if urlsplit(found.authorization).query else "?"
    return PendingLogin(
        server=server,
        server_url=server_url,
        resource=resource,
        authorization_url=f"{found.authorization}{joiner}{urlencode(params)}",
        redirect_uri=redirect_uri,
        state=state,
        verifier=verifier,
        issuer=found.issuer,
        iss_required=found.iss_required,
        token_endpoint=found.token,
        revocation_endpoint=found.revocation,
        client_id=client_id,
        client_secret=secret,
        auth_method=method,
        registered=registered,
        scope=scope or None,
    )


# ---------------------------------------------------------------- tokens


def _client_auth(
    client_id: str, secret: str | None, method: str | None, data: dict[str, str]
) -> dict[str, str]:
    """Add the client's authentication to a token request; the headers to send."""
    data["client_id"] = client_id
    if secret and method == "client_secret_basic":
        pair = base64.b64encode(f"{client_id}:{secret}".encode()).decode()
        return {"Authorization": f"Basic {pair}"}
    if secret:
        data["client_secret"] = secret
    return {}


def _token_answer(status: int, value: Any, what: str) -> dict[str, Any]:
    """A token endpoint's answer, checked: a bearer token of sane size."""
    if status != 200:
        raise McpAuthError(
            f"the token endpoint refused the {what} (HTTP {status}){oauth_error(value)}"
        )
    if not isinstance(value, dict):
        raise McpAuthError(f"the token endpoint's answer to the {what} is not a JSON object")
    token = value.get("access_token")
    if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_CHARS:
        raise McpAuthError(f"the token endpoint's answer to the {what} holds no usable token")
    if not re.fullmatch(r"[\x21-\x7e]+", token):
        raise McpAuthError(f"the token endpoint's answer to the {what} holds no usable token")
    if str(value.get("token_type", "")).lower() != "bearer":
        raise McpAuthError(f"the token endpoint's answer to the {what} is not a bearer token")
    refresh = value.get("refresh_token")
    if refresh is not None and (not isinstance(refresh, str) or len(refresh) > MAX_TOKEN_CHARS):
        raise McpAuthError(f"the token endpoint's answer to the {what} has a bad refresh token")
    expires = value.get("expires_in")
    if expires is not None and (
        isinstance(expires, bool) or not isinstance(expires, int | float) or expires < 0
    ):
        raise McpAuthError(f"the token endpoint's answer to the {what} has a bad expires_in")
    scope = value.get("scope")
    return {
        "access_token": token,
        "refresh_token": refresh,
        "expires_at": time.time() + float(expires) if expires is not None else None,
        "scope": scope if isinstance(scope, str) else None,
        "obtained_at": time.time(),
    }


async def finish_login(
    pending: PendingLogin,
    *,
    code: str | None,
    state: str | None,
    iss: str | None,
    http: httpx2.AsyncClient,
    store: CredentialStore,
) -> Login:
    """Check the callback against ``pending``, trade the code for tokens, keep them."""
    if state is None or not secrets.compare_digest(state.encode(), pending.state.encode()):
        raise McpAuthError(
            "the login's callback carries another state than lodger sent; lodger refuses "
            "it (it may be a forged callback): log in again"
        )
    if iss is not None and iss != pending.issuer:
        raise McpAuthError("the login's callback names another issuer; lodger refuses it")
    if iss is None and pending.iss_required:
        raise McpAuthError("the login's callback lacks the issuer its server promised")
    if not code:
        raise McpAuthError("the login's callback carries no authorization code")
    data = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": pending.redirect_uri,
        "code_verifier": pending.verifier,
        "resource": pending.resource,
    }
    headers = _client_auth(pending.client_id, pending.client_secret, pending.auth_method, data)
    status, value, _ = await exchange(
        http, "POST", pending.token_endpoint, "token endpoint", data=data, headers=headers
    )
    answer = _token_answer(status, value, "authorization code")
    login = Login(
        server=pending.server,
        server_url=pending.server_url,
        resource=pending.resource,
        issuer=pending.issuer,
        token_endpoint=pending.token_endpoint,
        revocation_endpoint=pending.revocation_endpoint,
        client_id=pending.client_id,
        # a pre-registered client's secret stays where the configuration keeps it
        client_secret=pending.client_secret if pending.registered else None,
        auth_method=pending.auth_method,
        **{**answer, "scope": answer["scope"] or pending.scope},
    )
    await store.save(pending.server, login.record())
    return login


async def refresh_login(
    login: Login, *, http: httpx2.AsyncClient, client_secret: str | None = None
) -> Login:
    """New tokens for ``login`` from its refresh token (the old refresh token is kept
    when the server does not rotate it)."""
    if login.refresh_token is None:
        raise McpAuthError(f"the login of MCP server {login.server!r} has no refresh token")
    data = {
        "grant_type": "refresh_token",
        "refresh_token": login.refresh_token,
        "resource": login.resource,
    }
    secret = client_secret or login.client_secret
    headers = _client_auth(login.client_id, secret, login.auth_method, data)
    status, value, _ = await exchange(
        http, "POST", login.token_endpoint, "token endpoint", data=data, headers=headers
    )
    answer = _token_answer(status, value, "refresh")
    answer["refresh_token"] = answer["refresh_token"] or login.refresh_token
    answer["scope"] = answer["scope"] or login.scope
    return Login(**{**login.record(), **answer})


async def revoke_login(
    login: Login, *, http: httpx2.AsyncClient, client_secret: str | None = None
) -> list[str]:
    """Revoke the login's tokens where the server offers revocation (RFC 7009); what was
    revoked (``refresh_token``, ``access_token``). A refusal is an McpAuthError."""
    if login.revocation_endpoint is None:
        return []
    done = []
    for kind, token in (
        ("refresh_token", login.refresh_token),
        ("access_token", login.access_token),
    ):
        if token is None:
            continue
        data = {"token": token, "token_type_hint": kind}
        headers = _client_auth(login.client_id, client_secret or login.client_secret,
                               login.auth_method, data)  # fmt: skip
        status, value, _ = await exchange(
            http, "POST", login.revocation_endpoint, "revocation endpoint", data=data,
            headers=headers,
        )  # fmt: skip
        if status != 200:
            raise McpAuthError(
                f"the revocation endpoint refused to revoke the {kind.replace('_', ' ')} "
                f"(HTTP {status}){oauth_error(value)}"
            )
        done.append(kind)
    return done

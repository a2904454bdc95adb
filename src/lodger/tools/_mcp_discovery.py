"""Finding and checking an MCP server's authorization server, for ``_mcp_oauth``.

The resource's metadata (RFC 9728) names the authorization server, whose metadata
(RFC 8414) names its endpoints; ``discover`` returns them checked (https, or http on a
loopback address; on the issuer's origin unless allowed; S256 PKCE offered; the issuer
the resource named), and ``register`` registers lodger (RFC 7591). ``exchange`` is every
OAuth request: no redirect followed, the answer read up to ``MAX_ANSWER_BYTES``. The
SDK's models and discovery helpers do the parsing.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from lodger.errors import McpAuthError

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "MAX_ANSWER_BYTES",
    "Endpoints",
    "check_url",
    "discover",
    "exchange",
    "oauth_error",
    "oauth_http",
    "origin",
    "register",
]

MAX_ANSWER_BYTES = 64 * 1024  # of any OAuth answer: real token answers are a few KB
_ERROR_WORD = re.compile(r"^[\x20-\x7e]{1,80}$")


# ---------------------------------------------------------------- checks


def origin(url: str) -> str:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{host}:{port}"


def check_url(url: str, what: str) -> str:
    """``url`` if it is https, or http on a loopback address; else an McpAuthError."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise McpAuthError(f"{what} is not a usable URL") from None
    host = (parts.hostname or "").lower()
    if parts.scheme == "https" and host:
        return url
    if parts.scheme == "http" and _loopback(host):
        return url
    raise McpAuthError(
        f"{what} {url[:200]!r} is not https (plain http is only accepted on a loopback "
        "address), so lodger will not send credentials there"
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _sameorigin(url: str, issuer: str, allowed: Sequence[str], what: str) -> str:
    check_url(url, what)
    if origin(url) == origin(issuer) or origin(url) in {origin(a) for a in allowed}:
        return url
    raise McpAuthError(
        f"the authorization server {issuer!r} puts its {what} on another origin "
        f"({origin(url)}); lodger refuses it",
        hint="if that origin is really the server's, add it to the server's oauth.allowed_origins",
    )


# ---------------------------------------------------------------- HTTP


def oauth_http() -> httpx2.AsyncClient:
    """The client for OAuth requests: no redirects followed, no compression, 30 s."""
    import httpx2

    return httpx2.AsyncClient(
        follow_redirects=False,
        timeout=httpx2.Timeout(30),
        headers={"Accept": "application/json", "Accept-Encoding": "identity"},
    )


async def exchange(
    http: httpx2.AsyncClient, method: str, url: str, what: str, **kwargs: Any
) -> tuple[int, Any, Any]:
    """Send one OAuth request; (status, the JSON answer or None, the response headers).
    The answer is read up to ``MAX_ANSWER_BYTES``."""
    import httpx2

    try:
        async with http.stream(method, url, **kwargs) as response:
            body = bytearray()
            async for chunk in response.aiter_raw():
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    raise McpAuthError(
                        f"the {what} answered with more than {MAX_ANSWER_BYTES} bytes; "
                        "lodger did not read the rest"
                    )
            status, headers = response.status_code, response.headers
    except httpx2.HTTPError as exc:
        raise McpAuthError(
            f"the {what} at {origin(url)} did not answer ({type(exc).__name__})"
        ) from None
    if headers.get("content-encoding", "identity").lower() not in ("", "identity"):
        raise McpAuthError(f"the {what} compressed its answer though lodger asked for none")
    try:
        value = json.loads(bytes(body)) if body else None
    except (ValueError, RecursionError):
        value = None
    return status, value, headers


def oauth_error(value: Any) -> str:
    """The ``error`` word of an OAuth error answer, if it is a short printable one."""
    if isinstance(value, dict) and isinstance(value.get("error"), str):
        word = value["error"]
        if _ERROR_WORD.match(word):
            return f" ({word})"
    return ""


# ---------------------------------------------------------------- discovery


async def _resource_metadata(http: httpx2.AsyncClient, server_url: str) -> Any:
    """The server's protected-resource metadata (None when it publishes none)."""
    from mcp.client.auth.utils import build_protected_resource_metadata_discovery_urls
    from mcp.shared.auth import ProtectedResourceMetadata
    from pydantic import ValidationError

    probe = {"jsonrpc": "2.0", "id": 0, "method": "ping"}
    status, _, headers = await exchange(
        http,
        "POST",
        server_url,
        "MCP server",
        json=probe,
        headers={"Accept": "application/json, text/event-stream"},
    )
    hinted = None
    if status == 401:
        found = re.search(r'resource_metadata="([^"]+)"', headers.get("www-authenticate", ""))
        hinted = found.group(1) if found else None
    if hinted is not None and origin(hinted) != origin(server_url):
        hinted = None  # lodger fetches nothing the server names elsewhere: the well-known
    for url in build_protected_resource_metadata_discovery_urls(hinted, server_url):
        check_url(url, "the protected-resource metadata URL")
        code, value, _ = await exchange(http, "GET", url, "protected-resource metadata")
        if code != 200 or value is None:
            continue
        try:
            return ProtectedResourceMetadata.model_validate(value)
        except ValidationError:
            raise McpAuthError(
                f"the protected-resource metadata at {url[:200]!r} is not valid"
            ) from None
    return None


async def _server_metadata(http: httpx2.AsyncClient, issuer: str | None, server_url: str) -> Any:
    from mcp.client.auth.utils import (
        build_oauth_authorization_server_metadata_discovery_urls,
        issuers_match,
    )
    from mcp.shared.auth import OAuthMetadata
    from pydantic import ValidationError

    expected = issuer or f"{urlsplit(server_url).scheme}://{urlsplit(server_url).netloc}"
    for url in build_oauth_authorization_server_metadata_discovery_urls(issuer, server_url):
        code, value, _ = await exchange(http, "GET", url, "authorization server metadata")
        if code != 200 or value is None:
            continue
        try:
            metadata = OAuthMetadata.model_validate(value)
        except ValidationError:
            raise McpAuthError(
                f"the authorization server metadata at {url[:200]!r} is not valid"
            ) from None
        if not issuers_match(str(metadata.issuer), expected):
            raise McpAuthError(
                f"the authorization server metadata at {url[:200]!r} names the issuer "
                f"{str(metadata.issuer)[:200]!r}, not {expected[:200]!r}; lodger refuses it"
            )
        return metadata
    raise McpAuthError(f"the authorization server {expected[:200]!r} publishes no metadata")


@dataclass(frozen=True)
class Endpoints:
    issuer: str
    authorization: str
    token: str
    registration: str | None
    revocation: str | None
    iss_required: bool
    scopes: tuple[str, ...]


async def discover(
    http: httpx2.AsyncClient, server_url: str, *, allowed_origins: Sequence[str] = ()
) -> tuple[str, Endpoints]:
    """The resource to ask tokens for, and the authorization server's checked endpoints."""
    from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url

    check_url(server_url, "the MCP server's URL")
    resource = resource_url_from_server_url(server_url)
    prm = await _resource_metadata(http, server_url)
    issuer: str | None = None
    scopes: tuple[str, ...] = ()
    if prm is not None:
        named = str(prm.resource)
        if not check_resource_allowed(requested_resource=resource, configured_resource=named):
            raise McpAuthError(
                f"the MCP server's metadata is for the resource {named[:200]!r}, not "
                f"{resource[:200]!r}; lodger refuses it"
            )
        resource = named
        if not prm.authorization_servers:
            raise McpAuthError("the MCP server's metadata names no authorization server")
        issuer = check_url(str(prm.authorization_servers[0]), "the authorization server")
        scopes = tuple(prm.scopes_supported or ())
    metadata = await _server_metadata(http, issuer, server_url)
    issuer = str(metadata.issuer)
    check_url(issuer, "the authorization server's issuer")
    allowed = allowed_origins

    def endpoint(value: Any, what: str) -> str | None:
        return None if value is None else _sameorigin(str(value), issuer, allowed, what)

    if "S256" not in (metadata.code_challenge_methods_supported or []):
        raise McpAuthError(
            f"the authorization server {issuer[:200]!r} does not offer S256 PKCE; "
            "lodger logs in only with PKCE"
        )
    return resource, Endpoints(
        issuer=issuer,
        authorization=endpoint(metadata.authorization_endpoint, "authorization endpoint") or "",
        token=endpoint(metadata.token_endpoint, "token endpoint") or "",
        registration=endpoint(metadata.registration_endpoint, "registration endpoint"),
        revocation=endpoint(metadata.revocation_endpoint, "revocation endpoint"),
        iss_required=bool(metadata.authorization_response_iss_parameter_supported),
        scopes=scopes,
    )


async def register(
    http: httpx2.AsyncClient, found: Endpoints, *, client_name: str, redirect_uri: str, scope: str
) -> tuple[str, str | None, str | None]:
    """Register lodger with the authorization server: (client id, secret, auth method)."""
    from mcp.shared.auth import OAuthClientInformationFull
    from pydantic import ValidationError

    if found.registration is None:
        raise McpAuthError(
            f"the authorization server {found.issuer[:200]!r} offers no client registration",
            hint="register lodger there and set the server's oauth.client_id",
        )
    asked = {
        "redirect_uris": [redirect_uri],
        "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "client_name": client_name,
        "application_type": "native",
        **({"scope": scope} if scope else {}),
    }
    status, value, _ = await exchange(
        http, "POST", found.registration, "registration endpoint", json=asked
    )
    if status not in (200, 201) or not isinstance(value, dict):
        raise McpAuthError(
            f"the authorization server refused to register lodger (HTTP {status})"
            f"{oauth_error(value)}"
        )
    value.pop("issuer", None)
    try:
        client = OAuthClientInformationFull.model_validate(value)
    except ValidationError:
        raise McpAuthError("the authorization server's registration answer is not valid") from None
    given = [str(uri) for uri in client.redirect_uris or []] or [redirect_uri]
    if given != [redirect_uri]:
        raise McpAuthError(
            "the authorization server registered other redirect URIs than lodger asked "
            "for; lodger refuses the registration"
        )
    method = client.token_endpoint_auth_method
    if method not in (None, "none", "client_secret_post", "client_secret_basic") or (
        method in ("client_secret_post", "client_secret_basic") and not client.client_secret
    ):
        raise McpAuthError(
            f"the authorization server registered lodger for a client authentication "
            f"lodger cannot use ({str(method)[:40]!r})"
        )
    return client.client_id, client.client_secret, method

"""An MCP server behind OAuth 2.1, with its own authorization server, for lodger's tests.

    python oauth_server.py        # prints PORT <n>, serves http://127.0.0.1:<n>/mcp

Built on the official SDK's server pieces: ``MCPServer`` with ``AuthSettings`` (the
protected resource, its RFC 9728 metadata and the bearer check) and an in-memory
``OAuthAuthorizationServerProvider`` behind the SDK's authorization-server routes
(metadata, dynamic registration, authorize, token, revocation). Its authorize step
approves at once and redirects to the client's redirect URI, so a test follows the URL
with a plain HTTP client instead of a browser.

``POST /_test/mode`` (a JSON object) makes it misbehave for the hostile tests:
``metadata``: ``other-origin``, ``http``, ``no-pkce``, ``wrong-issuer`` or
``preset-redirect``; ``register``: ``other-redirect``; ``token``: ``huge``,
``malformed``, ``not-bearer``; ``authorize``: ``wrong-state``; ``access_ttl``: seconds an
access token lives. ``POST /_test/expire`` ends every access token now (the server
forgets them, as a restarted server would); ``GET /_test/state`` tells what was issued,
refreshed and revoked (counts only, and the live access tokens for the leak check).
"""

from __future__ import annotations

import secrets
import socket
import sys
import time
from typing import Any

import anyio
import uvicorn
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

MODE: dict[str, Any] = {"access_ttl": 3600}
STATS = {"issued": 0, "refreshed": 0, "revoked": 0, "calls": 0}


class Provider:
    """Clients, codes and tokens in memory."""

    def __init__(self) -> None:
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.clients[client_info.client_id] = client_info

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        state = params.state
        if MODE.get("authorize") == "wrong-state":
            state = "forged-" + secrets.token_urlsafe(8)
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=state)

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        found = self.codes.get(authorization_code)
        return found if found is not None and found.client_id == client.client_id else None

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access, refresh = "at-" + secrets.token_urlsafe(24), "rt-" + secrets.token_urlsafe(24)
        ttl = int(MODE["access_ttl"])
        self.access[access] = AccessToken(
            token=access,
            client_id=client_id,
            scopes=scopes,
            expires_at=int(time.time()) + ttl,
            resource=resource,
        )
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource
        )
        STATS["issued"] += 1
        return OAuthToken(
            access_token=access,
            token_type="Bearer",
            expires_in=ttl,
            refresh_token=refresh,
            scope=" ".join(scopes) or None,
        )

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        return self._issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        found = self.refresh.get(refresh_token)
        return found if found is not None and found.client_id == client.client_id else None

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        self.refresh.pop(refresh_token.token, None)  # rotated
        STATS["refreshed"] += 1
        return self._issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is not None and found.expires_at is not None and found.expires_at < time.time():
            return None
        return found

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)
        STATS["revoked"] += 1


def build(port: int) -> Any:
    base = f"http://127.0.0.1:{port}"
    provider = Provider()
    server = MCPServer(
        "guarded",
        auth_server_provider=provider,
        auth=AuthSettings(
            issuer_url=base,  # type: ignore[arg-type]
            resource_server_url=f"{base}/mcp",  # type: ignore[arg-type]
            validate_token_resource=True,
            client_registration_options=ClientRegistrationOptions(enabled=True),
            revocation_options=RevocationOptions(enabled=True),
        ),
    )

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        STATS["calls"] += 1
        return text

    @server.custom_route("/_test/mode", methods=["POST"])
    async def mode(request: Request) -> Response:
        MODE.update(await request.json())
        return JSONResponse(MODE)

    @server.custom_route("/_test/expire", methods=["POST"])
    async def expire(request: Request) -> Response:
        provider.access.clear()
        if (await request.json()).get("refresh"):
            provider.refresh.clear()
        return JSONResponse({"expired": True})

    @server.custom_route("/_test/state", methods=["GET"])
    async def state(request: Request) -> Response:
        return JSONResponse(
            {**STATS, "access": sorted(provider.access), "refresh": sorted(provider.refresh)}
        )

    app = server.streamable_http_app()
    app.add_middleware(_Hostile, base=base)
    return app


class _Hostile:
    """Answers the metadata, registration and token requests wrongly when told to."""

    def __init__(self, app: Any, base: str) -> None:
        self.app, self.base = app, base

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if path == "/.well-known/oauth-authorization-server" and MODE.get("metadata"):
            await self._metadata(scope, receive, send)
            return
        if path == "/token" and MODE.get("token"):
            kind = MODE["token"]
            if kind == "huge":
                body = b'{"access_token": "' + b"a" * (1 << 20) + b'", "token_type": "Bearer"}'
                await Response(body, media_type="application/json")(scope, receive, send)
            elif kind == "malformed":
                await Response(b'{"access_token": ', media_type="application/json")(
                    scope, receive, send
                )
            else:
                await JSONResponse({"access_token": "x", "token_type": "mac"})(scope, receive, send)
            return
        if path == "/register" and MODE.get("register") == "other-redirect":
            body = {
                "client_id": "planted",
                "redirect_uris": ["http://127.0.0.1:9/elsewhere"],
                "token_endpoint_auth_method": "none",
            }
            await JSONResponse(body, status_code=201)(scope, receive, send)
            return
        if path == "/revoke":
            receive = await _with_empty_secret(receive)
        await self.app(scope, receive, send)

    async def _metadata(self, scope: Any, receive: Any, send: Any) -> None:
        base, kind = self.base, MODE["metadata"]
        data: dict[str, Any] = {
            "issuer": base,
            "authorization_endpoint": f"{base}/authorize",
            "token_endpoint": f"{base}/token",
            "registration_endpoint": f"{base}/register",
            "revocation_endpoint": f"{base}/revoke",
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
        }
        if kind == "other-origin":
            data["token_endpoint"] = "http://127.0.0.2:9/token"
        elif kind == "http":
            data["token_endpoint"] = "http://tokens.example.com/token"
            data["issuer"] = base
        elif kind == "no-pkce":
            data.pop("code_challenge_methods_supported")
        elif kind == "wrong-issuer":
            data["issuer"] = "https://issuer.example.com"
        elif kind == "preset-redirect":
            data["authorization_endpoint"] = (
                f"{base}/authorize?redirect_uri=http://evil.example.com/"
            )
        await JSONResponse(data)(scope, receive, send)


async def _with_empty_secret(receive: Any) -> Any:
    """The SDK's revocation handler requires a ``client_secret`` field even of a public
    client (its model has no default): add an empty one when the request has none."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if b"client_secret=" not in body:
        body += b"&client_secret="
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _serve() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    print(f"PORT {port}", flush=True)
    config = uvicorn.Config(build(port), log_level="warning")
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    anyio.run(_serve)
    sys.exit(0)

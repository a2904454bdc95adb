"""The bearer token on every request to an OAuth MCP server, refreshed as it expires.

``BearerAuth`` is the ``httpx2.Auth`` of an MCP server's HTTP client
(``lodger.tools._mcp_http``). Before a request it loads the server's login from its
credential store (once; again after a refusal), refreshes a token at or near its expiry,
and adds ``Authorization: Bearer ...``, only to requests for the server's own origin. A
401 answer is met with one refresh and one retry. When there is no login, no refresh
token, or the refresh is refused, the 401 answer of a JSON-RPC request is replaced by a
JSON-RPC error saying the server needs a login and naming ``lodger mcp login NAME``: the
SDK answers the request with it, so the call is an error result (or, at start, the
server's failure), never a hang or a crash, and the token is in neither.

Refreshes are one at a time per server; a login that another process refreshed (and
whose refresh token it rotated) is read back from the store before giving up.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator

from lodger._core.extras import require
from lodger.errors import ConfigError, McpAuthError
from lodger.tools._mcp_credentials import CredentialStore
from lodger.tools._mcp_discovery import oauth_http, origin
from lodger.tools._mcp_oauth import NEEDS_LOGIN, Login, McpOAuth, refresh_login

with require("mcp", "the MCP client (MCP servers as tools)"):
    import httpx2

__all__ = ["LOGIN_NEEDED", "BearerAuth", "login_needed_message"]

_log = logging.getLogger(__name__)

#: the JSON-RPC error code of lodger's "log in again" answer (implementation-defined range)
LOGIN_NEEDED = -32041


def login_needed_message(server: str, why: str) -> str:
    return (
        f"MCP server {server!r} {NEEDS_LOGIN} ({why}); ask the user to run "
        f"`lodger mcp login {server}`, then try again"
    )


class BearerAuth(httpx2.Auth):
    """The OAuth login of server ``server`` on each of its requests (module doc)."""

    def __init__(
        self, *, server: str, url: str, oauth: McpOAuth, store: CredentialStore | None = None
    ) -> None:
        self.server = server
        self._origin = origin(url)
        self._url = url
        self._oauth = oauth
        self._store = store if store is not None else oauth.credentials()
        self._login: Login | None = None
        self._loaded = False
        self._lock = asyncio.Lock()
        self._dead: str | None = None  # the token refused whose refresh failed, and why
        self._dead_why: str | None = None
        #: why the last refusal could not be mended (None: no refusal, or mended)
        self.needs_login: str | None = None

    async def _load(self) -> Login | None:
        try:
            record = await self._store.load(self.server)
            login = Login.from_record(record) if record is not None else None
        except ConfigError as exc:
            self.needs_login = exc.message
            _log.warning("MCP server %r: %s", self.server, exc.message)
            return None
        except OSError as exc:  # the store's disk or keyring failed: a refusal, not a hang
            self.needs_login = f"its login could not be read ({type(exc).__name__})"
            return None
        if login is not None and login.access_token == self._dead:
            self.needs_login = self._dead_why  # refused, refresh failed: only a login mends it
            return None
        if login is not None and login.server_url != self._url:
            return None  # a login for another URL of this name is not this server's
        return login

    async def _current(self) -> Login | None:
        async with self._lock:
            if not self._loaded:
                self._login, self._loaded = await self._load(), True
            if self._login is not None and self._login.expired():
                await self._refresh_locked(self._login)
            return self._login

    async def _refresh(self, used: Login | None) -> Login | None:
        """After a refusal of ``used``: a login another process stored meanwhile, or a
        refreshed one; None when neither."""
        async with self._lock:
            stored = await self._load()
            if stored is not None and (
                used is None or stored.access_token != used.access_token
            ):  # fmt: skip
                self._login = stored
                return stored
            if stored is None:
                self._login = None
                self.needs_login = self.needs_login or "no login is stored for it"
                return None
            return await self._refresh_locked(stored)

    async def _refresh_locked(self, login: Login) -> Login | None:
        if login.refresh_token is None:
            self.needs_login = "its token expired or was refused, and it has no refresh token"
            self._login, self._dead, self._dead_why = None, login.access_token, self.needs_login
            return None
        try:
            async with oauth_http() as http:
                fresh = await refresh_login(
                    login, http=http, client_secret=self._oauth.client_secret
                )
        except McpAuthError as exc:
            # another process may have refreshed first, spending the refresh token this
            # one held (servers rotate them): its login, if stored, is the one to use
            stored = await self._load()
            if stored is not None and stored.access_token != login.access_token:
                self._login = stored
                return stored
            self.needs_login = f"refreshing its token failed: {exc.message}"
            _log.warning("MCP server %r: %s", self.server, self.needs_login)
            self._login, self._dead, self._dead_why = None, login.access_token, self.needs_login
            return None
        try:
            await self._store.save(self.server, fresh.record())
        except (ConfigError, OSError) as exc:  # used for now; the next process logs in again
            _log.warning("MCP server %r: its refreshed login was not kept (%s)", self.server, exc)
        self._login = fresh
        return fresh

    def _authorize(self, request: httpx2.Request, login: Login | None) -> None:
        if login is not None and origin(str(request.url)) == self._origin:
            request.headers["Authorization"] = f"Bearer {login.access_token}"
        else:
            request.headers.pop("Authorization", None)

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        login = await self._current()
        self._authorize(request, login)
        response = yield request
        if response.status_code != 401:
            if login is not None:
                self.needs_login = None
            return
        self.needs_login = None
        fresh = await self._refresh(login)
        if fresh is not None:
            self._authorize(request, fresh)
            response = yield request
            if response.status_code != 401:
                return
            self.needs_login = "the server refused its token, even a fresh one"
        elif self.needs_login is None:
            self.needs_login = (
                "no login is stored for it"
                if login is None
                else "the server refused its token and it has no refresh token"
            )
        await _answer_login_needed(response, request, self.server, self.needs_login)


async def _answer_login_needed(
    response: httpx2.Response, request: httpx2.Request, server: str, why: str | None
) -> None:
    """Make the 401 answer of a JSON-RPC request an error that says to log in."""
    from lodger.tools._mcp_http import _asked

    asked = _asked(request)
    if asked is None:
        return  # a notification or a stream: the SDK drops it
    raw = response.stream
    if isinstance(raw, httpx2.AsyncByteStream):
        await raw.aclose()  # the body, unread; the response stays open for the SDK to read
    message = login_needed_message(server, why or "the server refused its token")
    body = json.dumps(
        {"jsonrpc": "2.0", "id": asked, "error": {"code": LOGIN_NEEDED, "message": message}}
    ).encode()
    for name in ("content-encoding", "transfer-encoding", "www-authenticate"):
        response.headers.pop(name, None)
    response.headers["content-type"] = "application/json"
    response.headers["content-length"] = str(len(body))
    response.stream = httpx2.ByteStream(body)

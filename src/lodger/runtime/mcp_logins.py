"""OAuth logins to a project's MCP servers: start, finish, refresh-free status, logout.

One service behind every door that logs in: ``lodger mcp login`` (a loopback redirect on
127.0.0.1), the host's ``/v1/mcp`` routes (its own callback route) and the library.

    logins = McpLogins(binding.mcp)                 # the servers a composition binds
    login = await logins.login_loopback("linear", show=print)
    await logins.logout("linear")

A server takes part when its config has ``auth`` (``oauth`` in ``lodger.toml``). A login
is kept in the server's credential store (``McpOAuth.store``, else the keyring or the
user's config directory); ``status`` says who is logged in and until when, never a
token. A login waiting for its callback lives in memory for ``PENDING_S`` and is used
once; a callback with an unknown or spent ``state`` is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lodger.errors import ConfigError, McpAuthError
from lodger.tools._mcp_credentials import CredentialStore
from lodger.tools._mcp_discovery import oauth_http
from lodger.tools._mcp_oauth import (
    Login,
    McpOAuth,
    PendingLogin,
    begin_login,
    finish_login,
    revoke_login,
)
from lodger.tools.mcp import McpServerConfig

__all__ = ["PENDING_S", "McpLogins"]

PENDING_S = 600.0
_CALLBACK_PATH = "/callback"
_MAX_REQUEST_BYTES = 16 * 1024
_PAGE = (
    "<!doctype html><meta charset=utf-8><title>lodger</title>"
    "<p>{text}</p><p>You can close this tab.</p>"
)


@dataclass(frozen=True)
class _Server:
    config: McpServerConfig
    oauth: McpOAuth
    url: str


class McpLogins:
    """Logins to the OAuth servers among ``servers`` (see the module doc)."""

    def __init__(
        self, servers: Sequence[McpServerConfig], *, store: CredentialStore | None = None
    ) -> None:
        self._servers = {
            c.name: _Server(c, c.auth, c.url)
            for c in servers
            if c.auth is not None and c.url is not None
        }
        self._store = store
        self._pending: dict[str, PendingLogin] = {}

    def _server(self, name: str) -> _Server:
        found = self._servers.get(name)
        if found is None:
            known = ", ".join(sorted(self._servers)) or "none"
            raise ConfigError(
                f"no MCP server {name!r} with OAuth in this project (OAuth servers: {known})",
                hint="set oauth = true in its [mcp.servers.NAME] table of a trusted lodger.toml",
            )
        return found

    def store_of(self, name: str) -> CredentialStore:
        if self._store is not None:
            return self._store
        return self._server(name).oauth.credentials()

    def names(self) -> list[str]:
        return sorted(self._servers)

    # ---------------------------------------------------------------- two steps

    async def begin(self, name: str, *, redirect_uri: str) -> PendingLogin:
        """Discover, register, and make the authorization URL; ``finish`` completes it."""
        server = self._server(name)
        self._expire()
        async with oauth_http() as http:
            pending = await begin_login(
                server=name,
                server_url=server.url,
                oauth=server.oauth,
                redirect_uri=redirect_uri,
                http=http,
            )
        self._pending[pending.state] = pending
        return pending

    async def finish(self, *, state: str | None, code: str | None, iss: str | None) -> Login:
        """The callback: its ``state`` names the login it finishes (once)."""
        self._expire()
        pending = self._pending.pop(state or "", None)
        if pending is None:
            raise McpAuthError(
                "this login callback matches no login in progress (its state is unknown, "
                "spent or expired); lodger refuses it: log in again"
            )
        async with oauth_http() as http:
            return await finish_login(
                pending,
                code=code,
                state=state,
                iss=iss,
                http=http,
                store=self.store_of(pending.server),
            )

    def _expire(self) -> None:
        now = time.time()
        for state, pending in list(self._pending.items()):
            if now - pending.created_at > PENDING_S:
                del self._pending[state]

    # ---------------------------------------------------------------- the loopback door

    async def login_loopback(
        self, name: str, *, show: Callable[[str], None], timeout_s: float = PENDING_S
    ) -> Login:
        """Log in through a redirect to ``http://127.0.0.1:PORT/callback``: ``show`` gets
        the authorization URL (print it, open a browser); the first callback on the path
        finishes the login, whatever it says (a wrong state fails it)."""
        server = self._server(name)
        arrived: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await _answer_callback(reader, writer, arrived)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

        listener = await asyncio.start_server(serve, "127.0.0.1", server.oauth.redirect_port)
        async with listener:
            port = listener.sockets[0].getsockname()[1]
            pending = await self.begin(
                name, redirect_uri=f"http://127.0.0.1:{port}{_CALLBACK_PATH}"
            )
            show(pending.authorization_url)
            try:
                async with asyncio.timeout(timeout_s):
                    query = await arrived
            except TimeoutError:
                self._pending.pop(pending.state, None)
                raise McpAuthError(
                    f"no login callback came within {timeout_s:g} s", hint="log in again"
                ) from None
        if "error" in query:
            self._pending.pop(pending.state, None)
            word = query["error"][:80]
            raise McpAuthError(f"the authorization server refused the login ({word!r})")
        if query.get("state") != pending.state:
            self._pending.pop(pending.state, None)
        return await self.finish(
            state=query.get("state"), code=query.get("code"), iss=query.get("iss")
        )

    # ---------------------------------------------------------------- status and logout

    async def status(self) -> list[dict[str, Any]]:
        """One entry per OAuth server: whether it is logged in, as whom, until when."""
        out: list[dict[str, Any]] = []
        for name in self.names():
            server = self._servers[name]
            entry: dict[str, Any] = {"server": name, "url": server.url, "logged_in": False}
            try:
                record = await self.store_of(name).load(name)
                login = Login.from_record(record) if record is not None else None
            except ConfigError as exc:
                entry["problem"] = exc.message
                out.append(entry)
                continue
            if login is not None:
                if login.server_url == server.url:
                    entry.update(login.public(), logged_in=True)
                else:
                    entry["problem"] = "the stored login is for another URL"
            out.append(entry)
        return out

    async def logout(self, name: str) -> dict[str, Any]:
        """Revoke the login where the server offers it, then forget it (even when the
        revocation fails: the answer says so)."""
        server = self._server(name)
        store = self.store_of(name)
        record = await store.load(name)
        if record is None:
            return {"server": name, "logged_in": False, "revoked": [], "deleted": False}
        login = Login.from_record(record)
        revoked: list[str] = []
        problem = None
        try:
            async with oauth_http() as http:
                revoked = await revoke_login(
                    login, http=http, client_secret=server.oauth.client_secret
                )
        except McpAuthError as exc:
            problem = exc.message
        deleted = await store.delete(name)
        out: dict[str, Any] = {"server": name, "revoked": revoked, "deleted": deleted}
        if problem is not None:
            out["problem"] = problem
        return out


async def _answer_callback(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    arrived: asyncio.Future[dict[str, str]],
) -> None:
    """Read one HTTP request; a GET of the callback path settles ``arrived``."""
    try:
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return
    if len(head) > _MAX_REQUEST_BYTES:
        return
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    target = urlsplit(parts[1]) if len(parts) == 3 else None
    if target is None or parts[0] != "GET" or target.path != _CALLBACK_PATH or arrived.done():
        await _respond(writer, 404, "Not a lodger login callback.")
        return
    query = {k: v[0] for k, v in parse_qs(target.query).items() if v}
    arrived.set_result(query)
    text = "The login reached lodger; see your terminal for how it went."
    await _respond(writer, 200, text)


async def _respond(writer: asyncio.StreamWriter, status: int, text: str) -> None:
    body = _PAGE.format(text=text).encode()
    reason = {200: "OK", 404: "Not Found"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/html; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    with contextlib.suppress(OSError):
        await writer.drain()

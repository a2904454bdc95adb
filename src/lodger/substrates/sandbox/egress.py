"""The egress proxy: the only way out of a sandbox whose policy allows some domains.

It runs in lodger's process, outside the sandbox, on a Unix socket that is mounted into
the sandbox; a forwarder inside serves that socket on ``127.0.0.1:3128`` and the command
gets ``HTTP_PROXY``/``HTTPS_PROXY`` pointing there. The sandbox has no other interface
than loopback, so a program that ignores the proxy variables reaches nothing.

Every request on a connection is read as a request and checked on its own (a second
request on a keep-alive connection, or one pipelined behind the first, is not piped
through unread):
- ``CONNECT host:port``: tunnelled if ``host`` is allowed (TLS passes through untouched);
  the connection is the tunnel's from then on.
- ``GET http://host/path`` and other plain-HTTP requests in absolute form: forwarded if
  allowed, with the policy's credential headers for that domain added here, so the
  secret never enters the sandbox.
- ``CONNECT host:port`` for a host the policy marks (``terminate_tls``): the proxy ends
  the sandbox's TLS itself with a certificate from a lodger CA made for this proxy
  (``lodger.substrates.sandbox.tls``), reads each request in it, adds the domain's
  credential headers and sends it over its own TLS connection to the real host,
  verified against the host's trust store (or the policy's ``upstream_ca``). Plain HTTP
  to a marked domain is refused, so its credentials never travel in clear text.
Each request goes upstream on a connection of its own (``Connection: close``). Its body
is re-framed on the way (``lodger.substrates.sandbox._http``): copied to its
``Content-Length`` or chunk by chunk, so the next request starts where the proxy says;
a body that could be read two ways is refused (400). The response comes back framed the
same way, and the sandbox's connection carries another request only when the response
ended where its framing says and neither side asked to close; otherwise the proxy says
``Connection: close`` and closes.
Anything else, or a host the allow-list does not name, is refused with 403. The proxy
resolves an allowed name once and connects to the address it checked: a name a wildcard
allows must resolve to public addresses only (not loopback, private, link-local or
metadata ones, which are the host's own network), and only a name the allow-list spells
out may lead inside (``NetworkPolicy.names``). Every allowed and refused request (a
CONNECT is one) is recorded (``Connection``) and ends up in the result. The sandbox
trusts the lodger CA through ``trust_bundle_path`` (mounted read-only by the backend)
and the variables of ``trust_environment``; the CA's key stays in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import shutil
import socket
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from lodger.substrates.sandbox._http import (
    CHUNKED,
    UNTIL_CLOSE,
    BadFraming,
    copy_body,
    read_head,
    request_framing,
    response_framing,
    tokens,
)
from lodger.substrates.sandbox.interface import Connection
from lodger.substrates.sandbox.policy import NetworkPolicy

if TYPE_CHECKING:
    from lodger.substrates.sandbox.tls import LodgerCA

__all__ = [
    "MAX_CONNECTIONS",
    "MAX_RECORDS",
    "PROXY_PORT",
    "TRUST_VARIABLES",
    "EgressProxy",
    "forwarder_argv",
    "proxy_environment",
    "trust_environment",
]

PROXY_PORT = 3128
#: connections the proxy serves at once; each holds descriptors in lodger's own process,
#: so past this a connection is refused at once (a sandbox cannot exhaust lodger's)
MAX_CONNECTIONS = 128
#: connections recorded one by one; past this they are counted in the last record (the
#: record lives in lodger's memory for as long as the command runs)
MAX_RECORDS = 1000
_HANDSHAKE_S = 30.0

# Runs inside the sandbox with the system Python: serves the proxy socket on loopback,
# starts the command, exits with its status (128+N when a signal N ended it).
_FORWARDER = r"""
import os, socket, subprocess, sys, threading
path, argv = sys.argv[1], sys.argv[2:]
server = socket.socket()
server.bind(("127.0.0.1", PORT))
server.listen(64)
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass
def serve():
    while True:
        client, _ = server.accept()
        # No Nagle: a small write behind an unacknowledged one (a TLS response after the
        # session tickets) would wait for the client's delayed ACK, 40 ms a request.
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            continue
        threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
try:
    code = subprocess.call(argv)
except OSError as exc:
    print(f"{argv[0]}: {exc.strerror}", file=sys.stderr)
    code = 127
sys.stdout.flush()
os._exit(128 - code if code < 0 else code)
""".replace("PORT", str(PROXY_PORT))


def forwarder_argv(socket_path: str, argv: Sequence[str]) -> list[str]:
    """Wrap ``argv`` so it runs with the loopback proxy forwarder beside it."""
    return ["/usr/bin/python3", "-S", "-c", _FORWARDER, socket_path, *argv]


#: variables that point common clients (OpenSSL, requests, curl, Node, git, pip) at a
#: CA bundle
TRUST_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
)


def trust_environment(bundle: str) -> dict[str, str]:
    """The environment that makes clients in the sandbox trust the CA bundle ``bundle``."""
    return dict.fromkeys(TRUST_VARIABLES, bundle)


def proxy_environment() -> dict[str, str]:
    url = f"http://127.0.0.1:{PROXY_PORT}"
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": "",
    }


class EgressProxy:
    """``async with EgressProxy(policy) as proxy:`` serves ``proxy.socket_path``."""

    def __init__(self, policy: NetworkPolicy) -> None:
        self.policy = policy
        self.connections: list[Connection] = []
        self._unrecorded = self._unrecorded_allowed = 0  # past MAX_RECORDS
        self._dir: str | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.ca: LodgerCA | None = None
        self._upstream_tls: ssl.SSLContext | None = None

    @property
    def socket_path(self) -> Path:
        assert self._dir is not None, "the proxy is not running"
        return Path(self._dir) / "egress.sock"

    @property
    def trust_bundle_path(self) -> Path | None:
        """The lodger CA and the host's CAs (PEM), for the sandbox; None without TLS
        termination."""
        if self.ca is None:
            return None
        assert self._dir is not None, "the proxy is not running"
        return Path(self._dir) / "ca-bundle.pem"

    async def __aenter__(self) -> EgressProxy:
        self._dir = tempfile.mkdtemp(prefix="lodger-egress-")
        if self.policy.terminate_tls:
            await asyncio.to_thread(self._prepare_tls)
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.socket_path))
        return self

    def _prepare_tls(self) -> None:
        from lodger.substrates.sandbox.tls import LodgerCA, system_ca_bundle

        self.ca = LodgerCA(self.policy.terminate_tls)
        bundle = self.trust_bundle_path
        assert bundle is not None
        bundle.write_bytes(self.ca.certificate_pem + b"\n" + system_ca_bundle())
        bundle.chmod(0o644)
        upstream_ca = self.policy.upstream_ca
        self._upstream_tls = ssl.create_default_context(
            cafile=str(upstream_ca) if upstream_ca is not None else None
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        busy = len(self._tasks) >= MAX_CONNECTIONS
        self._tasks.add(task)  # owned: the proxy cancels and awaits them when it stops
        try:
            if busy:
                why = f"too many connections at once (more than {MAX_CONNECTIONS})"
                self._refuse(writer, "", 0, "", why, 503)
                await writer.drain()
                return
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Every request on the connection in turn, each checked on its own: a request
        is read as a request only once the one before it and its response have ended."""
        while (head := await read_head(reader)) is not None:
            if not await self._request(reader, writer, head):
                await writer.drain()
                return

    async def _request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes
    ) -> bool:
        """One request from the sandbox, refused or served; whether the connection can
        carry another."""
        if _malformed(head):
            self._refuse(writer, "", 0, "", "malformed request head", 400)
            return False
        try:
            method, target, _, _ = _parse_head(head)
        except ValueError:
            self._refuse(writer, "", 0, "", "malformed request line", 400)
            return False
        if method == "CONNECT":
            host, _, port_text = target.rpartition(":")
            port = int(port_text) if port_text.isascii() and port_text.isdigit() else 0
        else:
            url = urlsplit(target)
            if url.scheme != "http" or not url.hostname:
                self._refuse(writer, url.hostname or target, 0, method, "not a proxy request")
                return False
            host = url.hostname
            try:
                port = 80 if url.port is None else url.port
            except ValueError:  # not a number, or past 65535
                port = 0
        host = host.strip("[]").lower()
        why = self._refusal(method, host, port)
        if why is not None:
            self._refuse(writer, host, port if 0 < port < 65536 else 0, method, *why)
            return False
        if method == "CONNECT":
            if self.ca is not None and self.policy.terminates(host):
                await self._terminate(reader, writer, host, port)
            else:
                await self._tunnel(reader, writer, host, port)
            return False
        try:
            request = _Request.of(head)
        except BadFraming as exc:
            self._refuse(writer, host, port, method, f"ambiguous body: {exc}", 400)
            return False
        upstream = await self._upstream(writer, host, port, method)
        if upstream is None:
            return False
        return await self._exchange(reader, writer, request, upstream, host, port)

    def _refusal(self, method: str, host: str, port: int) -> tuple[str, int] | None:
        """Why a request for ``host:port`` is refused (and with which status), if it is."""
        # Checked here: the resolver would take 65616 for port 80.
        if not 0 < port < 65536:
            return "bad port", 400
        if not self.policy.allows(host):
            return "not in the allow-list", 403
        if method != "CONNECT" and self.policy.terminates(host):
            # Its credentials travel over TLS only: a plain request would carry them in
            # clear text past the host, and one without them is not what was marked.
            return "plain HTTP to a domain marked for TLS", 403
        return None

    async def _upstream(
        self,
        writer: asyncio.StreamWriter,
        host: str,
        port: int,
        method: str,
        *,
        tls: bool = False,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the checked address of ``host``; None, refused and recorded,
        when there is none."""
        try:
            if not tls:
                return await _connect(await self._addresses(host, port), port)
            return await _connect(
                await self._addresses(host, port),
                port,
                ssl=self._upstream_tls,
                server_hostname=host,
            )
        except _Inside as exc:
            self._refuse(writer, host, port, method, str(exc), tls=tls)
        except ssl.SSLCertVerificationError as exc:
            why = f"upstream certificate not trusted: {exc.verify_message}"
            self._refuse(writer, host, port, method, why, 502, tls=tls)
        except OSError as exc:
            why = f"unreachable: {exc.strerror or exc}"
            self._refuse(writer, host, port, method, why, 502, tls=tls)
        return None

    async def _tunnel(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int
    ) -> None:
        """A CONNECT to an allowed host that is not marked: its bytes both ways, untouched
        (TLS from the sandbox to the host, which the proxy cannot read)."""
        upstream = await self._upstream(writer, host, port, "CONNECT")
        if upstream is None:
            return
        up_reader, up_writer = upstream
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        self._record(Connection(host=host, port=port, method="CONNECT", allowed=True))
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(_pipe(reader, up_writer))
                group.create_task(_pipe(up_reader, writer))
        finally:
            up_writer.close()

    async def _terminate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int
    ) -> None:
        """TLS from the sandbox ends here; each request in it goes on, checked, over
        lodger's own TLS."""
        assert self.ca is not None and self._upstream_tls is not None
        context = await asyncio.to_thread(self.ca.server_context, host)
        # Nothing may await between the 200 and start_tls: the client's hello follows the
        # 200 at once, and bytes the plain stream read first would be lost to TLS.
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        try:
            await writer.start_tls(context, ssl_handshake_timeout=_HANDSHAKE_S)
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            why = f"no TLS from the sandbox: {getattr(exc, 'reason', None) or exc}"
            self._record(
                Connection(
                    host=host, port=port, method="CONNECT", allowed=False, reason=why,
                    tls_terminated=True,
                )
            )  # fmt: skip
            return
        while (head := await read_head(reader)) is not None:
            if _malformed(head):
                self._refuse(writer, host, port, "", "malformed request head", 400, tls=True)
                return
            try:
                request = _Request.of(head)
            except BadFraming as exc:
                method = _parse_head(head)[0]
                self._refuse(writer, host, port, method, f"ambiguous body: {exc}", 400, tls=True)
                return
            except ValueError:
                self._refuse(writer, host, port, "", "malformed request line", 400, tls=True)
                return
            upstream = await self._upstream(writer, host, port, request.method, tls=True)
            if upstream is None:
                return
            if not await self._exchange(reader, writer, request, upstream, host, port, tls=True):
                return

    async def _exchange(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: _Request,
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        host: str,
        port: int,
        *,
        tls: bool = False,
    ) -> bool:
        """Send one checked request upstream, with the credentials for its host, and its
        response back; whether the sandbox's connection can carry another request (the
        response ended where its framing says, and neither side asked to close)."""
        authority = host if port == (443 if tls else 80) else f"{host}:{port}"
        up_reader, up_writer = upstream
        extra = self.policy.headers_for(host)
        # The Host header names the host the request goes to (over TLS, the one the
        # tunnel was opened to), whatever the sandbox wrote: the credentials go to that
        # host and to no virtual host a shared front end has behind it.
        headers = [h for h in request.headers if _header_name(h) != "host"]
        headers.insert(0, f"Host: {authority}")
        up_writer.write(
            _request_head(
                request.method, _origin_form(request.target), request.version, headers, extra
            )
        )
        self._record(
            Connection(
                host=host, port=port, method=request.method, allowed=True,
                credentials_injected=bool(extra), tls_terminated=tls,
            )
        )  # fmt: skip
        body = asyncio.create_task(copy_body(reader, up_writer, request.size))
        relay = asyncio.create_task(_relay_response(up_reader, writer, request))
        try:
            pending: set[asyncio.Task[Any]] = {body, relay}
            while relay in pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if body in done:
                    body.result()  # the sandbox's body could not be read: the end of it
            # A response that came before the whole body (a 413): the rest is unread.
            return bool(relay.result()) and body.done()
        finally:
            for task in (body, relay):
                task.cancel()
            await asyncio.gather(body, relay, return_exceptions=True)
            up_writer.close()

    async def _addresses(self, host: str, port: int) -> list[str]:
        """The addresses to connect to for ``host``, resolved once here: the connection
        goes to an address checked, so a name that answers differently a moment later
        (DNS rebinding) gains nothing. ``_Inside`` when it leads to an address that is not
        on the public internet and the allow-list matched it only by a wildcard."""
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [str(info[4][0]) for info in infos]
        if not addresses:
            raise OSError(f"{host} has no address")
        if not self.policy.names(host):
            for address in addresses:
                if not _public(address):
                    raise _Inside(
                        f"resolves to {address}, not a public address; name {host} "
                        "outright in network.allow to reach it"
                    )
        return list(dict.fromkeys(addresses))  # in the resolver's order, each once

    def _record(self, connection: Connection) -> None:
        if len(self.connections) < MAX_RECORDS - 1:
            self.connections.append(connection)
            return
        # The last record counts every connection past the others.
        self._unrecorded += 1
        self._unrecorded_allowed += connection.allowed
        summary = Connection(
            host="", port=0, method="", allowed=False,
            reason=f"{self._unrecorded} more connections "
            f"({self._unrecorded_allowed} allowed) not recorded",
        )  # fmt: skip
        if len(self.connections) < MAX_RECORDS:
            self.connections.append(summary)
        else:
            self.connections[-1] = summary

    def _refuse(
        self,
        writer: asyncio.StreamWriter,
        host: str,
        port: int,
        method: str,
        why: str,
        status: int = 403,
        *,
        tls: bool = False,
    ) -> None:
        self._record(
            Connection(
                host=host, port=port, method=method, allowed=False, reason=why, tls_terminated=tls
            )
        )
        body = f"lodger egress proxy: {host} refused: {why}\n".encode()
        writer.write(
            f"HTTP/1.1 {status} Forbidden\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n".encode()
            + body
        )


async def _connect(
    addresses: Sequence[str], port: int, **options: Any
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the first of ``addresses`` that answers (a name with an IPv6
    address first still works from a host without IPv6); the last failure if none does."""
    failure: OSError | None = None
    for address in addresses:
        try:
            return await asyncio.open_connection(address, port, **options)
        except ssl.SSLCertVerificationError:
            raise  # the certificate is the host's, whichever address answered
        except OSError as exc:
            failure = exc
    assert failure is not None  # _addresses never returns an empty list
    raise failure


@dataclass(frozen=True, slots=True)
class _Request:
    """A request head from the sandbox, with where its body ends."""

    method: str
    target: str
    version: str
    headers: list[str]
    #: the body's length, or ``CHUNKED``
    size: int
    #: whether the sandbox means to send another request on the connection after it
    persistent: bool

    @classmethod
    def of(cls, head: bytes) -> _Request:
        method, target, version, headers = _parse_head(head)
        persistent = version == "HTTP/1.1" and "close" not in tokens(headers, "connection")
        return cls(method, target, version, headers, request_framing(headers), persistent)


#: response headers about the connection, not the message: the proxy's to set
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection"})


async def _relay_response(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: _Request
) -> bool:
    """Copy the response to ``request`` (interim 1xx ones first) from the upstream to the
    sandbox; whether the connection can carry another request after it."""
    while True:
        head = await read_head(reader)
        if head is None:
            raise asyncio.IncompleteReadError(b"", None)  # no response at all
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not (code.isascii() and code.isdigit()):
            raise ValueError(f"not an HTTP response: {status_line[:60]!r}")
        status = int(code)
        if 100 <= status < 200 and status != 101:
            writer.write(head)  # 100 Continue and the like: the response is still to come
            continue
        headers = [line for line in lines if line]
        size = UNTIL_CLOSE if status == 101 else response_framing(request.method, status, headers)
        persistent = (
            request.persistent
            and size != UNTIL_CLOSE
            and "close" not in tokens(headers, "connection")
            and not _malformed(head)
        )
        kept = [
            line
            for line in headers
            if _header_name(line) not in _HOP_BY_HOP
            and not (size == CHUNKED and _header_name(line) == "content-length")
        ]
        if not persistent:
            kept.append("Connection: close")
        writer.write(("\r\n".join([status_line, *kept]) + "\r\n\r\n").encode("latin-1"))
        await copy_body(reader, writer, size)
        await writer.drain()
        return persistent


class _Inside(Exception):
    """An allowed name that leads to the host's own network (see ``_addresses``)."""


def _public(address: str) -> bool:
    """Whether ``address`` is on the public internet: not loopback, private, link-local
    (cloud metadata services live there), shared, reserved or multicast."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    return ip.is_global and not ip.is_multicast


def _malformed(head: bytes) -> bool:
    """A CR or LF outside a CRLF, or a NUL: this proxy and the server behind it could
    read different headers (a bare LF ends a line for many servers)."""
    rest = head.replace(b"\r\n", b"")
    return b"\r" in rest or b"\n" in rest or b"\0" in rest


def _parse_head(head: bytes) -> tuple[str, str, str, list[str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    return method, target, version, [line for line in lines[1:] if line]


def _header_name(line: str) -> str:
    return line.split(":", 1)[0].strip().lower()


def _origin_form(target: str) -> str:
    url = urlsplit(target)
    return (url.path or "/") + (f"?{url.query}" if url.query else "")


def _request_head(
    method: str, path: str, version: str, headers: list[str], extra: Mapping[str, str]
) -> bytes:
    """The request head sent upstream: the sandbox's headers without proxy and
    connection headers or any it set under a credential's name, then the credentials."""
    names = {name.lower() for name in extra}
    kept = [
        h
        for h in headers
        if not h.lower().startswith(("proxy-", "connection:"))
        and h.split(":", 1)[0].strip().lower() not in names
    ]
    kept += [f"{name}: {value}" for name, value in extra.items()]
    kept.append("Connection: close")
    return f"{method} {path} {version}\r\n".encode("latin-1") + (
        "\r\n".join(kept) + "\r\n\r\n"
    ).encode("latin-1")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            if writer.can_write_eof():
                writer.write_eof()

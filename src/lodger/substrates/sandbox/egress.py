"""The egress proxy: the only way out of a sandbox whose policy allows some domains.

It runs in lodger's process, outside the sandbox, on a Unix socket that is mounted into
the sandbox; a forwarder inside serves that socket on ``127.0.0.1:3128`` and the command
gets ``HTTP_PROXY``/``HTTPS_PROXY`` pointing there. The sandbox has no other interface
than loopback, so a program that ignores the proxy variables reaches nothing.

For each connection the proxy reads one request head:
- ``CONNECT host:port``: tunnelled if ``host`` is allowed (TLS passes through untouched);
- ``GET http://host/path`` and other plain-HTTP requests in absolute form: forwarded if
  allowed, with the policy's credential headers for that domain added here, so the
  secret never enters the sandbox.
- ``CONNECT host:port`` for a host the policy marks (``terminate_tls``): the proxy ends
  the sandbox's TLS itself with a certificate from a lodger CA made for this proxy
  (``lodger.substrates.sandbox.tls``), reads the request, adds the domain's credential headers and
  sends it over its own TLS connection to the real host, verified against the host's
  trust store (or the policy's ``upstream_ca``). One request per connection: the
  upstream request says ``Connection: close``. Plain HTTP to a marked domain is refused,
  so its credentials never travel in clear text.
Anything else, or a host the allow-list does not name, is refused with 403. The proxy
resolves an allowed name once and connects to the address it checked: a name a wildcard
allows must resolve to public addresses only (not loopback, private, link-local or
metadata ones, which are the host's own network), and only a name the allow-list spells
out may lead inside (``NetworkPolicy.names``). Every
allowed and refused connection is recorded (``Connection``) and ends up in the result.
The sandbox trusts the lodger CA through ``trust_bundle_path`` (mounted read-only by the
backend) and the variables of ``trust_environment``; the CA's key
stays in this process.
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
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

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
_MAX_HEAD = 64 * 1024
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
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > _MAX_HEAD:
            raise ValueError("request head too large")
        if _malformed(head):
            self._refuse(writer, "", 0, "", "malformed request head", 400)
            await writer.drain()
            return
        method, target, version, headers = _parse_head(head)
        if method == "CONNECT":
            host, _, port_text = target.rpartition(":")
            port = int(port_text) if port_text.isascii() and port_text.isdigit() else 0
        else:
            url = urlsplit(target)
            if url.scheme != "http" or not url.hostname:
                self._refuse(writer, url.hostname or target, 0, method, "not a proxy request")
                return
            host = url.hostname
            try:
                port = 80 if url.port is None else url.port
            except ValueError:  # not a number, or past 65535
                port = 0
        # Checked here: the resolver would take 65616 for port 80.
        if not 0 < port < 65536:
            self._refuse(writer, host.strip("[]").lower(), 0, method, "bad port", 400)
            await writer.drain()
            return
        host = host.strip("[]").lower()
        if not self.policy.allows(host):
            self._refuse(writer, host, port, method, "not in the allow-list")
            await writer.drain()
            return
        if method != "CONNECT" and self.policy.terminates(host):
            # Its credentials travel over TLS only: a plain request would carry them in
            # clear text past the host, and one without them is not what was marked.
            self._refuse(writer, host, port, method, "plain HTTP to a domain marked for TLS")
            await writer.drain()
            return
        if method == "CONNECT" and self.ca is not None and self.policy.terminates(host):
            await self._terminate(reader, writer, host, port)
            return
        try:
            up_reader, up_writer = await _connect(await self._addresses(host, port), port)
        except _Inside as exc:
            self._refuse(writer, host, port, method, str(exc))
            await writer.drain()
            return
        except OSError as exc:
            self._refuse(writer, host, port, method, f"unreachable: {exc.strerror or exc}", 502)
            await writer.drain()
            return
        injected = False
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        else:
            extra = self.policy.headers_for(host)
            injected = bool(extra)
            # As over TLS: the Host header names the host the request goes to, so a
            # shared front end cannot route the credentials to another virtual host.
            headers = [h for h in headers if _header_name(h) != "host"]
            headers.insert(0, f"Host: {host if port == 80 else f'{host}:{port}'}")
            up_writer.write(_request_head(method, _origin_form(target), version, headers, extra))
        self._record(
            Connection(
                host=host, port=port, method=method, allowed=True, credentials_injected=injected
            )
        )
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(_pipe(reader, up_writer))
                group.create_task(_pipe(up_reader, writer))
        finally:
            up_writer.close()

    async def _terminate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int
    ) -> None:
        """TLS from the sandbox ends here; the request goes on over lodger's own TLS."""
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
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > _MAX_HEAD:
            raise ValueError("request head too large")
        if _malformed(head):
            self._refuse(writer, host, port, "", "malformed request head", 400, tls=True)
            await writer.drain()
            return
        method, target, version, headers = _parse_head(head)
        try:
            up_reader, up_writer = await _connect(
                await self._addresses(host, port),
                port,
                ssl=self._upstream_tls,
                server_hostname=host,
            )
        except _Inside as exc:
            self._refuse(writer, host, port, method, str(exc), tls=True)
            await writer.drain()
            return
        except ssl.SSLCertVerificationError as exc:
            why = f"upstream certificate not trusted: {exc.verify_message}"
            self._refuse(writer, host, port, method, why, 502, tls=True)
            await writer.drain()
            return
        except OSError as exc:
            why = f"unreachable: {exc.strerror or exc}"
            self._refuse(writer, host, port, method, why, 502, tls=True)
            await writer.drain()
            return
        extra = self.policy.headers_for(host)
        authority = host if port == 443 else f"{host}:{port}"
        # The Host header names the host the tunnel was opened to, whatever the sandbox
        # wrote: the credentials go to that host and to no virtual host behind it.
        headers = [h for h in headers if _header_name(h) != "host"]
        headers.insert(0, f"Host: {authority}")
        up_writer.write(_request_head(method, _origin_form(target), version, headers, extra))
        self._record(
            Connection(
                host=host,
                port=port,
                method=method,
                allowed=True,
                credentials_injected=bool(extra),
                tls_terminated=True,
            )
        )
        # The upstream closes after its response (Connection: close); then so does the
        # sandbox's side, which over TLS cannot be half-closed.
        to_upstream = asyncio.create_task(_pipe(reader, up_writer))
        try:
            await _pipe(up_reader, writer)
        finally:
            to_upstream.cancel()
            await asyncio.gather(to_upstream, return_exceptions=True)
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

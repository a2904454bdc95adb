"""Every request on a proxied connection is checked, not only the first: keep-alive and
pipelined requests in plain HTTP and inside terminated TLS, and bodies (a length, chunks)
that a second request could hide behind. Real sockets on loopback: a keep-alive upstream
that serves every request it is sent (as a lenient server does, whatever ``Connection``
says), the proxy on its Unix socket, and a client speaking raw HTTP/1.1 to it."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from test_tls_termination import Upstream as TLSUpstream

from lodger.substrates.sandbox import BubblewrapSandbox, Limits, NetworkPolicy
from lodger.substrates.sandbox.egress import EgressProxy

SECRET = "Bearer s3cret-keepalive"
CREDENTIALS = {"localhost": {"Authorization": SECRET}}


class KeepAlive:
    """An upstream answering every request on a connection (``Content-Length`` framed);
    records each request as (head, body)."""

    def __init__(self, context: ssl.SSLContext | None = None) -> None:
        self.context = context
        self.requests: list[tuple[bytes, bytes]] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = await reader.readexactly(length)
                if b"transfer-encoding: chunked" in head.lower():
                    body = await reader.readuntil(b"0\r\n\r\n")
                self.requests.append((head, body))
                answer = f"answer {len(self.requests)}".encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer))
                writer.write(answer)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> KeepAlive:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


async def _response(reader: asyncio.StreamReader) -> bytes:
    """One response (Content-Length framed), or what came before the connection closed."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    except asyncio.IncompleteReadError as exc:
        return exc.partial
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await asyncio.wait_for(reader.readexactly(length), 10)


async def _exchange(proxy: EgressProxy, *requests: bytes, pipelined: bool = False) -> list[bytes]:
    """Send ``requests`` on one connection to the proxy (all at once when ``pipelined``,
    else each after the answer to the one before) and read an answer for each."""
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    try:
        return await _answers(reader, writer, requests, pipelined)
    finally:
        writer.close()


async def _answers(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    requests: tuple[bytes, ...],
    pipelined: bool,
) -> list[bytes]:
    answers = []
    if pipelined:
        writer.write(b"".join(requests))
    for request in requests:
        if not pipelined:
            writer.write(request)
        await writer.drain()
        answers.append(await _response(reader))
    return answers


def _record(proxy: EgressProxy) -> list[tuple[str, str, bool, bool]]:
    return [(c.host, c.method, c.allowed, c.credentials_injected) for c in proxy.connections]


@pytest.mark.parametrize(
    "second",
    [
        "GET /two HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        "GET http://evil.example/two HTTP/1.1\r\nHost: evil.example\r\n\r\n",
    ],
    ids=["host-header", "absolute-form"],
)
@pytest.mark.parametrize("pipelined", [False, True], ids=["keep-alive", "pipelined"])
async def test_a_second_request_on_a_plain_connection_is_checked(
    second: str, pipelined: bool
) -> None:
    """Broke: after the first request the proxy piped the connection raw, so a second one
    for a host the allow-list does not name reached the upstream, unrecorded."""
    async with KeepAlive() as upstream, EgressProxy(NetworkPolicy(allow=("localhost",))) as proxy:
        first = f"GET http://localhost:{upstream.port}/one HTTP/1.1\r\nHost: localhost\r\n\r\n"
        answers = await _exchange(proxy, first.encode(), second.encode(), pipelined=pipelined)
    assert answers[0].endswith(b"answer 1"), answers
    assert answers[1].startswith(b"HTTP/1.1 4") or answers[1] == b"", answers
    assert [head.split(b"\r\n")[0] for head, _ in upstream.requests] == [b"GET /one HTTP/1.1"]
    record = _record(proxy)
    assert record[0] == ("localhost", "GET", True, False)
    assert len(record) == 2 and not record[1][2], record
    assert record[1][0] in ("evil.example", "/two"), record


async def test_every_request_on_a_keep_alive_connection_gets_its_credentials() -> None:
    policy = NetworkPolicy(allow=("localhost",), credentials=CREDENTIALS)
    async with KeepAlive() as upstream, EgressProxy(policy) as proxy:
        base = f"http://localhost:{upstream.port}"
        requests = [
            f"GET {base}/{n} HTTP/1.1\r\nHost: localhost\r\nAuthorization: forged\r\n\r\n".encode()
            for n in range(3)
        ]
        answers = await _exchange(proxy, *requests)
    assert [a.rsplit(b"\r\n\r\n", 1)[1] for a in answers] == [b"answer 1", b"answer 2", b"answer 3"]
    assert len(upstream.requests) == 3
    for head, _ in upstream.requests:
        assert f"\r\nAuthorization: {SECRET}\r\n".encode() in head and b"forged" not in head
        # The sandbox's connection may go on; the proxy's own to the upstream does not.
        assert b"\r\nConnection: close\r\n" in head
    for answer in answers:
        assert b"connection:" not in answer.lower()  # kept alive: nothing said
    assert _record(proxy) == [("localhost", "GET", True, True)] * 3


@pytest.mark.parametrize(
    "body",
    [
        "Content-Length: 48\r\n\r\nGET http://evil.example/in-body HTTP/1.1\r\n\r\nxxxx",
        "Transfer-Encoding: chunked\r\n\r\n"
        "2c;ext=1\r\nGET http://evil.example/in-body HTTP/1.1\r\n\r\n\r\n0\r\nX-Trailer: 1\r\n\r\n",
    ],
    ids=["content-length", "chunked"],
)
async def test_a_body_is_a_body_and_what_follows_it_a_request(body: str) -> None:
    """The proxy finds where a body ends (to the byte, or chunk by chunk) and reads what
    follows as a request of its own: request text inside a body stays the body's, and a
    request behind it is checked."""
    async with KeepAlive() as upstream, EgressProxy(NetworkPolicy(allow=("localhost",))) as proxy:
        post = f"POST http://localhost:{upstream.port}/post HTTP/1.1\r\nHost: localhost\r\n{body}"
        after = b"GET http://evil.example/after HTTP/1.1\r\n\r\n"
        answers = await _exchange(proxy, post.encode(), after, pipelined=True)
    assert answers[0].endswith(b"answer 1") and answers[1].startswith(b"HTTP/1.1 403"), answers
    assert len(upstream.requests) == 1
    head, sent = upstream.requests[0]
    assert head.startswith(b"POST /post HTTP/1.1\r\n")
    assert b"GET http://evil.example/in-body" in sent
    if b"chunked" in head:
        assert sent == b"2c\r\nGET http://evil.example/in-body HTTP/1.1\r\n\r\n\r\n0\r\n\r\n"
    assert _record(proxy) == [
        ("localhost", "POST", True, False),
        ("evil.example", "GET", False, False),
    ]


@pytest.mark.parametrize(
    "framing",
    [
        "Content-Length: 4\r\nTransfer-Encoding: chunked",
        "Content-Length: 4\r\nContent-Length: 40",
        "Transfer-Encoding: gzip, chunked",
        "Content-Length: -4",
    ],
)
async def test_a_body_that_could_be_read_two_ways_is_refused(framing: str) -> None:
    async with KeepAlive() as upstream, EgressProxy(NetworkPolicy(allow=("localhost",))) as proxy:
        request = (
            f"POST http://localhost:{upstream.port}/ HTTP/1.1\r\n{framing}\r\n\r\n"
            "0\r\n\r\nGET http://evil.example/ HTTP/1.1\r\n\r\n"
        )
        (answer,) = await _exchange(proxy, request.encode())
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert upstream.requests == []
    (refused,) = proxy.connections
    assert not refused.allowed and refused.reason.startswith("ambiguous body"), refused


async def test_a_response_without_a_length_ends_the_connection() -> None:
    """A body that ends when the upstream closes leaves no place for a next request: the
    proxy says so (``Connection: close``) and closes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, EgressProxy(NetworkPolicy(allow=("localhost",))) as proxy:
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        writer.write(f"GET http://localhost:{port}/ HTTP/1.1\r\n\r\n".encode())
        writer.write(b"GET http://evil.example/ HTTP/1.1\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert answer.endswith(b"\r\n\r\nuntil the end"), answer
    assert b"\r\nConnection: close\r\n" in answer and b"keep-alive" not in answer
    assert _record(proxy) == [("localhost", "GET", True, False)]


async def test_pipelined_requests_inside_terminated_tls_are_each_checked(tmp_path: Path) -> None:
    """Broke: inside a terminated TLS tunnel only the first request was read; the rest
    went to the upstream raw, with the sandbox's own Host header and no credentials, and
    unrecorded. Each now gets the tunnel's host, its credentials and a record."""
    tls = TLSUpstream(tmp_path)  # its certificate and CA; served here with keep-alive
    policy = NetworkPolicy(
        allow=("localhost",),
        credentials=CREDENTIALS,
        terminate_tls=("localhost",),
        upstream_ca=tls.ca_file,
    )
    async with KeepAlive(tls.context) as upstream, EgressProxy(policy) as proxy:
        assert proxy.ca is not None
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        try:
            writer.write(f"CONNECT localhost:{upstream.port} HTTP/1.1\r\n\r\n".encode())
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            trust = ssl.create_default_context(cadata=proxy.ca.certificate_pem.decode())
            await writer.start_tls(trust, server_hostname="localhost")
            requests = (
                b"GET /one HTTP/1.1\r\nHost: localhost\r\n\r\n",
                b"GET /two HTTP/1.1\r\nHost: evil.example\r\nAuthorization: forged\r\n\r\n",
                b"GET http://evil.example/three HTTP/1.1\r\n\r\n",
            )
            answers = await _answers(reader, writer, requests, pipelined=True)
        finally:
            writer.close()
    assert [a.rsplit(b"\r\n\r\n", 1)[1] for a in answers] == [b"answer 1", b"answer 2", b"answer 3"]
    lines = [head.split(b"\r\n")[0] for head, _ in upstream.requests]
    assert lines == [b"GET /one HTTP/1.1", b"GET /two HTTP/1.1", b"GET /three HTTP/1.1"]
    for head, _ in upstream.requests:
        assert f"\r\nHost: localhost:{upstream.port}\r\n".encode() in head
        assert f"\r\nAuthorization: {SECRET}\r\n".encode() in head
        assert b"evil" not in head and b"forged" not in head
    assert [
        (c.method, c.allowed, c.credentials_injected, c.tls_terminated) for c in proxy.connections
    ] == [("GET", True, True, True)] * 3


PROBE = """
import http.client, sys
port = int(sys.argv[1])
proxy = http.client.HTTPConnection("127.0.0.1", 3128, timeout=10)
for url in (f"http://localhost:{port}/one", "http://evil.example/two"):
    try:
        proxy.request("GET", url)
        r = proxy.getresponse()
        print(url, r.status, r.read().decode().strip())
    except Exception as e:
        print(url, "FAILED", type(e).__name__)
"""


async def test_a_keep_alive_client_in_the_sandbox_is_checked_per_request(tmp_path: Path) -> None:
    """The same through a real bubblewrap sandbox: Python's http.client keeps its one
    connection to the proxy alive between the two requests."""
    async with KeepAlive() as upstream:
        result = await BubblewrapSandbox().run(
            ["python3", "-c", PROBE, str(upstream.port)],
            workspace=tmp_path,
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"},
            limits=Limits(wall_time_s=60),
            network=NetworkPolicy(allow=("localhost",), credentials=CREDENTIALS),
        )
    out = result.output.decode(errors="replace")
    assert f"http://localhost:{upstream.port}/one 200 answer 1" in out, out
    assert "http://evil.example/two 403 lodger egress proxy: evil.example refused" in out, out
    assert len(upstream.requests) == 1 and SECRET.encode() in upstream.requests[0][0]
    assert [(c.host, c.allowed) for c in result.connections] == [
        ("localhost", True),
        ("evil.example", False),
    ]


async def test_responses_are_framed_so_the_connection_goes_on() -> None:
    """A chunked response (re-chunked on the way, its trailer dropped), an interim 100,
    and a HEAD's answer with a length but no body: each ends where its framing says, so
    the next request on the connection is read as one, and checked."""
    answers = [
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Length: 3\r\n\r\n5;x=y\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",  # to HEAD: no body follows
        b"HTTP/1.1 204 No Content\r\n\r\n",
    ]
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(answers[len(heads) - 1])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, EgressProxy(NetworkPolicy(allow=("localhost",))) as proxy:
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        try:
            for method in ("GET", "HEAD", "DELETE"):
                writer.write(f"{method} http://localhost:{port}/ HTTP/1.1\r\n\r\n".encode())
            writer.write(b"GET http://evil.example/ HTTP/1.1\r\n\r\n")
            everything = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
    assert [h.split(b" ", 1)[0] for h in heads] == [b"GET", b"HEAD", b"DELETE"]
    first, rest = everything.split(b"0\r\n\r\n", 1)
    assert first.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"), everything
    assert first.endswith(b"\r\n\r\n5\r\nhello\r\n") and b"Content-Length" not in first
    assert b"X-Trailer" not in rest
    assert rest.startswith(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nHTTP/1.1 204 "), rest
    assert b"HTTP/1.1 403 Forbidden" in rest
    assert _record(proxy) == [
        ("localhost", "GET", True, False),
        ("localhost", "HEAD", True, False),
        ("localhost", "DELETE", True, False),
        ("evil.example", "GET", False, False),
    ]

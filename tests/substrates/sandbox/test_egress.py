"""The egress proxy: a real HTTP server on the host's loopback, a real sandbox, and the
allow-list, credential injection and connection record in between."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lodger.substrates.sandbox import BubblewrapSandbox, Limits, NetworkPolicy

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}

PROBE = """
import socket, sys, urllib.request
port = int(sys.argv[1])
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            print('GOT', url, r.status, r.read().decode())
    except Exception as e:
        print('FAILED', url, e)
get(f'http://localhost:{port}/hello')
get(f'http://127.0.0.1:{port}/by-ip')
get('https://example.org/')
try:
    socket.create_connection(('127.0.0.1', port), timeout=3); print('DIRECT')
except OSError as e:
    print('no direct route', e)
"""


async def test_allowed_domains_pass_with_credentials_and_everything_else_is_refused(
    tmp_path: Path,
) -> None:
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    policy = NetworkPolicy(
        allow=("localhost",), credentials={"localhost": {"Authorization": "Bearer s3cret"}}
    )
    async with server:
        result = await BubblewrapSandbox().run(
            ["python3", "-c", PROBE, str(port)],
            workspace=tmp_path,
            env={**ENV, "PROBE": "1"},
            limits=Limits(wall_time_s=60),
            network=policy,
        )
    out = result.output.decode()
    assert result.exit_code == 0, out
    assert f"GOT http://localhost:{port}/hello 200 hello" in out
    assert f"FAILED http://127.0.0.1:{port}/by-ip" in out
    assert "FAILED https://example.org/" in out
    assert "no direct route" in out and "DIRECT\n" not in out
    assert "s3cret" not in out
    # The host server saw exactly one request, with the credential added by the proxy.
    assert len(seen) == 1
    assert seen[0].startswith(b"GET /hello HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer s3cret\r\n" in seen[0]
    record = [(c.host, c.method, c.allowed, c.credentials_injected) for c in result.connections]
    assert record == [
        ("localhost", "GET", True, True),
        ("127.0.0.1", "GET", False, False),
        ("example.org", "CONNECT", False, False),
    ]


def test_the_allow_list_matches_domains_not_addresses() -> None:
    policy = NetworkPolicy(allow=("*.example.com", "pypi.org"))
    assert policy.allows("files.example.com") and policy.allows("PyPI.org.")
    assert not policy.allows("example.com.evil.net")
    assert not policy.allows("pypi.org.evil.net")
    assert not NetworkPolicy(allow=("*",)).allows("127.0.0.1")
    assert not NetworkPolicy().enabled

"""Audit of the sandboxes: attacks the other sandbox tests do not try.

Each test is a real attack on a real backend, egress proxy or policy parser; the defects
this audit fixed each have one here (named in the test's docstring), next to attacks that
held and that no other test covered.
"""

from __future__ import annotations

import asyncio
import math
import os

import pytest

from lodger.errors import ConfigError
from lodger.sandbox import EgressProxy, Limits, NetworkPolicy, policy_from_config
from lodger.sandbox.egress import MAX_CONNECTIONS

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}


async def _upstream(seen: list[bytes]) -> asyncio.Server:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def _ask(proxy: EgressProxy, request: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return answer


async def test_plain_http_credentials_go_to_the_requested_host_not_a_forged_host_header() -> None:
    """Broke: a plain-HTTP request for an allowed domain kept the sandbox's own ``Host``
    header, so the proxy added the domain's credentials to a request a shared front end
    (a CDN, a virtual-host server) routes to whatever host the sandbox named."""
    seen: list[bytes] = []
    server = await _upstream(seen)
    port = server.sockets[0].getsockname()[1]
    policy = NetworkPolicy(
        allow=("localhost",), credentials={"localhost": {"Authorization": "Bearer s3cret"}}
    )
    async with server, EgressProxy(policy) as proxy:
        answer = await _ask(
            proxy,
            f"GET http://localhost:{port}/x HTTP/1.1\r\nHost: evil.example\r\n"
            "host: evil2.example\r\nHost : evil3.example\r\n\r\n".encode(),
        )
    assert answer.endswith(b"ok"), answer
    assert len(seen) == 1
    lines = seen[0].decode().lower().split("\r\n")
    assert f"host: localhost:{port}" in lines, seen[0]
    assert not any("evil" in line for line in lines), seen[0]
    assert "authorization: bearer s3cret" in lines


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_flood_of_idle_proxy_connections_cannot_exhaust_lodgers_descriptors() -> None:
    """Broke: every connection the sandbox opened to the egress socket held a descriptor
    (and a task) in lodger's own process until the command ended; a few thousand idle
    ones took lodger to its RLIMIT_NOFILE, and its log and database with it. Past
    ``MAX_CONNECTIONS`` at once a connection is now refused at once, and recorded."""
    policy = NetworkPolicy(allow=("localhost",))
    flood = MAX_CONNECTIONS + 100
    async with EgressProxy(policy) as proxy:
        before = _open_fds()
        clients = [await asyncio.open_unix_connection(str(proxy.socket_path)) for _ in range(flood)]
        try:
            # The refused ones are answered and closed by the proxy: read each to its end.
            refused = 0
            for reader, _ in clients[MAX_CONNECTIONS:]:
                answer = await asyncio.wait_for(reader.read(), 10)
                refused += answer.startswith(b"HTTP/1.1 503")
            held = _open_fds() - before - flood  # the proxy's side, in this process
        finally:
            for _, writer in clients:
                writer.close()
        assert refused == 100
        assert held <= MAX_CONNECTIONS + 8, held
        busy = [c for c in proxy.connections if not c.allowed]
        assert len(busy) == 100 and "too many" in busy[0].reason
        # Once the idle ones are gone the proxy serves again.
        for _ in range(200):
            if len(proxy.connections) == 100 and _open_fds() <= before + 8:
                break
            await asyncio.sleep(0.01)
        again = await _ask(proxy, b"GET http://not-allowed.example/ HTTP/1.1\r\n\r\n")
        assert again.startswith(b"HTTP/1.1 403"), again


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("wall_time_s", math.nan),
        ("cpu_time_s", math.nan),
        ("cpu_rate", math.nan),
        ("memory_mb", math.nan),
        ("output_mb", math.nan),
        ("memory_mb", math.inf),
        ("max_processes", math.inf),
        ("cpu_time_s", math.inf),
        ("max_processes", 0.5),
        ("memory_mb", -math.inf),
    ],
)
def test_a_limit_that_is_not_a_finite_positive_number_is_a_config_error(
    key: str, value: float
) -> None:
    """Broke: ``cpu_time_s = nan`` in lodger.toml (TOML has nan and inf) was accepted and
    never ran out (NaN compares false), ``wall_time_s = nan`` likewise, and ``memory_mb =
    nan`` or ``max_processes = inf`` crashed with a bare ValueError/OverflowError."""
    with pytest.raises(ConfigError, match=key):
        policy_from_config({key: value})


def test_limits_built_in_code_refuse_nan_and_fractions_too() -> None:
    with pytest.raises(ConfigError, match="cpu_time_s"):
        Limits(cpu_time_s=math.nan)
    with pytest.raises(ConfigError, match="max_processes"):
        Limits(max_processes=2.5)  # type: ignore[arg-type]
    # A fractional size in MiB is still a whole number of bytes.
    assert policy_from_config({"memory_mb": 0.5}).limits.memory_bytes == 512 * 1024

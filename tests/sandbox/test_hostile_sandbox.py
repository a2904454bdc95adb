"""Audit of the sandboxes: attacks the other sandbox tests do not try.

Each test is a real attack on a real backend, egress proxy or policy parser; the defects
this audit fixed each have one here (named in the test's docstring), next to attacks that
held and that no other test covered.
"""

from __future__ import annotations

import asyncio
import math
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lodger.errors import ConfigError
from lodger.sandbox import EgressProxy, Limits, NetworkPolicy, Sandbox, policy_from_config
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


@pytest.fixture
def private_etc_file() -> Iterator[Path]:
    """A file under /etc only its owner may read (as TLS keys, VPN and Wi-Fi configs are)
    and a directory only its owner may enter, each holding a token."""
    if not os.access("/etc", os.W_OK):
        pytest.skip("needs write access to /etc to plant a private file there")
    token = uuid.uuid4().hex[:8]
    secret = Path(f"/etc/lodger-audit-{token}.key")
    folder = Path(f"/etc/lodger-audit-{token}.d")
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, f"private-key-{token}\n".encode())
    os.close(fd)
    folder.mkdir(mode=0o700)
    (folder / "inner.conf").write_text(f"inner-secret-{token}\n")
    (folder / "inner.conf").chmod(0o644)  # readable, but its directory is not
    try:
        yield secret
    finally:
        secret.unlink()
        (folder / "inner.conf").unlink()
        folder.rmdir()


async def test_private_files_under_etc_are_covered(
    box: Sandbox, tmp_path: Path, private_etc_file: Path
) -> None:
    """Broke: only a fixed list (/etc/shadow, /etc/ssh...) was masked in the read-only
    /etc. Running as root (containers, CI) the sandbox's uid owns every root file, so a
    command read /etc/ssl/private keys, /etc/wireguard configs and the like. Now every
    entry under /etc that others may not read (or, a directory, enter) is covered."""
    folder = private_etc_file.with_suffix(".d")
    result = await box.run(
        ["bash", "-c", f"cat {private_etc_file}; cat {folder}/inner.conf; ls {folder}; echo DONE"],
        workspace=tmp_path,
        env=ENV,
        limits=Limits(wall_time_s=60),
    )
    lines = result.output.decode(errors="replace").splitlines()
    assert lines[-1:] == ["DONE"], lines
    assert not any(line.startswith(("private-key-", "inner-secret-")) for line in lines), lines
    assert "inner.conf" not in lines, lines  # what ls would list
    # The rest of /etc is still there: a command needs its passwd, hosts, certificates.
    check = await box.run(
        ["bash", "-c", "head -c 5 /etc/passwd; test -r /etc/ssl/certs/ca-certificates.crt"],
        workspace=tmp_path,
        env=ENV,
        limits=Limits(wall_time_s=60),
    )
    assert check.exit_code == 0 and check.output.startswith(b"root:"), check

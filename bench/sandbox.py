"""What a sandbox costs: starting a command in it, and a request through the egress proxy.

Start-up: ``true`` and ``python3 -c pass`` run bare (the same process runner, unconfined:
lodger's ``HostSandbox`` with the same limits and cgroup) and in bubblewrap and gVisor,
interleaved in the same run; the result is the extra p50 milliseconds per start and the
ratio sandboxed / bare (target: bubblewrap adds <= 10 ms p50). Egress: a GET to an HTTP
server on the host's loopback, direct (from this process) against through the proxy
from inside a bubblewrap sandbox (one sandbox does all the requests, so its start is not
counted). HTTPS through the proxy: a GET over a fresh TLS connection to an HTTPS server
on loopback, direct from this process against, from inside the sandbox, tunnelled
(CONNECT, TLS end to end) and terminated (the proxy ends TLS with the lodger CA, adds a
credential header and opens its own TLS upstream: two handshakes per request). The last
line of output is one JSON object.

Example:
    .venv/bin/python bench/sandbox.py --quick
    .venv/bin/python bench/sandbox.py --rounds 50
    .venv/bin/python bench/sandbox.py --quick --workspace /path/to/project
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import tempfile
import time
from pathlib import Path

from lodger.substrates.sandbox import (
    BubblewrapSandbox,
    HostSandbox,
    Limits,
    NetworkPolicy,
    RunscSandbox,
    Sandbox,
)

TARGET_EXTRA_MS = 10.0
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
LIMITS = Limits(wall_time_s=60)

CLIENT = """
import http.client, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
times = []
for _ in range(n):
    t = time.perf_counter()
    c = http.client.HTTPConnection('127.0.0.1', 3128, timeout=10)
    c.request('GET', f'http://localhost:{port}/')
    c.getresponse().read()
    c.close()
    times.append(time.perf_counter() - t)
times.sort()
print(times[len(times) // 2] * 1000)
"""


TLS_CLIENT = """
import http.client, ssl, sys, time
port, n, cafile = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
context = ssl.create_default_context(cafile=cafile or None)
times = []
for _ in range(n):
    t = time.perf_counter()
    c = http.client.HTTPSConnection('127.0.0.1', 3128, timeout=10, context=context)
    c.set_tunnel('localhost', port)
    c.request('GET', '/')
    c.getresponse().read()
    c.close()
    times.append(time.perf_counter() - t)
times.sort()
print(times[len(times) // 2] * 1000)
"""


async def start_ms(box: Sandbox, argv: list[str], ws: Path) -> float:
    started = time.perf_counter()
    result = await box.run(argv, workspace=ws, env=ENV, limits=LIMITS)
    elapsed = (time.perf_counter() - started) * 1000
    assert result.exit_code == 0, result
    return elapsed


async def startup(rounds: int, ws: Path) -> dict[str, dict[str, float]]:
    boxes: dict[str, Sandbox] = {
        "bare": HostSandbox(),
        "bubblewrap": BubblewrapSandbox(),
        "runsc": RunscSandbox(),
    }
    available = {k: b for k, b in boxes.items() if b.unavailable() is None}
    commands = {"true": ["true"], "python": ["python3", "-c", "pass"]}
    samples: dict[str, dict[str, list[float]]] = {c: {k: [] for k in available} for c in commands}
    for _ in range(rounds):  # interleaved, so load drifts hit every series alike
        for cname, argv in commands.items():
            for bname, box in available.items():
                samples[cname][bname].append(await start_ms(box, argv, ws))
    out: dict[str, dict[str, float]] = {}
    for cname, series in samples.items():
        bare = statistics.median(series["bare"])
        for bname, values in series.items():
            p50 = statistics.median(values)
            out[f"{cname}/{bname}"] = {
                "p50_ms": round(p50, 2),
                "extra_p50_ms": round(p50 - bare, 2),
                "ratio": round(p50 / bare, 2),
            }
    return out


async def egress(requests: int, ws: Path) -> dict[str, float]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        direct = []
        for _ in range(requests):
            started = time.perf_counter()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET / HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode())
            await writer.drain()
            await reader.read()
            writer.close()
            direct.append((time.perf_counter() - started) * 1000)
        result = await BubblewrapSandbox().run(
            ["python3", "-c", CLIENT, str(port), str(requests)],
            workspace=ws,
            env=ENV,
            limits=LIMITS,
            network=NetworkPolicy(allow=("localhost",)),
        )
    assert result.exit_code == 0, result.output
    proxied = float(result.output.decode().split()[-1])
    bare = statistics.median(direct)
    return {
        "direct_p50_ms": round(bare, 3),
        "proxied_p50_ms": round(proxied, 3),
        "extra_p50_ms": round(proxied - bare, 3),
        "ratio": round(proxied / bare, 2),
    }


async def egress_tls(requests: int, ws: Path) -> dict[str, float]:
    from lodger.substrates.sandbox.tls import LodgerCA

    upstream_ca = LodgerCA(("localhost",))  # the upstream's own CA, not the proxy's
    (ws / "upstream-ca.pem").write_bytes(upstream_ca.certificate_pem)
    context = upstream_ca.server_context("localhost")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cafile=str(ws / "upstream-ca.pem"))
    out: dict[str, float] = {}
    async with server:
        direct = []
        for _ in range(requests):
            started = time.perf_counter()
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client, server_hostname="localhost"
            )
            writer.write(f"GET / HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode())
            await writer.drain()
            await reader.read()
            writer.close()
            direct.append((time.perf_counter() - started) * 1000)
        out["direct_p50_ms"] = round(statistics.median(direct), 3)
        policies = {
            "tunnelled": (NetworkPolicy(allow=("localhost",)), str(ws / "upstream-ca.pem")),
            "terminated": (
                NetworkPolicy(
                    allow=("localhost",),
                    credentials={"localhost": {"Authorization": "Bearer bench"}},
                    terminate_tls=("localhost",),
                    upstream_ca=ws / "upstream-ca.pem",
                ),
                "",  # the sandbox's default trust: the lodger CA bundle
            ),
        }
        for name, (policy, cafile) in policies.items():
            result = await BubblewrapSandbox().run(
                ["python3", "-c", TLS_CLIENT, str(port), str(requests), cafile],
                workspace=ws,
                env=ENV,
                limits=LIMITS,
                network=policy,
            )
            assert result.exit_code == 0, result.output
            p50 = float(result.output.decode().split()[-1])
            out[f"{name}_p50_ms"] = round(p50, 3)
            out[f"{name}_ratio"] = round(p50 / out["direct_p50_ms"], 2)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="starts per series")
    parser.add_argument("--requests", type=int, default=200, help="egress requests")
    parser.add_argument("--quick", action="store_true", help="few rounds, for a smoke run")
    parser.add_argument(
        "--workspace",
        type=Path,
        help="start the commands in this directory (a real project: the disk limit's "
        "watcher walks it once, before the first start) instead of an empty one",
    )
    args = parser.parse_args()
    rounds, requests = (5, 30) if args.quick else (args.rounds, args.requests)
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        starts = await startup(rounds, args.workspace or ws)
        proxy = await egress(requests, ws)
        https = await egress_tls(requests, ws)
    for name, row in starts.items():
        print(
            f"{name:20} p50 {row['p50_ms']:8.2f} ms  +{row['extra_p50_ms']:7.2f} ms  "
            f"x{row['ratio']:.2f}"
        )
    print(
        f"egress GET: direct p50 {proxy['direct_p50_ms']:.3f} ms, through the proxy "
        f"{proxy['proxied_p50_ms']:.3f} ms (x{proxy['ratio']:.2f})"
    )
    print(
        f"egress HTTPS GET: direct p50 {https['direct_p50_ms']:.3f} ms, tunnelled "
        f"{https['tunnelled_p50_ms']:.3f} ms (x{https['tunnelled_ratio']:.2f}), TLS "
        f"terminated {https['terminated_p50_ms']:.3f} ms (x{https['terminated_ratio']:.2f})"
    )
    bwrap_extra = starts.get("true/bubblewrap", {}).get("extra_p50_ms")
    summary = {
        "bench": "sandbox",
        "rounds": rounds,
        "startup": starts,
        "egress": proxy,
        "egress_https": https,
        "bubblewrap_extra_p50_ms": bwrap_extra,
        "target_extra_ms": TARGET_EXTRA_MS,
        "within_target": bwrap_extra is not None and bwrap_extra <= TARGET_EXTRA_MS,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    asyncio.run(main())

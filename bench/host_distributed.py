"""The host in distributed mode: a send over HTTP to the turn's end on the stream.

For N fresh sessions, one at a time: create the session, open its SSE stream, send a
message (a one-call scripted turn), and time from the send request to (a) the stream's
first fact (``turn_started``, committed by the worker) and (b) ``turn_ended``. The
distributed host (PostgreSQL control plane on loopback, ``file://`` store, one real
``lodger worker`` subprocess with ``--poll 0.05``, the host polling the log every 0.25 s,
the ``lodger serve`` default) is measured against the embedded host (turns run in the
host's process on a SQLite state directory) in the same run, same script.

Numbers are from a shared, loaded 2-core machine: read the ratios, not the absolute times.

    python bench/host_distributed.py [--quick]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn

from lodger import tool
from lodger.client import HostClient
from lodger.host import HostConfig, SqliteHostControl, create_app
from lodger.host.auth import new_token
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage
from lodger.storage.control import ControlPlane, open_control
from lodger.testing.postgres import PostgresServer

SRC = Path(__file__).resolve().parents[1] / "src"
TOOLS = '''from lodger import tool


@tool
def echo(text: str) -> str:
    """Return the text."""
    return text
'''


@tool
def echo(text: str) -> str:
    """Return the text."""
    return text


@asynccontextmanager
async def serving(
    storage: Storage, index: Path, model: str, plane: ControlPlane | None
) -> AsyncIterator[HostClient]:
    control = SqliteHostControl(index)
    sessions = Sessions(storage)
    token = new_token()
    await control.add_token(token, scope="admin", session_id=None, label="bench")
    app = create_app(
        sessions,
        control,
        HostConfig(models=(model,), tools=(echo,)),
        plane=plane,
        poll_s=0.25 if plane is not None else 1.0,
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for it
            await asyncio.sleep(0.01)
        async with HostClient(f"http://127.0.0.1:{sock.getsockname()[1]}", token=token) as c:
            yield c
    finally:
        server.should_exit = True
        await task
        sock.close()
        await sessions.close()
        await control.close()


async def measure(client: HostClient, n: int) -> tuple[list[float], list[float]]:
    first: list[float] = []
    ended: list[float] = []
    for i in range(n):
        sid = await client.create_session(session_id=f"b{i}")
        seen = asyncio.Event()
        marks: dict[str, float] = {}

        async def follow(
            sid: str = sid, marks: dict[str, float] = marks, seen: asyncio.Event = seen
        ) -> None:
            seen.set()
            async for fact in client.stream(sid):
                marks.setdefault("first", time.perf_counter())
                if fact.kind == "turn_ended":
                    marks["ended"] = time.perf_counter()
                    return

        follower = asyncio.create_task(follow())
        await seen.wait()
        await asyncio.sleep(0.05)  # the stream's request is on its way before the send
        start = time.perf_counter()
        await client.send(sid, "go", key="k")
        await asyncio.wait_for(follower, 60)
        first.append((marks["first"] - start) * 1000)
        ended.append((marks["ended"] - start) * 1000)
    return first, ended


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sessions")
    args = parser.parse_args()
    n = 8 if args.quick else 40
    root = Path(tempfile.mkdtemp(prefix="lodger-bench-hostd-"))
    script = root / "script.json"
    script.write_text(json.dumps([{"calls": [{"name": "echo", "args": {"text": "x"}}]},
                                  {"text": "done"}]))  # fmt: skip
    model = f"script:{script}"
    (root / "tools.py").write_text(TOOLS)

    embedded = Storage.local(root / "state")
    async with serving(embedded, root / "state" / "host.sqlite3", model, None) as client:
        base_first, base_ended = await measure(client, n)

    postgres = PostgresServer()
    postgres.init()
    worker: subprocess.Popen[bytes] | None = None
    try:
        dsn = postgres.new_database()
        store = f"file://{root / 'objects'}"
        plane = open_control(dsn)
        await plane.start()
        env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        worker = await asyncio.to_thread(
            subprocess.Popen,
            [sys.executable, "-m", "lodger", "worker", "--store", store, "--control", dsn,
             "--tools", str(root / "tools.py"), "--poll", "0.05", "--workdir", str(root)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        storage = Storage.from_url(store)
        try:
            async with serving(storage, root / "host.sqlite3", model, plane) as client:
                dist_first, dist_ended = await measure(client, n)
        finally:
            await plane.close()
    finally:
        if worker is not None:
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait()
        postgres.destroy()
        shutil.rmtree(root, ignore_errors=True)

    rows: list[tuple[str, list[float]]] = [
        ("embedded: send -> first fact", base_first),
        ("embedded: send -> turn_ended", base_ended),
        ("distributed: send -> first fact", dist_first),
        ("distributed: send -> turn_ended", dist_ended),
    ]
    print(f"{n} one-call turns, each on a fresh session (ms; shared, loaded 2-core machine)")
    print(f"{'measure':36} {'p50':>8} {'p99':>8} {'mean':>8}")
    for name, values in rows:
        print(f"{name:36} {pct(values, 0.5):8.1f} {pct(values, 0.99):8.1f} "
              f"{statistics.mean(values):8.1f}")  # fmt: skip
    out: dict[str, Any] = {
        "bench": "host_distributed",
        "sessions": n,
        "embedded_first_p50_ms": pct(base_first, 0.5),
        "embedded_ended_p50_ms": pct(base_ended, 0.5),
        "distributed_first_p50_ms": pct(dist_first, 0.5),
        "distributed_first_p99_ms": pct(dist_first, 0.99),
        "distributed_ended_p50_ms": pct(dist_ended, 0.5),
        "distributed_ended_p99_ms": pct(dist_ended, 0.99),
        "ratio_first_p50": pct(dist_first, 0.5) / pct(base_first, 0.5),
        "ratio_ended_p50": pct(dist_ended, 0.5) / pct(base_ended, 0.5),
    }
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    asyncio.run(main())

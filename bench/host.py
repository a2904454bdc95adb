"""The HTTP host: event fan-out latency, request throughput, hosted tool-call overhead.

Every figure comes with a baseline measured in the same run:

- fan-out latency, commit -> SSE client (p50/p99), with 1 and with 50 streams on one
  session: from the moment the host's journal reports a fact committed (an observer in
  the host's process) to the moment a client in another thread parsed it off the stream.
  Baseline: the same session's 1-stream figure (the 50-stream ratio says what fan-out
  costs);
- request throughput (requests/s, 8 concurrent clients) for send (queue a message with an
  idempotency key) and show (read and verify a session's log, fold it): against a
  one-line JSON endpoint served by the same uvicorn in the same way (the HTTP floor);
- hosted tool call: a turn of K echo calls sent over HTTP and followed on the stream to
  its end, per call, against the same turn run in-process with ``Sessions.run`` on the
  same kind of store (SQLite in a temporary directory).

The host runs in its own thread and event loop; clients run in the main one. Numbers are
from a shared, loaded 2-core machine: read the ratios, not the absolute times.

    python bench/host.py [--quick]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from lodger import ScriptedModel, tool
from lodger.client import HostClient
from lodger.events import Event
from lodger.host import HostConfig, SqliteHostControl, create_app
from lodger.host.auth import new_token
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage


@tool
def echo(text: str) -> str:
    """Return the text."""
    return text


def _script(calls: int) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {"calls": [{"name": "echo", "args": {"text": f"n{i}"}}]} for i in range(calls)
    ]
    return [*steps, {"text": "done"}]


class _Served:
    """An ASGI app on a loopback socket, in a thread with its own event loop."""

    def __init__(self, make_app: Callable[[], Any], cleanup: Callable[[], Any] | None = None):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._make_app, self._cleanup = make_app, cleanup
        self._ready, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        server = uvicorn.Server(
            uvicorn.Config(self._make_app(), log_level="critical", lifespan="on")
        )
        task = asyncio.create_task(server.serve(sockets=[self.sock]))
        while not server.started and not task.done():  # noqa: ASYNC110 - uvicorn has no event
            await asyncio.sleep(0.01)
        self._ready.set()
        await asyncio.to_thread(self._stop.wait)
        server.should_exit = True
        await task
        if self._cleanup is not None:
            await self._cleanup()

    def __enter__(self) -> _Served:
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.sock.close()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _host(
    state: Path, models: tuple[str, ...], committed: dict[tuple[str, int], float]
) -> tuple[Any, str]:
    token = new_token()
    holder: dict[str, Any] = {}

    def observe(event: Event) -> None:
        committed[(event.session_id, event.offset)] = time.perf_counter()

    def make() -> Any:
        control = SqliteHostControl(state / "host.sqlite3")
        sessions = Sessions(Storage.local(state))
        holder.update(control=control, sessions=sessions)

        async def started(hub: Any) -> None:
            await control.add_token(token, scope="admin", session_id=None, label="bench")

        return create_app(
            sessions,
            control,
            HostConfig(models=models, tools=(echo,)),
            observers=(observe,),
            on_started=started,
        )

    async def cleanup() -> None:
        await holder["sessions"].close()
        await holder["control"].close()

    return _Served(make, cleanup), token


async def _fanout(url: str, token: str, streams: int, calls: int, committed: dict) -> list[float]:
    clients = [HostClient(url, token=token) for _ in range(min(streams, 10))]
    try:
        sid = await clients[0].create_session()
        received: list[list[tuple[int, float]]] = [[] for _ in range(streams)]
        opened = asyncio.Event()
        open_count = 0

        async def follow(i: int) -> None:
            nonlocal open_count
            async with clients[i % len(clients)]._http.stream(
                "GET", f"/v1/sessions/{sid}/stream"
            ) as response:
                open_count += 1
                if open_count == streams:
                    opened.set()
                async for line in response.aiter_lines():
                    if line.startswith("id: "):
                        received[i].append((int(line[4:]), time.perf_counter()))
                    elif line.startswith("event: turn_ended"):
                        return

        tasks = [asyncio.create_task(follow(i)) for i in range(streams)]
        await asyncio.wait_for(opened.wait(), 60)
        await clients[0].send(sid, "go", key="fanout")
        await asyncio.wait_for(asyncio.gather(*tasks), 300)
        return [
            (at - committed[(sid, offset)]) * 1000
            for per in received
            for offset, at in per
            if (sid, offset) in committed
        ]
    finally:
        for c in clients:
            await c.aclose()


async def _throughput(url: str, token: str, requests: int, make: Callable[[int], Any]) -> float:
    async with httpx2.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {token}"}
    ) as http:
        queue = list(range(requests))

        async def worker() -> None:
            while queue:
                i = queue.pop()
                response = await make(i)(http)
                assert response.status_code < 300, response.text

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(8)))
        return requests / (time.perf_counter() - start)


async def _hosted_turn(url: str, token: str, calls: int, repeats: int) -> float:
    """Median per-call time of ``repeats`` turns, each a send followed on the stream."""
    times = []
    async with HostClient(url, token=token) as c:
        for r in range(repeats):
            sid = await c.create_session()
            start = time.perf_counter()
            await c.send(sid, "go", key=f"hosted-{r}")
            async for fact in c.stream(sid):
                if fact.kind == "turn_ended":
                    break
            times.append((time.perf_counter() - start) / calls * 1000)
    return statistics.median(times)


async def _in_process_turn(
    state: Path, script: list[dict[str, Any]], calls: int, repeats: int
) -> float:
    """The same turns in-process on a warmed ``Sessions`` (a first turn warms it)."""
    times = []
    async with Sessions(Storage.local(state)) as sessions:
        for r in range(repeats + 1):
            start = time.perf_counter()
            result = await sessions.run(
                "go", binding=Binding(model=ScriptedModel(script), tools=[echo])
            )
            assert result.status == "completed"
            if r:
                times.append((time.perf_counter() - start) / calls * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and requests")
    args = parser.parse_args()
    calls = 10 if args.quick else 40
    requests = 150 if args.quick else 600
    root = Path(tempfile.mkdtemp(prefix="lodger-bench-host-"))
    script = _script(calls)
    model_path = root / "script.json"
    model_path.write_text(json.dumps(script))
    committed: dict[tuple[str, int], float] = {}
    rows: list[tuple[str, str, str]] = []
    out: dict[str, Any] = {"quick": args.quick, "calls": calls, "requests": requests}

    async def run_host(url: str, token: str) -> None:
        one = await _fanout(url, token, 1, calls, committed)
        fifty = await _fanout(url, token, 50, calls, committed)
        out["fanout_1_p50_ms"], out["fanout_1_p99_ms"] = _pct(one, 0.5), _pct(one, 0.99)
        out["fanout_50_p50_ms"], out["fanout_50_p99_ms"] = _pct(fifty, 0.5), _pct(fifty, 0.99)
        out["fanout_50_vs_1_p50"] = out["fanout_50_p50_ms"] / max(out["fanout_1_p50_ms"], 1e-9)
        async with HostClient(url, token=token) as c:
            shown = await c.create_session()
            sent = await c.send(shown, "warm", key="warm")
            await c.wait_message(shown, sent["message"]["id"], within=120)
            targets = [await c.create_session(model=ping_model) for _ in range(8)]
        out["send_rps"] = await _throughput(
            url,
            token,
            requests,
            lambda i: (
                lambda http: http.post(
                    f"/v1/sessions/{targets[i % 8]}/messages",
                    json={"text": "hi", "idempotency_key": f"k{i}"},
                )
            ),
        )
        async with HostClient(url, token=token) as c:  # let the queued turns settle first
            for target in targets:
                while True:
                    shown_now = await c.show(target)
                    if shown_now["turns"] >= requests // 8 and not shown_now["running"]:
                        break
                    await asyncio.sleep(0.1)
        out["show_rps"] = await _throughput(
            url, token, requests, lambda i: lambda http: http.get(f"/v1/sessions/{shown}")
        )
        out["hosted_call_ms"] = await _hosted_turn(url, token, calls, 3)

    ping_path = root / "ping.json"
    ping_path.write_text(json.dumps([{"text": "ok"}]))
    ping_model = f"script:{ping_path}"
    served, token = _host(root / "state", (f"script:{model_path}", ping_model), committed)
    with served:
        asyncio.run(run_host(served.url, token))

    floor_app = Starlette(routes=[Route("/ping", lambda request: JSONResponse({"ok": True}))])
    with _Served(lambda: floor_app) as floor:
        out["floor_rps"] = asyncio.run(
            _throughput(floor.url, "none", requests, lambda i: lambda http: http.get("/ping"))
        )
    out["in_process_call_ms"] = asyncio.run(_in_process_turn(root / "inproc", script, calls, 3))
    out["send_vs_floor"] = out["send_rps"] / out["floor_rps"]
    out["show_vs_floor"] = out["show_rps"] / out["floor_rps"]
    out["hosted_vs_in_process"] = out["hosted_call_ms"] / out["in_process_call_ms"]

    rows = [
        (
            "fan-out commit->client, 1 stream",
            f"p50 {out['fanout_1_p50_ms']:.2f} ms",
            f"p99 {out['fanout_1_p99_ms']:.2f} ms",
        ),
        (
            "fan-out commit->client, 50 streams",
            f"p50 {out['fanout_50_p50_ms']:.2f} ms",
            f"p99 {out['fanout_50_p99_ms']:.2f} ms",
        ),
        ("  50 vs 1 stream (p50)", f"{out['fanout_50_vs_1_p50']:.2f}x", ""),
        (
            "send (POST messages)",
            f"{out['send_rps']:.0f} req/s",
            f"{out['send_vs_floor']:.2f}x floor",
        ),
        (
            "show (GET session)",
            f"{out['show_rps']:.0f} req/s",
            f"{out['show_vs_floor']:.2f}x floor",
        ),
        ("HTTP floor (one-line JSON)", f"{out['floor_rps']:.0f} req/s", "1.00x"),
        (
            "tool call, hosted (per call)",
            f"{out['hosted_call_ms']:.2f} ms",
            f"{out['hosted_vs_in_process']:.2f}x in-process",
        ),
        ("tool call, in-process (per call)", f"{out['in_process_call_ms']:.2f} ms", "1.00x"),
    ]
    width = max(len(r[0]) for r in rows)
    print(
        f"lodger host benchmark ({'quick' if args.quick else 'full'}; {calls} calls/turn, "
        f"{requests} requests; shared 2-core machine under load)"
    )
    for name, a, b in rows:
        print(f"{name:<{width}}  {a:>18}  {b}")
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

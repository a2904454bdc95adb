"""How long starting a sandboxed command holds the event loop, with a large heap.

A confined command is started through a ``/bin/sh`` trampoline that joins the cgroup and
sets the rlimits itself (``lodger.substrates.sandbox._process``), so Python can ``vfork``; the
baseline, measured in the same process and run, is the way it was started before: the
same command line with a ``preexec_fn``, which makes Python ``fork`` and copy the page
tables of the whole process while the loop waits. The loop's longest stall is measured by
a 1 ms ticker while five commands start and finish, after touching ``--heap-gb`` of heap.

    python bench/spawn_lag.py [--quick] [--heap-gb N]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from lodger.substrates.sandbox.host import HostSandbox
from lodger.substrates.sandbox.policy import Limits


async def _longest_stall(start: Callable[[], Awaitable[None]], times: int) -> float:
    """The loop's longest stall (seconds) while ``start`` runs ``times`` times."""
    lags: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            lags.append(now - last - 0.001)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)
    for _ in range(times):
        await start()
    done.set()
    await ticker
    return max(lags)


async def run(times: int) -> dict[str, float]:
    box = HostSandbox()
    workspace = Path(tempfile.mkdtemp(prefix="lodger-spawn-"))

    async def confined() -> None:
        result = await box.run(
            ["/bin/true"], workspace=workspace, env={"PATH": "/usr/bin:/bin"}, limits=Limits()
        )
        assert result.exit_code == 0, result

    async def forked() -> None:  # the old way: a preexec_fn forces a fork
        process = await asyncio.create_subprocess_exec(
            "/bin/true", start_new_session=True, preexec_fn=lambda: None
        )
        await process.wait()

    return {
        "trampoline_ms": await _longest_stall(confined, times) * 1e3,
        "preexec_fork_ms": await _longest_stall(forked, times) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--heap-gb", type=float, default=None, help="heap touched first")
    args = parser.parse_args()
    heap_gb = args.heap_gb if args.heap_gb is not None else (1.0 if args.quick else 2.0)
    heap = bytearray(int(heap_gb * 1024**3))
    for i in range(0, len(heap), 4096):  # touched, so its pages are mapped
        heap[i] = 1
    result = asyncio.run(run(3 if args.quick else 5))
    ratio = result["trampoline_ms"] / result["preexec_fork_ms"]
    print(f"heap {heap_gb:g} GB; longest event-loop stall while commands start:")
    print(f"  sandbox trampoline (vfork)   {result['trampoline_ms']:8.1f} ms")
    print(f"  preexec_fn (fork), baseline  {result['preexec_fork_ms']:8.1f} ms")
    print(f"  ratio                        {ratio:8.3f}x")
    print(json.dumps({"bench": "spawn_lag", "heap_gb": heap_gb, **result,
                      "ratio_vs_preexec_fork": round(ratio, 4),
                      "python": sys.version.split()[0]}))  # fmt: skip


if __name__ == "__main__":
    main()

"""Python cells in the Monty interpreter (pydantic-monty): a sandboxed Python subset.

Each cell is a fresh Monty session on a pooled worker process (state never crosses
cells), with a heap limit, a feed time limit, no filesystem or network (the sandbox has
no mounts and no OS handler: every file or process call is refused), the clock frozen at
2000-01-01, sleeps that return at once and a seeded ``random``. Nestable tools are async
functions named after the tools, taking keyword arguments::

    a, b = await asyncio.gather(read_file(path="a.json"), read_file(path="b.json"))
    {"a": a, "b": b}

The value of the last expression is the cell's result. Monty external functions are
plain names, so the ``tools.NAME`` spelling of JavaScript cells is not used here.
A tool's failure raises ``RuntimeError("<code>: <message>")`` inside the cell; only that
text crosses, never a host traceback.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Coroutine
from typing import Any

from lodger._core.extras import require
from lodger.substrates.codemode._host import CellHost
from lodger.substrates.codemode.limits import CellLimits
from lodger.substrates.codemode.substrate import CellOutcome, Diagnostic, LogBuffer

with require("codemode", "code mode in Python"):
    import pydantic_monty as monty

__all__ = ["PythonSubstrate"]

_EPOCH = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)


class PythonSubstrate:
    """Runs each cell in a new Monty session from a small pool of worker processes."""

    language = "python"

    def __init__(self, *, max_workers: int = 2) -> None:
        self._max_workers = max_workers
        self._pool: monty.AsyncMonty | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()

    async def _workers(self) -> monty.AsyncMonty:
        loop = asyncio.get_running_loop()
        if self._pool is not None and self._loop is loop:
            return self._pool
        pool = monty.AsyncMonty(min_processes=1, max_processes=self._max_workers)
        await pool.__aenter__()
        self._pool, self._loop = pool, loop
        return pool

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.__aexit__(None, None, None)

    async def run(self, source: str, host: CellHost, limits: CellLimits) -> CellOutcome:
        pool = await self._workers()
        logs = LogBuffer(limits.log_bytes)
        printed = _PrintedLines(logs)

        def on_print(stream: str, text: str) -> None:
            printed.feed(text)

        session = pool.checkout(
            script_name="cell.py",
            limits={
                "max_memory": limits.memory,
                "max_feed_duration_secs": limits.wall_time,
                "max_suspensions": limits.nested_calls + 64,
            },
            os_policy={"datetime": _EPOCH, "sleep": "zero", "random_start": {"seed": 0}},
        )
        try:
            async with session:
                value = await session.feed_run(
                    source,
                    external_lookup=self._functions(host),
                    print_callback=on_print,
                )
        except monty.MontySyntaxError as exc:
            return CellOutcome(
                diagnostic=Diagnostic(
                    kind="parse_error",
                    message=exc.display("type-msg"),
                    stack=exc.display("traceback"),
                ),
                logs=printed.lines(),
                logs_dropped=logs.dropped,
            )
        except monty.MontyRuntimeError as exc:
            inner = exc.exception()
            lines = printed.lines()
            if isinstance(inner, MemoryError):
                diagnostic = Diagnostic(
                    kind="limit_exceeded",
                    limit="memory",
                    message=f"the cell used more than {limits.memory} bytes of memory",
                )
            elif isinstance(inner, TimeoutError):
                diagnostic = Diagnostic(
                    kind="limit_exceeded",
                    limit="wall_time",
                    message=f"the cell ran longer than {limits.wall_time:g} s and was stopped",
                )
            else:
                diagnostic = Diagnostic(
                    kind="runtime_error",
                    message=exc.display("type-msg"),
                    stack=exc.display("traceback"),
                )
            return CellOutcome(diagnostic=diagnostic, logs=lines, logs_dropped=logs.dropped)
        except monty.MontyError as exc:
            return CellOutcome(
                diagnostic=Diagnostic(kind="runtime_error", message=type(exc).__name__),
                logs=printed.lines(),
                logs_dropped=logs.dropped,
            )
        finally:
            await host.settle(cancel=True)
        return CellOutcome(value=value, logs=printed.lines(), logs_dropped=logs.dropped)

    @staticmethod
    def _functions(host: CellHost) -> dict[str, Any]:
        def make(name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
            async def call(*args: Any, **kwargs: Any) -> Any:
                if args:
                    if len(args) != 1 or kwargs or not isinstance(args[0], dict):
                        raise TypeError(f"{name}() takes keyword arguments (or one dict)")
                    kwargs = dict(args[0])
                reply = await host.call(name, kwargs)
                if "ok" in reply:
                    return reply["ok"]
                error = reply["error"]
                raise RuntimeError(f"{error['code']}: {error['message']}")

            return call

        # Every bound tool name answers, so a non-nestable or unknown-but-bound name gets
        # the host's precise refusal rather than a NameError.
        return {name: make(name) for name in host.names()}


class _PrintedLines:
    """Printed text split into lines as it arrives, each kept or counted by ``logs``: a
    cell printing in a loop must not grow the host (only ``logs``' limit is held)."""

    def __init__(self, logs: LogBuffer) -> None:
        self._logs = logs
        self._partial = ""

    def _capped(self, line: str) -> str:
        # a line longer than the whole limit is dropped anyway; keep no more of it
        return line[: self._logs.limit + 1]

    def feed(self, text: str) -> None:
        *complete, rest = text.split("\n")
        for piece in complete:
            self._logs.add(self._capped(self._partial + piece))
            self._partial = ""
        self._partial = self._capped(self._partial + rest)

    def lines(self) -> tuple[str, ...]:
        if self._partial:
            self._logs.add(self._partial)
            self._partial = ""
        return tuple(self._logs.lines)

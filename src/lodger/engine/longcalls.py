"""Long-running calls: a tool answers ``Accepted(handle)`` and its result comes later.

The path of such a call (DESIGN sections 4, 5, 13): T1, execute (the handler starts the
remote work and returns ``Accepted``), ``call_accepted`` with the handle (committed
before the model sees anything), then the result from the tool's ``poll`` committed as
the call's T2, possibly in a later turn. ``wait="wait"`` polls with backoff until the
result comes (or the call's time limit passes: the model then reads that it runs);
``"continue"`` lets the turn go on at once. A running call is polled between steps
(``running_calls``), spaced out per call (``PollSpacing``: the first look at once, then
pauses doubling from half a second to half a minute, so a fast loop of steps does not
poll a slow job at every step), and recovery polls the handle after a crash: a ``wait``
call waits again with backoff (``wait_polls``), a ``continue`` one is polled once.
Nothing is run twice, and only a poll that cannot tell parks the call.

This module polls; committing facts is the pipeline's (``CallPipeline.accepted``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from lodger.context import running_note
from lodger.recovery.classify import CallState
from lodger.substrates.inprocess import failure_execution, result_execution
from lodger.tools.spec import CannotTell, Execution, StillRunning, Tool, ToolContext

__all__ = [
    "POLL_LIMIT",
    "PollSpacing",
    "Polled",
    "poll_once",
    "running_calls",
    "running_note",
    "wait_for_result",
    "wait_polls",
]

#: seconds one poll may take before it counts as "cannot tell"
POLL_LIMIT = 30.0
#: the backoff of a waiting call's polls: first pause, factor, longest pause (seconds)
_BACKOFF = (0.02, 2.0, 2.0)
#: the spacing of a running call's polls between steps: first pause, longest (seconds)
_SPACING = (0.5, 30.0)

Polled = Execution | StillRunning | CannotTell
"""What one poll of an accepted call's handle gave: its result, or that it runs, or
that the handle says nothing trustworthy."""


async def poll_once(tool: Tool, handle: dict[str, Any], ctx: ToolContext) -> Polled:
    """Query ``handle`` through the tool's poll once; never raises for the tool's faults."""
    if tool.poll is None:
        return CannotTell(reason=f"{tool.name} declares no poll for its accepted calls")
    try:
        async with asyncio.timeout(POLL_LIMIT):
            value = await tool.poll(dict(handle), ctx)
    except TimeoutError:
        return CannotTell(reason=f"the poll of {tool.name} took over {POLL_LIMIT:g} s")
    except Exception as exc:  # noqa: BLE001 - a failing poll proves nothing
        failed = failure_execution(tool.name, exc)
        return CannotTell(reason=f"the poll failed: {failed.content}")
    if isinstance(value, StillRunning | CannotTell):
        return value
    return result_execution(tool.name, value)


async def wait_for_result(
    tool: Tool,
    handle: dict[str, Any],
    ctx: ToolContext,
    *,
    time_limit: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Execution | None:
    """Poll with backoff until the result comes: it, or None once ``time_limit`` has
    passed with the call still running (or the poll unable to tell)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + time_limit
    pause, factor, longest = _BACKOFF
    while True:
        polled = await poll_once(tool, handle, ctx)
        if isinstance(polled, Execution):
            return polled
        left = deadline - loop.time()
        if left <= 0:
            return None
        await sleep(min(pause, left))
        pause = min(pause * factor, longest)


async def wait_polls(
    tool: Tool,
    handle: dict[str, Any],
    ctx: ToolContext,
    *,
    time_limit: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Polled:
    """Poll with backoff, as a ``wait`` call does, until the result comes or the poll
    cannot tell (returned at once: recovery parks on it), or ``StillRunning`` once
    ``time_limit`` has passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + time_limit
    pause, factor, longest = _BACKOFF
    while True:
        polled = await poll_once(tool, handle, ctx)
        left = deadline - loop.time()
        if not isinstance(polled, StillRunning) or left <= 0:
            return polled
        await sleep(min(pause, left))
        pause = min(pause * factor, longest)


class PollSpacing:
    """When each running call may be polled again between steps: at once the first
    time, then after pauses doubling from ``first`` to ``longest`` seconds."""

    def __init__(
        self,
        *,
        first: float | None = None,
        longest: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.first = _SPACING[0] if first is None else first
        self.longest = _SPACING[1] if longest is None else longest
        self._clock = clock
        self._next: dict[str, tuple[float, float]] = {}

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def due(self, call_id: str) -> bool:
        found = self._next.get(call_id)
        return found is None or self._now() >= found[0]

    def polled(self, call_id: str) -> None:
        """A poll of ``call_id`` said it still runs: the next one waits longer."""
        found = self._next.get(call_id)
        pause = self.first if found is None else min(found[1] * 2, self.longest)
        self._next[call_id] = (self._now() + pause, pause)


def running_calls(calls: Iterable[CallState]) -> list[CallState]:
    """Those of ``calls`` (the classifier's ``accepted_open``) still running."""
    return [c for c in calls if c.status()[0] == "running"]

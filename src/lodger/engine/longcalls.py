"""Long-running calls: a tool answers ``Accepted(handle)`` and its result comes later.

The path of such a call (DESIGN sections 4, 5, 13): T1, execute (the handler starts the
remote work and returns ``Accepted``), ``call_accepted`` with the handle (committed
before the model sees anything), then the result from the tool's ``poll`` committed as
the call's T2, possibly in a later turn. ``wait="wait"`` polls with backoff until the
result comes (or the call's time limit passes: the model then reads that it runs);
``"continue"`` lets the turn go on at once. A running call is polled once between steps
and at a later turn's start (``running_calls``), and recovery polls the handle after a
crash: nothing is run twice, and only a poll that cannot tell parks the call.

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
    "Polled",
    "poll_once",
    "running_calls",
    "running_note",
    "wait_for_result",
]

#: seconds one poll may take before it counts as "cannot tell"
POLL_LIMIT = 30.0
#: the backoff of a waiting call's polls: first pause, factor, longest pause (seconds)
_BACKOFF = (0.02, 2.0, 2.0)

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


def running_calls(calls: Iterable[CallState]) -> list[CallState]:
    """Those of ``calls`` (the classifier's ``accepted_open``) still running."""
    return [c for c in calls if c.status()[0] == "running"]

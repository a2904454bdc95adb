"""Lines typed while ``lodger run`` runs a turn: each one steers the turn (the model
reads it at its next provider boundary), and an empty line shows the follow-up queue.

The terminal's approval prompt reads the same stdin: a line is only read while no
prompt is open (``Terminal.unless_prompting``), so an answer is never taken as a steer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
from collections.abc import Coroutine
from typing import Any

from rich.text import Text

from lodger.cli._identity import cli_user
from lodger.cli._live import Terminal, TurnWatcher
from lodger.cli._render import visible
from lodger.engine.loop import TurnResult
from lodger.errors import LodgerError
from lodger.runtime.sessions import Sessions

__all__ = ["with_steering"]


async def with_steering(
    main: Coroutine[Any, Any, TurnResult],
    sessions: Sessions,
    view: TurnWatcher,
    terminal: Terminal,
    *,
    fd: int,
) -> TurnResult:
    """Run ``main`` while lines read from ``fd`` steer the session's running turn."""
    cancelled = threading.Event()
    reader = asyncio.ensure_future(_read_steers(sessions, view, terminal, fd, cancelled))
    try:
        return await main
    finally:
        cancelled.set()  # the reading thread ends within 0.1 s
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


async def _read_steers(
    sessions: Sessions,
    view: TurnWatcher,
    terminal: Terminal,
    fd: int,
    cancelled: threading.Event,
) -> None:
    pending = ""
    while not cancelled.is_set():
        data = await asyncio.to_thread(_next, terminal, fd, cancelled)
        if data is None:
            continue
        if data == "":
            return  # end of input: nothing more will be typed
        pending += data
        *lines, pending = pending.split("\n")
        for line in lines:
            await _one_line(sessions, view, terminal, line.rstrip("\r"))


def _next(terminal: Terminal, fd: int, cancelled: threading.Event) -> str | None:
    """What was typed (None: nothing within 0.1 s, or a prompt is open; "": EOF)."""
    ready, _, _ = select.select([fd], [], [], 0.1)
    if not ready or cancelled.is_set():
        return None
    return terminal.unless_prompting(lambda: _read_now(fd))


def _read_now(fd: int) -> str | None:
    """What ``fd`` holds now, without waiting (None: nothing). It runs under the
    terminal's lock: a read that blocked there (the byte ``select`` saw was taken by the
    approval prompt meanwhile) would stop every print, and the turn with it."""
    ready, _, _ = select.select([fd], [], [], 0)
    if not ready:
        return None
    blocking = os.get_blocking(fd)
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 4096)
    except BlockingIOError:
        return None
    finally:
        os.set_blocking(fd, blocking)
    return data.decode("utf-8", "replace")


async def _one_line(sessions: Sessions, view: TurnWatcher, terminal: Terminal, line: str) -> None:
    session_id = view.session_id
    if session_id is None:
        terminal.print(Text("  (the session has not started yet; type again)", style="dim"))
        return
    try:
        if not line.strip():
            queue = await sessions.queue(session_id)
            if not queue:
                terminal.print(Text("  queue: empty (type a line to steer the turn)", style="dim"))
            for n, message in enumerate(queue):
                terminal.print(
                    Text(f"  queue {n}: [{message.policy}] {visible(message.text)}", style="dim")
                )
            return
        steered = await sessions.steer(session_id, line, who=cli_user())
    except LodgerError as exc:
        terminal.print(Text(f"  steer failed: {exc.message}", style="red"))
        return
    where = "the next step reads it" if steered.status == "steer" else "queued as the next turn"
    terminal.print(Text(f"  » steer sent: {where}", style="cyan"))

"""Stopping a running turn from the terminal: Ctrl-C, SIGTERM and SIGHUP.

The first signal stops the turn the honest way: calls that are running settle and their
outcome is recorded, the run ends ``interrupted`` and the turn stays open, so
``lodger resume`` continues it with the same plan as after a crash. A second signal exits
at once and says what it left running (nothing is lost: every fact committed so far is
in the log, and what was not recorded is indeterminate, as after a crash).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click

__all__ = ["EXIT_FOR_SIGNAL", "Interrupted", "run_interruptibly"]

T = TypeVar("T")

EXIT_FOR_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


class Interrupted(Exception):
    """The turn was stopped by ``signum`` and settled."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.exit_code = EXIT_FOR_SIGNAL.get(signal.Signals(signum), 130)


def _say(text: str) -> None:
    click.echo(text, err=True)


def run_interruptibly(
    main: Coroutine[Any, Any, T],
    *,
    left_running: Callable[[], str],
    say: Callable[[str], None] = _say,
) -> T:
    """Run ``main``; the first stop signal cancels it (it settles), the second exits now.

    ``left_running`` says, for the second signal's message, what is still in flight;
    ``say`` prints the notices (stderr lines; ``--json`` makes them JSON).
    Raises ``Interrupted`` when ``main`` settled after a first signal.
    """
    received: list[int] = []

    async def runner() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(signum: int) -> None:
            received.append(signum)
            if len(received) == 1:
                say(
                    f"stopping ({_NAMES.get(signal.Signals(signum), signum)}): running calls "
                    "settle and are recorded; press Ctrl-C again to exit now"
                )
                task.cancel()
                return
            say(f"exiting now; {left_running()}")
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(EXIT_FOR_SIGNAL.get(signal.Signals(signum), 130))

        installed = []
        for sig in EXIT_FOR_SIGNAL:
            try:
                loop.add_signal_handler(sig, on_signal, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                continue  # not the main thread, or no such signal here
        try:
            return await main
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    try:
        return asyncio.run(runner())
    except asyncio.CancelledError:
        if received:
            raise Interrupted(received[0]) from None
        raise

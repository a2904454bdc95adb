"""The terminal a running turn writes to: one writer, a spinner, and the approval prompt.

Three things share the terminal while a turn runs: the lines of the live view (text,
calls, results), a spinner that names what is running and for how long, and approval
prompts. ``Terminal`` serializes them: while a prompt is open, every line the view
prints is held back and printed after the answer, so nothing lands on the prompt line,
and the spinner is stopped (a live display redraws its line several times a second).

The spinner only exists on a terminal; piped output and ``--json`` never see it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import select
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from lodger.cli._identity import cli_user
from lodger.cli._render import visible
from lodger.engine.permissions import Answered, ApprovalAnswer
from lodger.events import Event, ToolDispatched, ToolResponded
from lodger.runtime.subagents import current_subagent
from lodger.tools.spec import Tool

__all__ = ["Terminal", "TurnWatcher", "ask_approval", "describe_call", "interactive_approver"]


class TurnWatcher:
    """What every view of a running turn tracks: the session and the calls in flight."""

    def __init__(self) -> None:
        self.session_id: str | None = None
        #: calls past T1 without a T2 yet: what a hard exit would leave indeterminate
        self.in_flight: dict[str, str] = {}

    def left_running(self) -> str:
        session = self.session_id or "SESSION"
        if not self.in_flight:
            return f"no call was running; `lodger resume {session}` continues the turn"
        calls = ", ".join(f"{name} ({call})" for call, name in self.in_flight.items())
        return (
            f"left without an outcome: {calls}; `lodger recover {session}` shows what "
            "resume will do with them"
        )

    def track(self, event: Event) -> None:
        self.session_id = event.session_id
        body = event.body
        if isinstance(body, ToolDispatched) and event.call_id is not None:
            self.in_flight[event.call_id] = body.tool
        elif isinstance(body, ToolResponded) and event.call_id is not None:
            self.in_flight.pop(event.call_id, None)

    def on_text(self, delta: str) -> None:
        raise NotImplementedError

    def on_event(self, event: Event) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """The turn is about to run."""

    def stop(self) -> None:
        """The turn settled (or stopped): nothing more is printed live."""


class _Activity:
    """The spinner's line: what runs now and since when (rendered on every refresh)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._spinner = Spinner("dots", style="cyan")
        self.label = "waiting for the model"
        self.since = clock()

    def __rich__(self) -> RenderableType:
        elapsed = self._clock() - self.since
        self._spinner.update(text=Text(f" {self.label}  {elapsed:.1f} s", style="dim"))
        return self._spinner


class Terminal:
    """One writer for the console of a turn. ``spinner`` turns the live status on."""

    def __init__(
        self,
        console: Console,
        *,
        spinner: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self._spinner_wanted = spinner
        self._clock = clock
        self._activity = _Activity(clock)
        self._live: Live | None = None
        self._held: list[tuple[RenderableType, str]] | None = None
        self._lock = threading.RLock()
        #: tool names of the calls running now (call id -> name), for the spinner
        self._running: dict[str, str] = {}
        self._mid_line = False
        #: whether plain text is what rich would write: see ``_write_plain``
        self._plain = _writes_plain(console)

    # ---------------------------------------------------------------- output

    def print(self, renderable: RenderableType, *, end: str = "\n") -> None:
        """Print a line (or, with ``end=""``, part of one), or hold it during a prompt."""
        with self._lock:
            if self._held is not None:
                self._held.append((renderable, end))
                return
            if end == "":
                self._pause_spinner()  # a partial line must not be redrawn over
                self._mid_line = True
            elif self._mid_line:
                self._mid_line = False
            if not self._write_plain(renderable, end):
                self.console.print(renderable, end=end)

    def _write_plain(self, renderable: RenderableType, end: str) -> bool:
        """Write a ``Text`` as its plain text when that is what rich would write: output
        that is not a terminal, with no colors, no recording and no wrapping (the live
        view's console), and a text without tabs (rich expands them). A line per call
        costs rich about 0.2 ms (segments, styles, a width check); this costs a write
        and the flush rich does, so a reader of the pipe sees each line as it happens."""
        if not self._plain or type(renderable) is not Text or "\t" in renderable.plain:
            return False
        file = self.console.file  # looked up as rich does (stdout may be swapped)
        file.write(renderable.plain + end)
        file.flush()
        return True

    def hold(self) -> None:
        """Stop the spinner and hold every line until ``release`` (a prompt is open)."""
        with self._lock:
            self._pause_spinner()
            if self._mid_line:  # the prompt starts on a line of its own
                self.console.print()
                self._mid_line = False
            self._held = []

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held or [], None
            for renderable, end in held:
                self.print(renderable, end=end)
            self._resume_spinner()

    def unless_prompting(self, read: Callable[[], str | None]) -> str | None:
        """``read()`` under the writer's lock, unless a prompt is open (None then): a
        line typed for the prompt is the prompt's (``lodger.cli._steer_input``)."""
        with self._lock:
            if self._held is not None:
                return None
            return read()

    # ---------------------------------------------------------------- spinner

    def call_started(self, call_id: str, tool: str) -> None:
        with self._lock:
            self._running[call_id] = tool
            self._set_activity()

    def call_finished(self, call_id: str) -> None:
        with self._lock:
            self._running.pop(call_id, None)
            self._set_activity()

    def model_answered(self) -> None:
        """A model output is complete: the partial text line is done; spin again."""
        with self._lock:
            self._mid_line = False
            self._set_activity()

    def _set_activity(self) -> None:
        if self._running:
            names = sorted(set(self._running.values()))
            shown = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
            count = len(self._running)
            label = f"running {shown}" + (f" ({count} calls)" if count > 1 else "")
        else:
            label = "waiting for the model"
        if label != self._activity.label:
            self._activity.label = label
            self._activity.since = self._clock()
        self._resume_spinner()

    def start(self) -> None:
        with self._lock:
            self._activity.since = self._clock()
            self._resume_spinner()

    def stop(self) -> None:
        with self._lock:
            self._spinner_wanted = False
            self._pause_spinner()
            if self._mid_line:
                self.console.print()
                self._mid_line = False

    def _pause_spinner(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _resume_spinner(self) -> None:
        if not self._spinner_wanted or self._live is not None:
            return
        if self._held is not None or self._mid_line:
            return
        self._live = Live(
            self._activity,
            console=self.console,
            refresh_per_second=8,
            transient=True,  # the spinner line goes away; printed lines stay
        )
        self._live.start()


def _writes_plain(console: Console) -> bool:
    """Whether the console renders a ``Text`` as exactly its plain text (tabs aside):
    not a terminal (no color system, no live display), soft wrap on (no line is cut or
    padded), nothing recorded or quieted."""
    return not (
        console.is_terminal
        or console.color_system is not None
        or not console.soft_wrap
        or console.record
        or console.quiet
        or console.is_jupyter
        or console.legacy_windows
    )


# ---------------------------------------------------------------- approvals


def describe_call(tool: Tool, arguments: dict[str, Any]) -> list[str]:
    """The lines a prompt shows for a call: a shell command as the command line it is,
    Python code as code, anything else as compact JSON."""
    rest = dict(arguments)
    lines: list[str] = []
    command = rest.get("command")
    code = rest.get("code")
    if isinstance(command, str):
        del rest["command"]
        lines.extend(
            f"$ {line}" if n == 0 else f"  {line}"
            for n, line in enumerate(command.splitlines() or [""])
        )
    elif isinstance(code, str):
        del rest["code"]
        lines.extend(
            f">>> {line}" if n == 0 else f"... {line}"
            for n, line in enumerate(code.splitlines() or [""])
        )
    if rest:
        extra = json.dumps(rest, ensure_ascii=False)
        if len(extra) > 300:
            extra = extra[:297] + "..."
        lines.append(extra if not lines else f"({extra})")
    # an ESC in a command could redraw the prompt over what it really runs: shown, not sent
    return [visible(line) for line in lines] or ["(no arguments)"]


_CHOICES = {"y": "once", "a": "always", "n": "deny"}


def ask_approval(
    terminal: Terminal,
    tool: Tool,
    arguments: dict[str, Any],
    read: Callable[[str], str],
    *,
    who: str = "",
) -> ApprovalAnswer:
    """Show the call and ask once / always / deny; EOF or a stream closed means deny.

    Runs on a worker thread (reading the terminal blocks); ``read`` shows the prompt
    text and returns the answer line. ``who`` names a subagent that asks.
    """
    terminal.hold()
    try:
        console = terminal.console
        console.print(Text(f"  ?  {who}{tool.name} wants to run:", style="bold magenta"))
        for line in describe_call(tool, arguments):
            console.print(Text(f"     {line}"), soft_wrap=True)
        question = (
            f"     [y] allow once  [a] always allow {tool.name} in this session  "
            "[n] deny (default n): "
        )
        while True:
            try:
                answer = read(question).strip().lower()
            except EOFError:
                console.print()
                return "deny"
            if answer in ("", "n", "no", "d", "deny"):
                return "deny"
            if answer in _CHOICES:
                return _CHOICES[answer]  # type: ignore[return-value]
            if answer in ("yes", "once"):
                return "once"
            if answer == "always":
                return "always"
            console.print(Text("     answer y, a or n", style="yellow"))
    finally:
        terminal.release()


def _reader(console: Console, cancelled: threading.Event) -> Callable[[str], str]:
    """Read one answer line from stdin, giving up (EOF) once ``cancelled`` is set.

    A thread blocked in ``input()`` cannot be stopped, and ``asyncio.run`` waits for it at
    exit: a Ctrl-C during a prompt would hang until Enter. Polling the descriptor lets a
    stopped turn end while its question is still open.
    """

    def read(question: str) -> str:
        console.print(Text(question), end="")
        console.file.flush()
        fd = sys.stdin.fileno()
        while not cancelled.is_set():
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                data = os.read(fd, 4096)  # a whole line: the terminal is in canonical mode
                if not data:
                    raise EOFError
                lines = data.decode("utf-8", "replace").splitlines()
                return lines[0] if lines else ""
        raise EOFError

    return read


def interactive_approver(terminal: Terminal) -> Callable[[Tool, dict[str, Any]], Any]:
    """The CLI's ``Approver``: asks at the terminal, one question at a time."""

    async def approve(t: Tool, arguments: dict[str, Any]) -> Answered:
        cancelled = threading.Event()
        child = current_subagent()  # a subagent's call: say which child asks
        who = f"subagent {child.session_id}: " if child is not None else ""
        try:
            answer = await asyncio.to_thread(
                functools.partial(ask_approval, who=who),
                terminal,
                t,
                arguments,
                _reader(terminal.console, cancelled),
            )
            return Answered(answer, cli_user())
        finally:
            cancelled.set()  # a stopped turn: the reading thread ends within 0.1 s

    return approve

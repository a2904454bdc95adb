"""Lines typed while ``lodger run`` runs a turn steer it; an empty line shows the queue.
Read from a real pipe (the terminal's stdin in ``lodger run``), into a real session."""

from __future__ import annotations

import asyncio
import io
import os
from pathlib import Path

from rich.console import Console

from lodger import FunctionModel, tool
from lodger.cli._live import Terminal, TurnWatcher
from lodger.cli._steer_input import with_steering
from lodger.events import SteerDelivered, SteerReceived
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage, UserMessage
from lodger.providers.scripted import tool_call
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage


async def test_a_typed_line_steers_the_running_turn(tmp_path: Path) -> None:
    running, release = asyncio.Event(), asyncio.Event()
    seen: list[list[str]] = []

    @tool
    async def wait_here() -> str:
        """Wait until released."""
        running.set()
        await release.wait()
        return "ok"

    def model(request: ModelRequest) -> ModelResponse:
        seen.append([m.text for m in request.messages if isinstance(m, UserMessage)])
        if any(isinstance(m, ToolResultMessage) for m in request.messages):
            return ModelResponse(text="done")
        return ModelResponse(calls=(tool_call("wait_here"),))

    view = TurnWatcher()
    out = io.StringIO()
    terminal = Terminal(Console(file=out, width=120))
    read, write = os.pipe()
    async with Sessions(Storage.local(tmp_path / "state")) as sessions:
        binding = Binding(model=FunctionModel(model), tools=[wait_here], on_event=view.track)
        turn = sessions.run("go", binding=binding, session="s1")
        steering = asyncio.create_task(with_steering(turn, sessions, view, terminal, fd=read))
        await running.wait()
        os.write(write, b"use the fast path\n\n")
        async with asyncio.timeout(30):
            while not any(  # noqa: ASYNC110 - another task commits it
                isinstance(e.body, SteerReceived) for e in await sessions.log.read("s1")
            ):
                await asyncio.sleep(0.02)
            while "queue: empty" not in out.getvalue():  # noqa: ASYNC110 - the reader prints it
                await asyncio.sleep(0.02)
        release.set()
        result = await steering
        events = await sessions.log.read("s1")
    os.close(read)
    os.close(write)
    assert result.status == "completed"
    received = [e.body for e in events if isinstance(e.body, SteerReceived)]
    assert [r.text for r in received] == ["use the fast path"]
    assert received[0].who is not None and received[0].who.startswith("cli:")
    assert any(isinstance(e.body, SteerDelivered) for e in events)
    assert seen[-1] == ["go", "use the fast path"]
    assert "steer sent: the next step reads it" in out.getvalue()


def test_a_read_under_the_terminal_lock_never_waits() -> None:
    """The steer reader reads under the terminal's lock: with nothing there (the byte
    select saw was taken by the approval prompt), it must answer None at once, not block
    every print of the turn (a deadlock seen under load)."""
    import os
    import threading

    from lodger.cli._steer_input import _read_now

    read_end, write_end = os.pipe()
    try:
        answers: list[str | None] = []
        reader = threading.Thread(target=lambda: answers.append(_read_now(read_end)))
        reader.start()
        reader.join(timeout=2)
        assert not reader.is_alive() and answers == [None]
        assert os.get_blocking(read_end)  # left as it was
        os.write(write_end, b"go left\n")
        assert _read_now(read_end) == "go left\n"
    finally:
        os.close(read_end)
        os.close(write_end)

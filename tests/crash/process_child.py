"""The background-process crash test's child: a real session on the real SQLite log starts
a background process, then lodger is killed with SIGKILL by the next call.

    python process_child.py WORKSPACE PHASE

PHASE ``run`` runs the turn (and dies in it); ``resume`` resumes the session and prints
its background-process facts as JSON. ``between`` runs a turn that keeps its process for
the session and dies after the turn ended; ``next`` runs the next turn and prints them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from lodger.events import ProcessEnded, ProcessStarted
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage
from lodger.substrates.processes import process_tools
from lodger.tools.spec import tool

WORKSPACE = Path(sys.argv[1])
PHASE = sys.argv[2]
MARK = WORKSPACE / "killed-once"


@tool(recovery="idempotent")
async def crash() -> str:
    """Kill this lodger process the first time (SIGKILL: no cleanup runs), once the
    background process is up."""
    for _ in range(500):
        if (WORKSPACE / "starts").exists():
            break
        await asyncio.sleep(0.02)
    if not MARK.exists():
        MARK.write_text("x")
        os.kill(os.getpid(), signal.SIGKILL)
    return "not this time"


SCRIPT = [
    # counted outside: each start appends a line to the workspace's file
    {
        "calls": [
            {"name": "start_process", "args": {"command": "echo up >> starts; exec sleep 600"}}
        ]
    },
    {"calls": [{"name": "crash", "args": {}}]},
    {"text": "done"},
]


async def main() -> None:
    storage = Storage.local(WORKSPACE / ".lodger")
    binding = Binding(
        model=ScriptedModel(SCRIPT), tools=[*process_tools(), crash], workspace=WORKSPACE
    )
    async with Sessions(storage) as sessions:
        if PHASE == "run":
            await sessions.run("go", binding=binding, session="s")
        elif PHASE in ("between", "next"):
            await sessions.run("go", binding=_kept(PHASE), session="s")
            if PHASE == "between":
                os.kill(os.getpid(), signal.SIGKILL)
            await _print(storage, "completed")
        else:
            result = await sessions.resume("s", binding=binding)
            await _print(storage, result.status)


def _kept(phase: str) -> Binding:
    """``between``: a turn that starts a process kept for the session; ``next``: a turn
    that only answers."""
    start = {"command": "echo up >> starts; exec sleep 600", "keep": "session"}
    steps: list[dict[str, object]] = [{"text": "next"}]
    if phase == "between":
        steps = [{"calls": [{"name": "start_process", "args": start}]}, {"text": "kept"}]
    return Binding(model=ScriptedModel(steps), tools=[*process_tools(), crash], workspace=WORKSPACE)


async def _print(storage: Storage, status: str) -> None:
    events = await storage.log.read_all("s")
    facts = [
        e.body.model_dump(mode="json")
        for e in events
        if isinstance(e.body, ProcessStarted | ProcessEnded)
    ]
    print(json.dumps({"status": status, "facts": facts}))


asyncio.run(main())

"""The rewind crash test's child: a real session on the real SQLite log and file artifacts,
rewound, and killed with SIGKILL at a chosen point of the restore.

    python rewind_child.py WORKSPACE PHASE [KILL]

PHASE ``setup`` runs two turns that write files; ``rewind`` rewinds the session to before
turn 2, killing itself at KILL (``get:N``: as the N-th blob is read, before it is written
back; ``append:N``: after the N-th append commits; ``none``), and prints how many blobs it
read; ``open`` opens the session as every door does (finishing a rewind cut short) and
prints its current branch and files as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from lodger.providers.scripted import ScriptedModel
from lodger.runtime.builtin import workspace_tools
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import EventLog, FileArtifactStore, SqliteLogStore, Storage
from lodger.testing import FaultyLogStore

WORKSPACE = Path(sys.argv[1])
PHASE = sys.argv[2]
KILL = sys.argv[3] if len(sys.argv) > 3 else "none"
FILES = 6


class KillingBlobs(FileArtifactStore):
    """The real artifact directory; SIGKILL as the ``kill_at``-th blob is read."""

    def __init__(self, root: Path, kill_at: int | None) -> None:
        super().__init__(root)
        self.kill_at = kill_at
        self.gets = 0

    async def get(self, sha256: str) -> bytes:
        self.gets += 1
        if self.gets == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return await super().get(sha256)


def storage(kill: str) -> tuple[Storage, KillingBlobs]:
    state = WORKSPACE / ".lodger"
    how, _, n = kill.partition(":")
    blobs = KillingBlobs(state / "artifacts", int(n) if how == "get" else None)
    store = FaultyLogStore(SqliteLogStore(state), crash_after=int(n) if how == "append" else None)
    return Storage(log=EventLog(store), artifacts=blobs, state_dir=state), blobs


def writes(version: str, names: list[str]) -> list[dict[str, Any]]:
    calls = [
        {"name": "write_file", "args": {"path": name, "content": f"{name} {version}\n"}}
        for name in names
    ]
    return [{"calls": calls}, {"text": "done"}]


async def main() -> None:
    made, blobs = storage(KILL)
    async with Sessions(made) as sessions:
        if PHASE == "setup":
            names = [f"f{i}.txt" for i in range(FILES)]
            for version, extra in (("v1", []), ("v2", ["new/n0.txt", "n1.txt"])):
                binding = Binding(
                    model=ScriptedModel(writes(version, names + extra)),
                    tools=workspace_tools(),
                    workspace=WORKSPACE,
                )
                await sessions.run("write them", binding=binding, session="s")
        elif PHASE == "rewind":
            await sessions.rewind("s", turn=2)
            print(json.dumps({"gets": blobs.gets}))
        else:
            state = await sessions.state("s")
            print(
                json.dumps({"branch": state.session_id, "sessions": await made.log.list_sessions()})
            )


asyncio.run(main())

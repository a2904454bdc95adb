"""The child of the long-call crash tests: runs one turn on the real SQLite log with a
tool that talks to the parent's loopback server, and is SIGKILLed by the parent once the
remote side has accepted the work (the parent watches the server's ledger).

    python -m tests.crash.longcall_child STATE BASE_URL pay|job

``pay``: an idempotent charge that hangs after the server ran it, before its T2.
``job``: a build the server accepts (``call_accepted`` committed), then polled with
``wait`` until the parent kills the process.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.tools.remote_tools import build_tool, pay_tool

from lodger import Agent, ScriptedModel
from lodger.storage import EventLog, MemoryArtifactStore, SqliteLogStore, Storage

SCRIPTS = {
    "pay": [{"calls": [{"name": "pay", "args": {"amount": 5}}]}, {"text": "paid"}],
    "job": [{"calls": [{"name": "build", "args": {"target": "app"}}]}, {"text": "built"}],
}


async def main(state: Path, base: str, mode: str) -> None:
    tools = (
        [pay_tool(base, hang_after_effect=True)] if mode == "pay" else [build_tool(base, "wait")]
    )
    agent = Agent(
        model=ScriptedModel(SCRIPTS[mode]),
        tools=tools,
        storage=Storage(log=EventLog(SqliteLogStore(state)), artifacts=MemoryArtifactStore()),
    )
    await agent.run("go", session="s1")  # never returns: the parent kills it first


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))

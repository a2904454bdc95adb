"""Tools for subagent children on worker processes (``lodger worker --tools THIS_FILE``).

Effects are counted outside the log, in ``$LODGER_TEST_DIR``: ``child-effects`` gets one
line per effect (tag and session), ``child-invocations`` one line per handler run (with
the worker's pid), and ``holding-<tag>-<session>`` names the pid of a worker whose call
waits for the test's ``gate-<tag>`` file.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from lodger import tool
from lodger.events import ToolDispatched
from lodger.tools.spec import ProbeResult, ToolContext

DIR = Path(os.environ["LODGER_TEST_DIR"])


def _append(name: str, line: str) -> None:
    with (DIR / name).open("a") as file:
        file.write(line + "\n")
        file.flush()
        os.fsync(file.fileno())


def _lines(name: str) -> list[str]:
    path = DIR / name
    return path.read_text().splitlines() if path.exists() else []


async def _probe(dispatched: ToolDispatched, ctx: ToolContext) -> ProbeResult:
    line = f"{dispatched.arguments['tag']} {ctx.session_id}"
    applied = line in _lines("child-effects")
    return ProbeResult(applied=applied, observation=f"effect {line} {applied}", content="done")


@tool(recovery="queryable", probe=_probe)
async def child_effect(tag: str, ctx: ToolContext) -> str:
    """Apply an effect once for this session, then wait for the test's gate."""
    _append("child-invocations", f"{tag} {ctx.session_id} {os.getpid()}")
    _append("child-effects", f"{tag} {ctx.session_id}")
    gate = DIR / f"gate-{tag}"
    if not gate.exists():
        (DIR / f"holding-{tag}-{ctx.session_id}").write_text(str(os.getpid()))
        while not gate.exists():  # noqa: ASYNC110 - another process makes the file
            await asyncio.sleep(0.02)
    return "done"

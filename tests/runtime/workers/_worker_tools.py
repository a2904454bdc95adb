"""Tools for worker processes in the tests (``lodger worker --tools THIS_FILE``).

Effects are counted outside the log, in ``$LODGER_TEST_DIR``: ``effects`` gets one line
per effect, ``invocations`` one line per handler run, and ``holding-<tag>`` names the pid
of a worker whose tool is waiting for the test's ``gate-<tag>`` file.
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


async def _hold(tag: str) -> None:
    """Wait for the test's gate (the first time only: a marker says who waits)."""
    gate = DIR / f"gate-{tag}"
    if gate.exists():
        return
    (DIR / f"holding-{tag}").write_text(str(os.getpid()))
    while not gate.exists():  # noqa: ASYNC110 - another process makes the file
        await asyncio.sleep(0.02)


async def _probe(dispatched: ToolDispatched, ctx: ToolContext) -> ProbeResult:
    tag = dispatched.arguments["tag"]
    applied = tag in _lines("effects")
    seen = "found" if applied else "absent"
    return ProbeResult(applied=applied, observation=f"effect {tag} {seen}", content="done")


@tool(recovery="queryable", probe=_probe)
async def effect(tag: str) -> str:
    """Apply an effect once, then wait for the test's gate (the crash point)."""
    _append("invocations", f"{tag} {os.getpid()}")
    _append("effects", tag)
    await _hold(tag)
    return "done"


@tool(recovery="idempotent")
async def note(tag: str) -> str:
    """Wait for the test's gate, then record an invocation (safe to run again)."""
    await _hold(tag)
    _append("invocations", f"{tag} {os.getpid()}")
    return "noted"

"""Tools of the parity test (``--tools THIS_FILE`` for the CLI, the host and the workers;
the library door imports it). Effects are counted outside every lodger process, in
``$PARITY_DIR``: ``effects`` gets one line per effect, ``invocations`` one line per
handler run (with its pid); ``settle`` waits for ``$PARITY_DIR/open`` after its effect,
the point where a test SIGKILLs the process running the turn."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from lodger import tool
from lodger.events import ToolDispatched
from lodger.tools.spec import ProbeResult, ToolContext


def _dir() -> Path:
    return Path(os.environ["PARITY_DIR"])


def _append(name: str, line: str) -> None:
    with (_dir() / name).open("a") as file:
        file.write(line + "\n")
        file.flush()
        os.fsync(file.fileno())


def _lines(name: str) -> list[str]:
    path = _dir() / name
    return path.read_text().splitlines() if path.exists() else []


@tool
def launch(target: str) -> str:
    """Launch something (lodger.toml's ask rule makes every call wait for approval)."""
    _append("invocations", f"launch {os.getpid()}")
    _append("effects", f"launch {target}")
    return f"launched {target}"


async def _probe(dispatched: ToolDispatched, ctx: ToolContext) -> ProbeResult:
    tag = dispatched.arguments["tag"]
    applied = f"settle {tag}" in _lines("effects")
    return ProbeResult(
        applied=applied, observation=f"settle {tag} {'found' if applied else 'absent'}",
        content=f"settled {tag}",
    )  # fmt: skip


@tool(recovery="queryable", probe=_probe)
async def settle(tag: str) -> str:
    """Apply an effect once, then wait for the test's ``open`` file (the crash point:
    after the effect, before T2); a resume's probe finds the effect and never re-runs."""
    _append("invocations", f"settle {os.getpid()}")
    _append("effects", f"settle {tag}")
    while not (_dir() / "open").exists():  # noqa: ASYNC110 - the test makes the file
        await asyncio.sleep(0.02)
    return f"settled {tag}"

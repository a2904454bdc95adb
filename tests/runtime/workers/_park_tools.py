"""Tools for the parked-approval worker tests (``lodger worker --tools THIS_FILE``).

Effects are counted outside the log, in ``$LODGER_TEST_DIR``: ``shipped`` gets one line
per run of ``ship`` (which needs approval), ``logged`` one per run of ``log_line``.
"""

from __future__ import annotations

import os
from pathlib import Path

from lodger import tool

DIR = Path(os.environ["LODGER_TEST_DIR"])


def _append(name: str, line: str) -> None:
    with (DIR / name).open("a") as file:
        file.write(line + "\n")
        file.flush()
        os.fsync(file.fileno())


@tool(approval=True)
async def ship(target: str) -> str:
    """Ship to a target (needs approval; never retried)."""
    _append("shipped", f"{target} {os.getpid()}")
    return f"shipped {target}"


@tool
async def log_line(text: str) -> str:
    """Write a line (no approval)."""
    _append("logged", f"{text} {os.getpid()}")
    return f"logged {text}"

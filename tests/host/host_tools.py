"""Tools the host tests bind (also loaded by ``lodger serve --tools`` in a subprocess)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from lodger import tool


@tool(nestable=True)
def echo(text: str) -> str:
    """Return the text."""
    return text


@tool(approval=True)
def deploy(target: str) -> str:
    """Deploy to a target (needs approval)."""
    return f"deployed {target}"


@tool(recovery="idempotent", timeout=60)
async def gate(name: str) -> str:
    """Wait until the file $HOST_TEST_GATES/<name> exists, counting each start in
    $HOST_TEST_GATES/<name>.starts (outside the host's process)."""
    root = Path(os.environ["HOST_TEST_GATES"])
    with (root / f"{name}.starts").open("a") as f:
        f.write("start\n")
    while not (root / name).exists():  # noqa: ASYNC110 - another process makes the file
        await asyncio.sleep(0.02)
    return f"gate {name} open"


@tool(recovery="never_retry", timeout=60)
async def charge(name: str) -> str:
    """Like ``gate``, but never retried: a crash inside it parks the turn for an operator."""
    root = Path(os.environ["HOST_TEST_GATES"])
    with (root / f"{name}.starts").open("a") as f:
        f.write("start\n")
    while not (root / name).exists():  # noqa: ASYNC110 - another process makes the file
        await asyncio.sleep(0.02)
    return f"charged {name}"

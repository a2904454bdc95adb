"""Helpers for the authority suites: let waiting tasks run, build file claims briefly."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lodger.authority import ResourceClaim
from lodger.authority.common import ClaimScope


async def settle() -> None:
    """Let every ready task run until nothing more can move (grants are synchronous)."""
    for _ in range(5):
        await asyncio.sleep(0)


def read(path: Path | str, scope: ClaimScope = "exact") -> ResourceClaim:
    return ResourceClaim.file(path, mode="read", scope=scope)


def write(path: Path | str, scope: ClaimScope = "exact") -> ResourceClaim:
    return ResourceClaim.file(path, mode="write", scope=scope)

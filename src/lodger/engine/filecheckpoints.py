"""Per-edit workspace checkpoints: the bytes a file had before a tool changed it.

A tool that declares ``expectations`` (the file tools: ``write_file``, ``edit_file``)
names each file it will change with its hash before and after. Before such a call's T1,
the file's current bytes are stored as an artifact (content-addressed: an unchanged file
costs no new blob) and a ``file_checkpoint`` fact is committed in T1's append, so a rewind
to any point of a turn, even between two edits, puts every file back exactly
(``lodger.runtime.rewind``). A file whose bytes no longer hash to what the expectation
recorded (changed in between) gets no checkpoint: T1's expectation already says what the
call expected, and the rewind reads the turn-end snapshot for it instead.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from pathlib import Path

from lodger.errors import ToolCallError
from lodger.events import ArtifactRef, FileCheckpoint, FileExpectation
from lodger.storage.artifacts import ArtifactStore
from lodger.tools.spec import ToolContext
from lodger.tools.workspace import open_in_workspace

__all__ = ["file_checkpoints"]

_MEDIA_TYPE = "application/octet-stream"


def _read(root: Path, path: str, hidden: Sequence[Path]) -> bytes | None:
    try:
        with open_in_workspace(root, path, hidden=hidden, action="checkpoint") as (f, _):
            return f.read()
    except ToolCallError:
        return None  # gone or no longer a regular file: the call's own checks say so


async def file_checkpoints(
    artifacts: ArtifactStore, ctx: ToolContext, expectations: Sequence[FileExpectation]
) -> list[FileCheckpoint]:
    """One checkpoint per file the call expects to change, its old bytes stored."""
    if not expectations or ctx.workspace is None:
        return []
    made: list[FileCheckpoint] = []
    for expected in expectations:
        before: ArtifactRef | None = None
        if expected.before_sha256 is not None:
            data = await asyncio.to_thread(_read, ctx.workspace, expected.path, ctx.hidden)
            if data is None or hashlib.sha256(data).hexdigest() != expected.before_sha256:
                continue
            before = await artifacts.put(data, media_type=_MEDIA_TYPE)
        made.append(
            FileCheckpoint(
                operation_id=ctx.operation_id,
                path=expected.path,
                before_sha256=expected.before_sha256,
                after_sha256=expected.after_sha256,
                before=before,
            )
        )
    return made

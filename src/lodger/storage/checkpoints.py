"""Where fold checkpoints live: bytes per session, beside the log, never an authority.

A checkpoint (``lodger.engine.checkpoint``) lets opening a long session skip decoding the
events it covers; the chain over every stored byte is still checked. This module only
stores its bytes: the local state directory keeps one file per session
(``<state>/checkpoints/<session>.ckpt``, written under a temporary name and renamed, so a
reader sees the old file or the new one, never a torn one); the object store keeps them
as objects (``lodger.storage.objectstore.ObjectCheckpoints``); the memory twin keeps a
dict; a store without a place for them keeps none. Losing or damaging a checkpoint loses
nothing: the next open decodes the whole log and writes a new one.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import stat
from pathlib import Path
from typing import Protocol, runtime_checkable

from lodger.storage.logstore import check_session_id

__all__ = ["CheckpointStore", "FileCheckpoints", "MemoryCheckpoints", "NoCheckpoints"]


@runtime_checkable
class CheckpointStore(Protocol):
    """One checkpoint per session, replaced whole."""

    async def load_checkpoint(self, *, session_id: str) -> bytes | None:
        """The session's checkpoint bytes, or None when there is none (or it is unreadable)."""
        ...

    async def save_checkpoint(self, *, session_id: str, data: bytes) -> None:
        """Replace the session's checkpoint atomically: a concurrent or later load sees the
        old bytes or the new ones. May do nothing (a store that keeps none)."""
        ...

    async def discard_checkpoint(self, *, session_id: str) -> None: ...


class NoCheckpoints:
    """A store that keeps no checkpoints: every open decodes the whole log."""

    async def load_checkpoint(self, *, session_id: str) -> bytes | None:
        return None

    async def save_checkpoint(self, *, session_id: str, data: bytes) -> None:
        return None

    async def discard_checkpoint(self, *, session_id: str) -> None:
        return None


class MemoryCheckpoints:
    """The memory twin."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}

    async def load_checkpoint(self, *, session_id: str) -> bytes | None:
        return self._data.get(check_session_id(session_id))

    async def save_checkpoint(self, *, session_id: str, data: bytes) -> None:
        self._data[check_session_id(session_id)] = bytes(data)

    async def discard_checkpoint(self, *, session_id: str) -> None:
        self._data.pop(check_session_id(session_id), None)


class FileCheckpoints:
    """``<root>/<session>.ckpt`` files (root: ``<state>/checkpoints``).

    Not fsynced: a checkpoint lost or emptied by a power failure is detected by its own
    digest and ignored, which costs one full decode; syncing would cost every turn.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path_of(self, session_id: str) -> Path:
        return self.root / f"{check_session_id(session_id)}.ckpt"

    async def load_checkpoint(self, *, session_id: str) -> bytes | None:
        return await asyncio.to_thread(self._load, self.path_of(session_id))

    @staticmethod
    def _load(path: Path) -> bytes | None:
        try:
            # without blocking, and only a regular file: a FIFO or a link to /dev/zero in
            # its place would hang the open or fill memory; it is a miss like any damage
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:  # missing or unreadable: a cache miss
            return None
        try:
            with open(fd, "rb", closefd=False) as handle:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return None
                return handle.read()
        except OSError:
            return None
        finally:
            os.close(fd)

    async def save_checkpoint(self, *, session_id: str, data: bytes) -> None:
        await asyncio.to_thread(self._save, self.path_of(session_id), data)

    def _save(self, path: Path, data: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            with open(temp, "xb") as f:
                f.write(data)
            os.replace(temp, path)  # atomic: readers see the old file or this one
        finally:
            temp.unlink(missing_ok=True)

    async def discard_checkpoint(self, *, session_id: str) -> None:
        await asyncio.to_thread(self.path_of(session_id).unlink, missing_ok=True)

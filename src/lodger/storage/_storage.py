"""``Storage``: the persistence a session needs, as one object.

An event log and an artifact store, opened together and closed together. The embedded
default keeps both in a state directory (``Storage.local(".lodger")``); tests and
throw-away sessions keep both in memory (``Storage.memory()``). The object-store and
control-plane backends compose into the same object.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lodger.storage.artifacts import ArtifactStore, FileArtifactStore, MemoryArtifactStore
from lodger.storage.eventlog import EventLog
from lodger.storage.memory import MemoryLogStore
from lodger.storage.sqlite import SqliteLogStore

__all__ = ["Storage"]


@dataclass(kw_only=True)
class Storage:
    log: EventLog
    artifacts: ArtifactStore
    #: the directory that holds the state, if it is on this machine (never shown to tools)
    state_dir: Path | None = None

    @classmethod
    def local(cls, state_dir: str | os.PathLike[str]) -> Storage:
        """SQLite log and file artifacts in ``state_dir`` (created on first write)."""
        root = Path(state_dir)
        return cls(
            log=EventLog(SqliteLogStore(root)),
            artifacts=FileArtifactStore(root / "artifacts"),
            state_dir=root,
        )

    @classmethod
    def memory(cls) -> Storage:
        return cls(log=EventLog(MemoryLogStore()), artifacts=MemoryArtifactStore())

    async def close(self) -> None:
        await self.log.close()

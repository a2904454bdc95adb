"""What third parties (and lodger's own tests) test with.

- The conformance suites every backend runs: ``lodger.testing.log_conformance``
  (``LogConformance``, ``TamperConformance``) for event-log stores and
  ``lodger.testing.artifact_conformance`` (``ArtifactConformance``) for artifact stores.
  They import pytest, so they are separate modules.
- The memory twins: ``MemoryLogStore``, ``MemoryArtifactStore``.
- Test doubles that wrap real parts: fault injection around a real ``LogStore``.

``FaultyLogStore`` delegates everything to the store it wraps and fails chosen appends
the way a full disk would: ``FaultyLogStore(SqliteLogStore(dir), fail_appends={3})``
makes the third append raise ``CommitFailedError`` with nothing written. ``crash_after``
kills the process with SIGKILL right after the N-th append has committed.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence

from lodger.errors import CommitFailedError
from lodger.storage.artifacts import MemoryArtifactStore
from lodger.storage.logstore import LogStore, Record, WriterLease
from lodger.storage.memory import MemoryLogStore

__all__ = ["FaultyLogStore", "MemoryArtifactStore", "MemoryLogStore"]


class FaultyLogStore:
    """A real store whose chosen appends fail (counted from 1 over this wrapper's life)."""

    def __init__(
        self,
        inner: LogStore,
        *,
        fail_appends: set[int] | None = None,
        fail_when: Callable[[Sequence[Record]], bool] | None = None,
        crash_after: int | None = None,
    ) -> None:
        self.inner = inner
        self.fail_appends = set(fail_appends or ())
        self.fail_when = fail_when
        self.crash_after = crash_after
        self.appends = 0
        self.failed = 0

    async def append_records(
        self, *, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        self.appends += 1
        if self.appends in self.fail_appends or (
            self.fail_when is not None and self.fail_when(records)
        ):
            self.failed += 1
            raise CommitFailedError(
                f"injected failure of append #{self.appends} (no space left on device)",
                session_id=session_id,
                offset=expected_offset,
            )
        await self.inner.append_records(
            session_id=session_id, records=records, expected_offset=expected_offset
        )
        if self.crash_after is not None and self.appends >= self.crash_after:
            os.kill(os.getpid(), signal.SIGKILL)

    async def read_records(self, *, session_id: str, start: int, end: int | None) -> list[Record]:
        return await self.inner.read_records(session_id=session_id, start=start, end=end)

    async def last_record(self, *, session_id: str) -> Record | None:
        return await self.inner.last_record(session_id=session_id)

    async def stored_head(self, *, session_id: str) -> tuple[int, str] | None:
        return await self.inner.stored_head(session_id=session_id)

    def present(self) -> bool:
        return self.inner.present()

    async def list_sessions(self) -> list[str]:
        return await self.inner.list_sessions()

    async def acquire_writer(self, *, session_id: str) -> WriterLease:
        return await self.inner.acquire_writer(session_id=session_id)

    async def close(self) -> None:
        await self.inner.close()

"""What third parties (and lodger's own tests) test with.

- The conformance suites every backend runs: ``lodger.testing.log_conformance``
  (``LogConformance``, ``TamperConformance``) for event-log stores,
  ``lodger.testing.artifact_conformance`` (``ArtifactConformance``) for artifact stores
  and ``lodger.testing.executor_conformance`` (``ExecutorConformance``) for the
  substrates behind the Executor seam. They are test code, so they are separate modules.
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
from lodger.storage.logstore import ForwardingLogStore, LogStore, Record
from lodger.storage.memory import MemoryLogStore

__all__ = ["FaultyLogStore", "MemoryArtifactStore", "MemoryLogStore"]


class FaultyLogStore(ForwardingLogStore):
    """A real store whose chosen appends fail (counted from 1 over this wrapper's life)."""

    def __init__(
        self,
        inner: LogStore,
        *,
        fail_appends: set[int] | None = None,
        fail_when: Callable[[Sequence[Record]], bool] | None = None,
        crash_after: int | None = None,
    ) -> None:
        super().__init__(inner)
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

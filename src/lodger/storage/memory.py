"""An in-memory ``LogStore`` for tests and throwaway sessions."""

from __future__ import annotations

from collections.abc import Sequence

from lodger.errors import AppendConflictError, SessionLockedError
from lodger.storage._heads import head_missing
from lodger.storage.checkpoints import MemoryCheckpoints
from lodger.storage.logstore import Record

__all__ = ["MemoryLogStore"]


class _MemoryLease:
    def __init__(self, store: MemoryLogStore, session_id: str, number: int) -> None:
        self._store = store
        self.session_id = session_id
        self.number = number

    async def release(self) -> None:
        if self._store._writers.get(self.session_id) == self.number:
            del self._store._writers[self.session_id]


class MemoryLogStore:
    def __init__(self) -> None:
        self.sessions: dict[str, list[Record]] = {}
        self.heads: dict[str, tuple[int, str]] = {}
        self.checkpoints = MemoryCheckpoints()
        self._writers: dict[str, int] = {}
        self._lease_counter = 0

    async def append_records(
        self, *, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        rows = self.sessions.setdefault(session_id, [])
        high_water = rows[-1].offset + 1 if rows else 0
        if high_water != expected_offset:
            raise AppendConflictError(
                f"append to session {session_id!r} expected offset {expected_offset} "
                f"but the stored high-water mark is {high_water}",
                hint="another writer appended first; re-read the log",
                session_id=session_id,
                offset=expected_offset,
            )
        rows.extend(records)
        if records:
            self.heads[session_id] = (records[-1].offset + 1, records[-1].digest)

    async def read_records(self, *, session_id: str, start: int, end: int | None) -> list[Record]:
        rows = self.sessions.get(session_id, [])
        return [r for r in rows if r.offset >= start and (end is None or r.offset < end)]

    async def last_record(self, *, session_id: str) -> Record | None:
        rows = self.sessions.get(session_id)
        return rows[-1] if rows else None

    async def stored_head(self, *, session_id: str) -> tuple[int, str] | None:
        head = self.heads.get(session_id)
        rows = self.sessions.get(session_id)
        if head is None and rows:
            raise head_missing(session_id, rows[-1].offset + 1)
        return head

    def present(self) -> bool:
        return True

    async def list_sessions(self) -> list[str]:
        # a session whose records were all lost is still listed by its head
        return sorted(
            {sid for sid, rows in self.sessions.items() if rows}
            | {sid for sid, (high_water, _) in self.heads.items() if high_water > 0}
        )

    async def acquire_writer(self, *, session_id: str) -> _MemoryLease:
        holder = self._writers.get(session_id)
        if holder is not None:
            raise SessionLockedError(
                f"session {session_id!r} already has a writer (lease #{holder} in this process)",
                hint="close the other writer first",
                session_id=session_id,
            )
        self._lease_counter += 1
        self._writers[session_id] = self._lease_counter
        return _MemoryLease(self, session_id, self._lease_counter)

    async def close(self) -> None:
        self._writers.clear()

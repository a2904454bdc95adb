"""The narrow interface every log backend implements: bytes in, bytes out.

A ``LogStore`` knows nothing about event kinds or digests. It stores ``Record`` rows
(offset, canonical bytes, digest) per session, appends a batch atomically and durably at
an expected offset, and hands out one writer lease per session. ``EventLog`` builds the
event semantics (sealing, decoding, chain verification) on top of any store, so every
backend fails closed the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from lodger.errors import UsageError

__all__ = ["ForwardingLogStore", "LogStore", "Record", "WriterLease", "check_session_id"]

_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_session_id(session_id: str) -> str:
    if not _SESSION_ID.fullmatch(session_id):  # `$` alone would let "id\n" through
        raise UsageError(
            f"invalid session id {session_id!r}",
            hint="use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit",
            code="invalid_session_id",
        )
    return session_id


class Record(NamedTuple):
    offset: int
    data: bytes
    digest: str


class WriterLease(Protocol):
    """Proof that this process is the one writer of a session; release it exactly once."""

    @property
    def session_id(self) -> str: ...

    async def release(self) -> None: ...


class LogStore(Protocol):
    async def append_records(
        self, *, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        """Store all records or none, durably, before returning.

        Raises ``AppendConflictError`` when the session's high-water mark is not
        ``expected_offset`` and ``CommitFailedError`` when the write itself failed (or the
        stored head could not be recorded after it), and ``CorruptLogError`` when the
        session's head record is missing or damaged.
        """
        ...

    async def read_records(self, *, session_id: str, start: int, end: int | None) -> list[Record]:
        """Records with ``start <= offset < end`` ordered by offset, as stored."""
        ...

    async def last_record(self, *, session_id: str) -> Record | None: ...

    async def stored_head(self, *, session_id: str) -> tuple[int, str] | None:
        """The ``(high_water, digest)`` recorded after the session's last append, kept where
        losing the newest records does not lose it too (DESIGN L8).

        ``EventLog`` reads it before the records, so it may lag the records (a crash
        between a commit and recording its head, or a backend that records heads at
        checkpoints, as the object store does) but never lead them. None for a session
        never written (or written before heads were recorded); raises ``CorruptLogError``
        (code ``head_missing`` or ``head_damaged``) when the session has records but its
        head is gone or unreadable.
        """
        ...

    def present(self) -> bool:
        """Whether this store's storage exists, checked without creating it (True when
        that cannot be known without a request): read-only commands pointed at the wrong
        place must say so, not leave fresh storage behind."""
        ...

    async def list_sessions(self) -> list[str]:
        """Sessions with records or with a head that names records (a session whose records
        were all lost is listed, so that reading it fails closed instead of vanishing)."""
        ...

    async def acquire_writer(self, *, session_id: str) -> WriterLease:
        """Raises ``SessionLockedError`` naming the holder when another writer has it."""
        ...

    async def close(self) -> None: ...


class ForwardingLogStore:
    """A store that hands every request to ``inner``: subclass it and override what a
    wrapper changes (a fence check before appends, injected failures) and nothing else."""

    def __init__(self, inner: LogStore) -> None:
        self.inner = inner

    async def append_records(
        self, *, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        await self.inner.append_records(
            session_id=session_id, records=records, expected_offset=expected_offset
        )

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

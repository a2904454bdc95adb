"""Revisioned session state: compare-and-swap on a revision number.

State a tool keeps for a session (a plan, a todo list, notes) needs no lock: a read
returns the value with its revision, and a write names the revision it was based on.
If another call wrote in between, the write is refused with ``StaleRevisionError``, a
``ToolCallError`` whose message tells the model to read again and retry, so two calls in
one batch can never silently overwrite each other.

>>> notes: RevisionStore[str] = RevisionStore(initial=str)
>>> current = notes.read("session-1")          # Revision(revision=0, value='')
>>> notes.write("session-1", "buy milk", expected_revision=0, owner="call-1").revision
1
>>> notes.write("session-1", "buy tea", expected_revision=0, owner="call-2")
Traceback (most recent call last):
StaleRevisionError: ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from lodger.authority.common import AuthorityStatistics, Holder
from lodger.errors import StaleRevisionError

__all__ = ["Revision", "RevisionStore"]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class Revision(Generic[T]):
    """A value and the revision it has; revision 0 is the initial value, never written."""

    revision: int
    value: T
    written_by: str | None = None


class RevisionStore(Generic[T]):
    """Values keyed by (say) session id, each with a revision that every write bumps.

    Values are kept as given, so store immutable ones (tuples, frozen models, strings).
    A read and a write are each atomic on the event loop; call them from async code, not
    from worker threads. The store lives in the process; each key's history is also in
    the log, in the calls that wrote it.
    """

    name = "revisions"

    def __init__(self, *, initial: Callable[[], T], what: str = "the state") -> None:
        self._initial = initial
        self.what = what
        self._values: dict[str, Revision[T]] = {}
        self._reads = 0
        self._writes = 0
        self._conflicts = 0

    def read(self, key: str) -> Revision[T]:
        self._reads += 1
        current = self._values.get(key)
        if current is None:
            return Revision(revision=0, value=self._initial())
        return current

    def write(self, key: str, value: T, *, expected_revision: int, owner: str) -> Revision[T]:
        """Store ``value`` as the next revision if ``expected_revision`` is still current."""
        current = self._values.get(key)
        revision = 0 if current is None else current.revision
        if expected_revision != revision:
            self._conflicts += 1
            by = f" (last written by call {current.written_by!r})" if current is not None else ""
            retry = f"read it again and redo your change on top of revision {revision}"
            # The retry advice is in the message too: it is what the model sees.
            raise StaleRevisionError(
                f"{self.what} is at revision {revision}, not {expected_revision}: "
                f"it changed since you read it{by}; nothing was written; {retry}",
                key=key,
                expected=expected_revision,
                current=revision,
                hint=retry,
            )
        written = Revision(revision=revision + 1, value=value, written_by=owner)
        self._values[key] = written
        self._writes += 1
        return written

    def statistics(self) -> AuthorityStatistics:
        """``acquisitions`` are successful writes, ``conflicts`` refused stale ones."""
        holders = tuple(
            Holder(owner=r.written_by or "", resources=(f"{key}@{r.revision}",), since=0.0)
            for key, r in self._values.items()
        )
        return AuthorityStatistics(
            authority=self.name,
            holders=holders,
            acquisitions=self._writes,
            conflicts=self._conflicts,
        )

    @property
    def reads(self) -> int:
        return self._reads

"""``History``: a session's verified events in offset order, some perhaps not decoded yet.

A fold opened from a checkpoint (``lodger.engine.checkpoint``) does not decode the events
the checkpoint covers: their records were read and their chain checked over every byte,
so each can be decoded when something reads it (a slice, an index, a scan back to the
start of the turn) and is kept once decoded. Events folded after that are held as they
come. Readers see one ``Sequence[Event]`` either way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from lodger.events import Event
from lodger.storage.eventlog import VerifiedRecords

__all__ = ["History"]

_CHUNK = 1_024  # records decoded together when a reader walks the undecoded part


class History(Sequence[Event]):
    """Events ``[0, len)``: the first ``base`` decoded on demand from ``verified`` (a
    verified read), the rest appended as they are folded."""

    __slots__ = ("_base", "_decoded", "_tail", "_verified")

    def __init__(self, verified: VerifiedRecords | None = None, base: int = 0) -> None:
        if verified is None:
            base = 0
        elif not 0 <= base <= len(verified):
            raise ValueError(f"base {base} is outside the verified records")
        self._verified = verified
        self._base = base
        self._decoded: list[Event | None] = [None] * base
        self._tail: list[Event] = []

    @property
    def undecoded_base(self) -> int:
        """How many leading events come from stored records rather than the fold."""
        return self._base

    def append(self, event: Event) -> None:
        self._tail.append(event)

    def digest_at(self, offset: int) -> str:
        """The digest of the event at ``offset``, without decoding it."""
        if offset < self._base:
            assert self._verified is not None
            return self._verified.records[offset].digest
        return self._tail[offset - self._base].digest

    def __len__(self) -> int:
        return self._base + len(self._tail)

    def _decode_range(self, start: int, stop: int) -> None:
        """Decode the undecoded events in ``[start, stop)`` (stop <= base) in chunks."""
        assert self._verified is not None
        decoded = self._decoded
        i = start
        while i < stop:
            if decoded[i] is not None:
                i += 1
                continue
            end = min(stop, i + _CHUNK)
            for j, event in enumerate(self._verified.decode(i, end), start=i):
                if decoded[j] is None:
                    decoded[j] = event
            i = end

    def _old(self, index: int) -> Event:
        event = self._decoded[index]
        if event is None:
            self._decode_range(index, index + 1)
            event = self._decoded[index]
            assert event is not None
        return event

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            if start >= stop:
                return []
            if start >= self._base:
                return self._tail[start - self._base : stop - self._base]
            self._decode_range(start, min(stop, self._base))
            old = self._decoded[start : min(stop, self._base)]
            return [*old, *self._tail[: max(0, stop - self._base)]]  # type: ignore[list-item]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("event offset out of range")
        if index < self._base:
            return self._old(index)
        return self._tail[index - self._base]

    def __iter__(self) -> Iterator[Event]:
        for begin in range(0, self._base, _CHUNK):
            yield from self[begin : min(begin + _CHUNK, self._base)]
        yield from self._tail

    def __reversed__(self) -> Iterator[Event]:
        yield from reversed(self._tail)
        for index in range(self._base - 1, -1, -1):
            yield self._old(index)

    def __bool__(self) -> bool:
        return len(self) > 0

    def as_list(self) -> list[Event]:
        """Every event, decoded (the whole log: O(log))."""
        return self[:]

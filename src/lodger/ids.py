"""Injected clocks and id factories.

Replayable code never calls ``time.time()`` or ``uuid4()`` directly: it asks the runtime
context for ``clock.now_us()`` and ``ids.new_id()``, so tests can fix both and recovery
never depends on wall time.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Protocol

__all__ = [
    "Clock",
    "IdFactory",
    "ManualClock",
    "SequentialIds",
    "SystemClock",
    "Uuid7Factory",
    "uuid7",
]


class Clock(Protocol):
    def now_us(self) -> int:
        """Microseconds since the Unix epoch."""
        ...


class IdFactory(Protocol):
    def new_id(self) -> str: ...


class SystemClock:
    def now_us(self) -> int:
        return time.time_ns() // 1000


class ManualClock:
    """A clock that moves only when told to; ``tick_us`` advances it on every read."""

    def __init__(self, start_us: int = 1_700_000_000_000_000, *, tick_us: int = 0) -> None:
        self._now = start_us
        self._tick = tick_us

    def now_us(self) -> int:
        value = self._now
        self._now += self._tick
        return value

    def advance(self, us: int) -> None:
        self._now += us


_MS_MASK = (1 << 48) - 1
_RAND_B_MASK = (1 << 62) - 1


def uuid7(unix_ms: int, rand: bytes) -> uuid.UUID:
    """Build a UUIDv7 (RFC 9562) from a millisecond timestamp and 10 random bytes."""
    if len(rand) != 10:
        raise ValueError("uuid7 needs exactly 10 random bytes")
    value = (unix_ms & ((1 << 48) - 1)) << 80
    value |= int.from_bytes(rand, "big") & ((1 << 80) - 1)
    value &= ~(0xF << 76)
    value |= 0x7 << 76  # version
    value &= ~(0x3 << 62)
    value |= 0x2 << 62  # RFC 4122 variant
    return uuid.UUID(int=value)


class Uuid7Factory:
    """UUIDv7 ids that sort by creation time, monotonic within one factory.

    Within one millisecond the 12-bit ``rand_a`` field is used as a counter so ids
    generated in a burst still sort in creation order.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0

    def new_id(self) -> str:
        with self._lock:
            ms = self._clock.now_us() // 1000
            if ms <= self._last_ms:
                ms = self._last_ms
                self._counter += 1
                if self._counter >= 1 << 12:
                    ms += 1
                    self._counter = 0
            else:
                self._counter = 0
            self._last_ms = ms
            counter = self._counter
        # The layout of ``uuid7`` (48-bit ms, version 7, the 12-bit counter as rand_a,
        # variant 0b10, 62 random bits), formatted directly: no UUID object on the hot path.
        value = (
            ((ms & _MS_MASK) << 80)
            | (0x7 << 76)
            | (counter << 64)
            | (0x2 << 62)
            | (int.from_bytes(os.urandom(8), "big") & _RAND_B_MASK)
        )
        h = f"{value:032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class SequentialIds:
    """Readable deterministic ids for tests: ``prefix-000001``, ``prefix-000002`` ..."""

    def __init__(self, prefix: str = "id") -> None:
        self._prefix = prefix
        self._n = 0
        self._lock = threading.Lock()

    def new_id(self) -> str:
        with self._lock:
            self._n += 1
            return f"{self._prefix}-{self._n:06d}"

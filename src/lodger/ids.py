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
#: a random hex digit -> the same digit under the RFC 9562 variant bits (0b10xx)
_VARIANT_DIGIT = {f"{n:x}": f"{0x8 | (n & 0x3):x}" for n in range(16)}


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


#: bumped in a forked child, so every factory there draws fresh randomness (a child that
#: went on with its parent's pool would repeat the parent's next ids)
_fork_generation = 0


def _forked() -> None:
    global _fork_generation
    _fork_generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)

_POOL_IDS = 128
#: the 12-bit counter as its three hex digits
_COUNTER_TEXT = [f"{n:03x}" for n in range(1 << 12)]


def _random_tails(count: int) -> list[str]:
    """``count`` id tails ``-vxxx-xxxxxxxxxxxx`` (16 random hex digits, the first kept
    to its 2 low bits under the variant 0b10), from one ``getrandom``."""
    hx = os.urandom(8 * count).hex()
    return [
        f"-{_VARIANT_DIGIT[hx[at]]}{hx[at + 1 : at + 4]}-{hx[at + 4 : at + 16]}"
        for at in range(0, 16 * count, 16)
    ]


class Uuid7Factory:
    """UUIDv7 ids that sort by creation time, monotonic within one factory.

    Within one millisecond the 12-bit ``rand_a`` field is used as a counter so ids
    generated in a burst still sort in creation order.

    The layout of ``uuid7`` (48-bit ms, version 7, the 12-bit counter as ``rand_a``,
    variant 0b10, 62 random bits), formatted directly: the time part's text is made once
    per millisecond, and the random tails are made in blocks of 128 ids from one
    ``getrandom`` (one per id cost a fifth of an id), drawn again after a fork.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        # the system clock read directly (a method call less per id)
        self._time_ns = time.time_ns if type(self._clock) is SystemClock else None
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0
        self._prefix = ""
        self._tails: list[str] = []
        self._generation = _fork_generation

    def new_id(self) -> str:
        with self._lock:
            time_ns = self._time_ns
            ms = time_ns() // 1_000_000 if time_ns is not None else self._clock.now_us() // 1000
            if ms > self._last_ms:
                self._last_ms, counter = ms, 0
                h = f"{ms & _MS_MASK:012x}"
                self._prefix = f"{h[:8]}-{h[8:]}-7"
            else:
                counter = self._counter + 1
                if counter >= 1 << 12:
                    self._last_ms += 1
                    counter = 0
                    h = f"{self._last_ms & _MS_MASK:012x}"
                    self._prefix = f"{h[:8]}-{h[8:]}-7"
            self._counter = counter
            tails = self._tails
            if not tails or self._generation != _fork_generation:
                tails = self._tails = _random_tails(_POOL_IDS)
                self._generation = _fork_generation
            return self._prefix + _COUNTER_TEXT[counter] + tails.pop()


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

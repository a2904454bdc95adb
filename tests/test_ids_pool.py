"""The pooled randomness of ``Uuid7Factory``: every id valid, none repeated, and a forked
child never replays its parent's pool."""

from __future__ import annotations

import os
import uuid

from lodger.ids import ManualClock, Uuid7Factory


def test_ids_across_many_pool_refills_are_valid_and_distinct() -> None:
    factory = Uuid7Factory()
    ids = [factory.new_id() for _ in range(5000)]  # ~40 refills of the pool
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    for value in ids:
        parsed = uuid.UUID(value)
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
        assert str(parsed) == value


def test_the_random_bits_are_random() -> None:
    """Same millisecond, same counter (two factories): only the 62 random bits differ,
    and each of them takes both values across a few hundred ids."""
    values = [
        uuid.UUID(Uuid7Factory(ManualClock(1_700_000_000_000_000)).new_id()).int for _ in range(400)
    ]
    assert len(set(values)) == len(values)
    for bit in range(62):
        seen = {(v >> bit) & 1 for v in values}
        assert seen == {0, 1}, bit
    assert {(v >> 62) & 0x3 for v in values} == {0b10}


def test_a_forked_child_draws_fresh_randomness() -> None:
    factory = Uuid7Factory(ManualClock(1_700_000_000_000_000))
    factory.new_id()  # the pool is filled now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, factory.new_id().encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = factory.new_id()
    # the same clock and the same counter: only the random part may tell them apart
    assert child[:19] == parent[:19]
    assert child != parent


def test_system_clock_ids_carry_the_current_millisecond() -> None:
    """The default factory reads the system clock itself: its ids hold the time they
    were made at, and a burst within a millisecond still counts up."""
    import time

    factory = Uuid7Factory()
    before = time.time_ns() // 1_000_000
    ids = [factory.new_id() for _ in range(300)]
    after = time.time_ns() // 1_000_000
    stamps = [uuid.UUID(value).int >> 80 for value in ids]
    assert before <= stamps[0] <= stamps[-1] <= after + 1
    assert ids == sorted(ids) and len(set(ids)) == len(ids)

"""Injected ids and clocks: UUIDv7 layout, monotonic factories, deterministic test ids."""

from __future__ import annotations

import threading
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lodger.ids import ManualClock, SequentialIds, SystemClock, Uuid7Factory, uuid7

START_US = 1_700_000_000_123_456


def ms_of(value: str | uuid.UUID) -> int:
    return uuid.UUID(str(value)).int >> 80


def counter_of(value: str) -> int:
    return (uuid.UUID(value).int >> 64) & 0xFFF


@given(
    st.integers(min_value=0, max_value=2**48 - 1),
    st.binary(min_size=10, max_size=10),
)
def test_uuid7_layout(unix_ms: int, rand: bytes) -> None:
    value = uuid7(unix_ms, rand)
    assert value.version == 7
    assert value.variant == uuid.RFC_4122
    assert (value.int >> 76) & 0xF == 0x7
    assert (value.int >> 62) & 0x3 == 0b10
    assert ms_of(value) == unix_ms
    # every random bit outside the version and variant fields survives
    kept = ~((0xF << 76) | (0x3 << 62)) & ((1 << 80) - 1)
    assert value.int & kept == int.from_bytes(rand, "big") & kept


def test_uuid7_sorts_by_time() -> None:
    early = uuid7(1_000, b"\xff" * 10)
    late = uuid7(1_001, b"\x00" * 10)
    assert str(early) < str(late)


@pytest.mark.parametrize("size", [0, 9, 11])
def test_uuid7_needs_ten_random_bytes(size: int) -> None:
    with pytest.raises(ValueError, match="10 random bytes"):
        uuid7(1, bytes(size))


def test_factory_is_monotonic_within_one_millisecond() -> None:
    factory = Uuid7Factory(ManualClock(START_US))  # the clock never moves
    ids = [factory.new_id() for _ in range(1000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert {ms_of(i) for i in ids} == {START_US // 1000}
    assert [counter_of(i) for i in ids] == list(range(1000))
    for value in ids:
        parsed = uuid.UUID(value)
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
        assert str(parsed) == value  # the canonical lowercase, dashed form


def test_factory_borrows_the_next_millisecond_when_the_counter_runs_out() -> None:
    factory = Uuid7Factory(ManualClock(START_US))
    ids = [factory.new_id() for _ in range(5000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert ms_of(ids[4095]) == START_US // 1000
    assert ms_of(ids[4096]) == START_US // 1000 + 1
    assert counter_of(ids[4096]) == 0


def test_factory_restarts_the_counter_when_time_moves_on() -> None:
    clock = ManualClock(START_US)
    factory = Uuid7Factory(clock)
    first = [factory.new_id() for _ in range(3)]
    clock.advance(1_000)
    later = factory.new_id()
    assert later > first[-1]
    assert ms_of(later) == START_US // 1000 + 1
    assert counter_of(later) == 0


def test_factory_stays_monotonic_when_the_clock_goes_back() -> None:
    clock = ManualClock(START_US)
    factory = Uuid7Factory(clock)
    before = factory.new_id()
    clock.advance(-5_000_000)
    after = factory.new_id()
    assert after > before
    assert ms_of(after) == ms_of(before)


def test_factory_is_monotonic_across_threads() -> None:
    factory = Uuid7Factory(ManualClock(START_US, tick_us=7))
    per_thread: list[list[str]] = [[] for _ in range(4)]

    def work(out: list[str]) -> None:
        out.extend(factory.new_id() for _ in range(500))

    threads = [threading.Thread(target=work, args=(out,)) for out in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [i for out in per_thread for i in out]
    assert len(set(everything)) == 2000
    for out in per_thread:  # each thread sees its own ids in creation order
        assert out == sorted(out)


def test_factory_defaults_to_the_system_clock() -> None:
    before_ms = SystemClock().now_us() // 1000
    value = Uuid7Factory().new_id()
    after_ms = SystemClock().now_us() // 1000
    assert before_ms <= ms_of(value) <= after_ms


def test_manual_clock() -> None:
    clock = ManualClock(100, tick_us=10)
    assert [clock.now_us() for _ in range(3)] == [100, 110, 120]
    clock.advance(1_000)
    assert clock.now_us() == 1_130
    still = ManualClock(5)
    assert still.now_us() == still.now_us() == 5


def test_sequential_ids() -> None:
    ids = SequentialIds()
    assert [ids.new_id() for _ in range(3)] == ["id-000001", "id-000002", "id-000003"]
    calls = SequentialIds("call")
    assert calls.new_id() == "call-000001"
    assert ids.new_id() == "id-000004"  # factories count independently


def test_sequential_ids_are_unique_across_threads() -> None:
    ids = SequentialIds("t")
    seen: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [ids.new_id() for _ in range(1000)]
        with lock:
            seen.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == [f"t-{n:06d}" for n in range(1, 4001)]

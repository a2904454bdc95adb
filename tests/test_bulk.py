"""``cycle_collector_paused``: bulk work without collections, and nothing lost by it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from lodger._core.bulk import cycle_collector_paused


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_for_a_bulk_block_and_enabled_after() -> None:
    with cycle_collector_paused(5_000):
        assert not gc.isenabled()
    assert gc.isenabled()
    with cycle_collector_paused(10):  # a small block is not worth pausing for
        assert gc.isenabled()


def test_survivors_go_straight_to_the_oldest_generation() -> None:
    with cycle_collector_paused(5_000):
        kept = [Node() for _ in range(5_000)]
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(node) in oldest for node in kept)
    assert gc.get_count()[0] < 100  # no young objects left to traverse
    assert gc.get_freeze_count() == 0  # moved, not frozen


def test_a_cycle_made_while_paused_is_still_collected() -> None:
    with cycle_collector_paused(5_000):
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
    assert gone() is not None  # only the cycle detector can free it
    gc.collect()
    assert gone() is None


def test_objects_the_program_froze_stay_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with cycle_collector_paused(5_000):
            _ = [Node() for _ in range(100)]
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()

"""Pausing the cycle collector around bulk work that creates no reference cycles.

Reading a long log or classifying its calls creates hundreds of thousands of small,
acyclic objects while the events already decoded stay alive. Each automatic collection
then rescans the whole growing heap, which makes the work superlinear (measured on 100k
events: three quarters of a read, and most of a recovery plan). Refcounting still frees
everything as usual; only the cycle detector waits until the work is done.

When the work is done, what it left alive is moved straight to the oldest generation
(``gc.freeze()`` then ``gc.unfreeze()``: two list splices, no traversal). Otherwise the
first young collections after the pause traverse every object made during it, once as
generation 0 and again as generation 1: measured on `lodger resume` of a 100k-event
session, 1.2 s of a 3.5 s run. Nothing is kept from collection: the objects are
ordinary old objects, and a later full collection still finds any cycle among them. That
full collection may come later than it would have (CPython schedules one by the objects
young collections promoted, and these were not promoted that way); what the fold keeps
holds no cycle, so a dropped fold is freed by refcounting at once.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["cycle_collector_paused"]


def cycle_collector_paused(
    count: int, *, threshold: int = 2_000
) -> contextlib.AbstractContextManager[None]:
    """Pause automatic collection for the block when ``count`` items will be processed.

    Below ``threshold`` (every append of a run: the fold takes each batch) the block
    runs as it is, through a shared no-op context: no generator per call."""
    if count < threshold or not gc.isenabled():
        return _AS_IS
    return _paused()


_AS_IS: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


@contextlib.contextmanager
def _paused() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        _age_young_objects()
        gc.enable()


def _age_young_objects() -> None:
    """Move every tracked object to the oldest generation without traversing any.

    Skipped when the program froze objects itself (``gc.freeze`` before a fork, say):
    unfreezing would hand its frozen objects back to the collector.
    """
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()

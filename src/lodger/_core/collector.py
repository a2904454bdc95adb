"""The cycle collector's schedule in processes lodger owns, never in a library user's.

CPython runs a young collection every 700 net allocations of tracked objects. Every
object alive at that moment is traversed and, if it survives, promoted; whatever reaches
the oldest generation counts towards the next full collection, which traverses the
whole heap. A durable call leaves ~28 tracked objects in its session's fold, and with
many sessions in flight each call's own objects are alive for tens of milliseconds
(they wait on a group commit), so most of them survive a young collection or two. At 64
concurrent sessions on one store that was 90-110 us of the loop's CPU per call, most of
it in full collections (``bench/concurrent_sessions.py`` prints it).

A process lodger runs itself (the ``lodger`` command: ``run``, ``resume``, ``serve``,
``worker`` and the rest) therefore collects the young generation every
``YOUNG_THRESHOLD`` allocations instead: a young collection then finds far fewer of
the objects still alive that will die anyway, and fewer reach the oldest generation.
Nothing is exempt from collection (no ``gc.freeze``: the bulk reads of
``lodger._core.bulk`` age their objects by freezing and unfreezing, which a frozen
start-up would forbid), and cycles are still found, a little later. The older
generations keep CPython's thresholds, so no collection traverses more than a young
generation's worth of objects more often than before.

The library leaves the collector as the program set it: a program embedding
``lodger.Agent`` owns its process. ``LODGER_COLLECTOR=default`` keeps CPython's
schedule in lodger's own processes too (to compare both in one run).
"""

from __future__ import annotations

import gc
import os

__all__ = ["YOUNG_THRESHOLD", "tune_owned_process"]

#: net tracked allocations between young collections in a process lodger owns
YOUNG_THRESHOLD = 50_000


def tune_owned_process(environ: dict[str, str] | None = None) -> bool:
    """Collect the young generation every ``YOUNG_THRESHOLD`` allocations; the older
    generations keep their thresholds. Call it only from an entry point that owns its
    process (the ``lodger`` command's own command line, not a test runner calling it).
    Returns whether the schedule was changed (not with ``LODGER_COLLECTOR=default``,
    nor when the young threshold is already at least as high, nor with the collector
    off)."""
    env = os.environ if environ is None else environ
    if env.get("LODGER_COLLECTOR", "").strip().lower() == "default":
        return False
    young, middle, old = gc.get_threshold()
    if young == 0 or young >= YOUNG_THRESHOLD or not gc.isenabled():
        return False
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return True

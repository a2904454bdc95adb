"""The batch of one step: one task per call, a slot per call, nothing left behind.

The calls a model emits in one step are independent by contract, so they run together.
The batch does not decide conflicts (the authorities do, see :mod:`lodger.authority`);
it owns the tasks and guarantees three things:

- it returns only when every call has completed, was cancelled before T1, or reached a
  recorded state: no task outlives it (structured concurrency, ``asyncio.TaskGroup``);
- cancelling it cancels every call; a call that is still ``queued`` (before T1) stops
  where it is, a call that was ``dispatched`` settles and records its T2 first;
- a failed commit (T1, T2 or any fact) ``stop``s it: the calls still queued are
  cancelled and never dispatched, dispatched calls settle, and ``run`` raises the first
  ``CommitFailedError`` once everything has settled.

Outcomes come back in the model's emission order, whatever order the calls finished in.

>>> batch = Batch(["call-1", "call-2"])
>>> outcomes = await batch.run(run_one)   # run_one(slot) marks slot.dispatch() at T1
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from lodger.errors import CommitFailedError

__all__ = ["Batch", "Phase", "Slot"]

T = TypeVar("T")

Phase = Literal["queued", "dispatched", "settled", "cancelled", "failed"]


@dataclass(eq=False)
class Slot(Generic[T]):
    """One call's place in the batch: its emission index, its phase and its outcome."""

    index: int
    call_id: str
    phase: Phase = "queued"
    outcome: T | None = None

    def dispatch(self) -> None:
        """Mark the point of no return: from here the call is never abandoned."""
        if self.phase != "queued":
            raise RuntimeError(f"call {self.call_id!r} is {self.phase}, it cannot be dispatched")
        self.phase = "dispatched"


class Batch(Generic[T]):
    """Runs one step's calls as one structured group of tasks (see the module docstring)."""

    def __init__(self, call_ids: Sequence[str]) -> None:
        self.slots: list[Slot[T]] = [Slot(i, call_id) for i, call_id in enumerate(call_ids)]
        self.halt = asyncio.Event()
        self.failures: list[CommitFailedError] = []
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def stopped(self) -> bool:
        return self.halt.is_set()

    async def run(self, run_one: Callable[[Slot[T]], Awaitable[T]]) -> list[T]:
        """Run every slot; outcomes in emission order, or the first commit failure."""
        if self._tasks:
            raise RuntimeError("a batch runs once")
        async with asyncio.TaskGroup() as group:
            # All tasks exist before any runs: stop() can always reach every queued call.
            self._tasks = [
                group.create_task(self._one(slot, run_one), name=f"lodger call {slot.call_id}")
                for slot in self.slots
            ]
        if self.failures:
            raise self.failures[0]
        outcomes: list[T] = []
        for slot in self.slots:
            assert slot.outcome is not None, slot  # every task ended with an outcome
            outcomes.append(slot.outcome)
        return outcomes

    def stop(self) -> None:
        """Freeze the batch: queued calls are cancelled before T1, dispatched ones settle."""
        if self.halt.is_set():
            return
        self.halt.set()
        for slot, task in zip(self.slots, self._tasks, strict=True):
            if slot.phase == "queued" and task is not asyncio.current_task():
                task.cancel()

    async def _one(self, slot: Slot[T], run_one: Callable[[Slot[T]], Awaitable[T]]) -> None:
        try:
            slot.outcome = await run_one(slot)
        except CommitFailedError as exc:
            slot.phase = "failed"
            self.failures.append(exc)
            self.stop()
            return
        except asyncio.CancelledError:
            # Queued: it stopped before T1. Dispatched: it settled and recorded its T2.
            slot.phase = "cancelled" if slot.phase == "queued" else "settled"
            raise
        slot.phase = "settled"

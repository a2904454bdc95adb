"""The store's I/O thread: order, errors, cancellation, close."""

from __future__ import annotations

import asyncio
import threading

import pytest

from lodger.errors import UsageError
from lodger.storage._worker import IoThread


async def test_calls_run_off_the_loop_in_submission_order() -> None:
    io = IoThread("t")
    seen: list[int] = []
    loop_thread = threading.get_ident()

    def job(n: int) -> int:
        assert threading.get_ident() != loop_thread
        seen.append(n)
        return n * 2

    results = await asyncio.gather(*(io.run(lambda n=n: job(n)) for n in range(20)))
    assert results == [n * 2 for n in range(20)]
    assert seen == list(range(20))
    await io.close()


async def test_errors_reach_the_caller_and_the_thread_survives() -> None:
    io = IoThread("t")

    def boom() -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        await io.run(boom)
    assert await io.run(lambda: 7) == 7
    await io.close()


async def test_a_cancelled_caller_does_not_stop_the_call() -> None:
    io = IoThread("t")
    release = threading.Event()
    done: list[str] = []

    def slow() -> None:
        release.wait(5)
        done.append("ran")

    task = asyncio.create_task(io.run(slow))
    await asyncio.sleep(0.01)
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    await io.close()  # drains: the call finished
    assert done == ["ran"]


async def test_close_drains_and_then_refuses() -> None:
    io = IoThread("t")
    await io.run(lambda: None)
    await io.close()
    await io.close()  # twice is fine
    with pytest.raises(UsageError, match="closed"):
        await io.run(lambda: None)

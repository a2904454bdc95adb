"""``finish_shielded``: a suspended coroutine driven to its end in the caller's task.

What the journal relies on when an append waits (on the I/O thread, say): cancelling the
caller reaches neither the append nor the future it waits on; the outcome says the
caller was cancelled, and the append's value or error is never lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from lodger._core.eager import Finished, ShieldableFuture, finish_shielded


def plain(loop: asyncio.AbstractEventLoop) -> asyncio.Future[str]:
    return loop.create_future()


def shieldable(loop: asyncio.AbstractEventLoop) -> asyncio.Future[str]:
    return ShieldableFuture(loop=loop)


#: a plain future is waited on through a proxy; a ``ShieldableFuture`` directly
futures = pytest.mark.parametrize("make", [plain, shieldable])


async def drive(coro: Coroutine[Any, Any, Any]) -> Finished[Any]:
    """Start ``coro`` in this task and finish it shielded (as ``Journal._append`` does)."""
    try:
        first = coro.send(None)
    except StopIteration as stop:
        return Finished(stop.value, None, False)
    return await finish_shielded(coro, first)


async def waits_for(future: asyncio.Future[str], log: list[str]) -> str:
    log.append("started")
    try:
        value = await future
    except asyncio.CancelledError:
        log.append("cancelled inside")  # must never happen
        raise
    log.append("finished")
    return value + "!"


@futures
async def test_a_cancelled_caller_waits_and_the_append_is_not_cancelled(make: Any) -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[str] = make(loop)
    log: list[str] = []
    caller = asyncio.create_task(drive(waits_for(future, log)))
    await asyncio.sleep(0)
    assert log == ["started"]
    caller.cancel()
    await asyncio.sleep(0)
    caller.cancel()  # asked twice: still waits
    await asyncio.sleep(0)
    assert not caller.done() and not future.cancelled()
    future.set_result("done")
    outcome = await caller
    assert outcome == Finished("done!", None, True)
    assert log == ["started", "finished"]


@futures
async def test_a_cancellation_that_arrives_with_the_result_is_noted(make: Any) -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[str] = make(loop)
    caller = asyncio.create_task(drive(waits_for(future, [])))
    await asyncio.sleep(0)
    future.set_result("x")  # the proxy's wake-up is only scheduled ...
    caller.cancel()  # ... when the cancellation arrives
    assert await caller == Finished("x!", None, True)


@futures
async def test_without_a_cancellation_the_value_comes_back(make: Any) -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[str] = make(loop)
    loop.call_later(0.01, future.set_result, "late")
    assert await drive(waits_for(future, [])) == Finished("late!", None, False)


async def test_errors_of_the_coroutine_are_the_outcome_not_raised() -> None:
    async def fails() -> None:
        await asyncio.sleep(0)  # a bare yield is passed through
        await asyncio.sleep(0.001)
        raise OSError("disk full")

    outcome = await drive(fails())
    assert isinstance(outcome.error, OSError) and not outcome.cancelled

    async def cancels_itself() -> None:
        await asyncio.sleep(0)
        raise asyncio.CancelledError

    outcome = await drive(cancels_itself())
    assert isinstance(outcome.error, asyncio.CancelledError) and not outcome.cancelled


async def test_a_caller_cancelled_during_a_bare_yield_is_noted() -> None:
    steps: list[int] = []

    async def yields_twice() -> int:
        for i in range(2):
            steps.append(i)
            await asyncio.sleep(0)
        return 2

    caller = asyncio.create_task(drive(yields_twice()))
    await asyncio.sleep(0)
    caller.cancel()
    assert await caller == Finished(2, None, True)
    assert steps == [0, 1]


async def test_an_unknown_yield_is_thrown_back_into_the_coroutine() -> None:
    class Odd:
        def __await__(self):  # type: ignore[no-untyped-def]
            yield "not a future"

    async def odd() -> None:
        await Odd()

    outcome = await drive(odd())
    assert isinstance(outcome.error, RuntimeError)
    with pytest.raises(RuntimeError, match="yielded 'not a future'"):
        raise outcome.error


@futures
async def test_the_error_of_the_future_reaches_the_coroutine(make: Any) -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[str] = make(loop)
    log: list[str] = []

    async def catches() -> str:
        try:
            await future
        except OSError as exc:
            log.append(str(exc))
            return "caught"
        return "no error"

    caller = asyncio.create_task(drive(catches()))
    await asyncio.sleep(0)
    caller.cancel()
    future.set_exception(OSError("disk full"))
    assert await caller == Finished("caught", None, True)
    assert log == ["disk full"]


async def test_a_shieldable_future_is_waited_on_directly_and_refuses_cancel_meanwhile() -> None:
    loop = asyncio.get_running_loop()
    future: ShieldableFuture[str] = ShieldableFuture(loop=loop)
    caller = asyncio.create_task(drive(waits_for(future, [])))
    await asyncio.sleep(0)
    assert future.shielded and future.cancel() is False
    caller.cancel()
    await asyncio.sleep(0)
    assert not future.done() and not caller.done()
    future.set_result("v")
    await asyncio.sleep(0)  # the task's own wake-up: no proxy in between
    assert caller.done()
    assert caller.result() == Finished("v!", None, True)
    assert not future.shielded
    other: ShieldableFuture[str] = ShieldableFuture(loop=loop)
    assert other.cancel() and other.cancelled()  # not waited on: a plain future

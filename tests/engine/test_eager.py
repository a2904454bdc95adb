"""Starting a coroutine eagerly behaves like a task: outcome, context, cancellation."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from lodger._core.eager import start_eagerly

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="caller")


async def test_a_coroutine_that_never_waits_is_done_at_once_without_a_task() -> None:
    async def quick() -> int:
        VAR.set("inside")  # in its own context, as a task's would be
        return 7

    future = start_eagerly(quick())
    assert future.done() and not isinstance(future, asyncio.Task)
    assert future.result() == 7
    assert VAR.get() == "caller"


async def test_errors_and_cancellation_of_the_first_step_are_its_outcome() -> None:
    async def broken() -> None:
        raise ValueError("bad")

    async def gives_up() -> None:
        raise asyncio.CancelledError

    failed = start_eagerly(broken())
    assert isinstance(failed.exception(), ValueError)
    assert start_eagerly(gives_up()).cancelled()


async def test_one_that_waits_continues_in_a_task_in_the_same_context() -> None:
    gate = asyncio.Event()
    seen: list[str] = []

    async def slow() -> str:
        VAR.set("inside")
        await gate.wait()
        seen.append(VAR.get())
        return "done"

    future = start_eagerly(slow())
    assert isinstance(future, asyncio.Task) and not future.done()
    gate.set()
    assert await future == "done"
    assert seen == ["inside"] and VAR.get() == "caller"


async def test_cancelling_the_task_reaches_the_coroutine_where_it_waits() -> None:
    steps: list[str] = []

    async def settles() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            steps.append("cancelled")
            await asyncio.sleep(0)  # it may still wait while settling
            steps.append("settled")
            return "settled"
        return "never"

    future = start_eagerly(settles())
    await asyncio.sleep(0)
    future.cancel()
    assert await future == "settled"
    assert steps == ["cancelled", "settled"]

    async def stops() -> None:
        await asyncio.Event().wait()

    stopped = start_eagerly(stops())
    stopped.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopped

"""Start a coroutine at once, in the caller's task, and give it a task only if it waits.

Most calls on the hot path finish without ever suspending (a no-op tool, an append to
the memory store). A task for them costs its creation, a trip through the event loop to
start and another to report back. ``first_step`` runs the coroutine's first step now;
when it suspends, ``continue_in_task`` hands the rest to a task, which then behaves as
if it had run the coroutine from the start (what it yields goes to the task, what the
task sends or throws in, a cancellation included, goes back to the coroutine).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import types
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

__all__ = ["Finished", "ShieldableFuture", "continue_in_task", "finish_shielded", "start_eagerly"]

T = TypeVar("T")


def start_eagerly(
    coro: Coroutine[Any, Any, T], *, context: contextvars.Context | None = None
) -> asyncio.Future[T]:
    """A future of ``coro``'s outcome: already done when its first step finished it, else
    the task running the rest. ``context`` (a fresh copy when None) is the one the first
    step and the task run in, as a task's would be."""
    loop = asyncio.get_running_loop()
    ctx = context if context is not None else contextvars.copy_context()
    try:
        yielded = ctx.run(coro.send, None)
    except StopIteration as stop:
        done: asyncio.Future[T] = loop.create_future()
        done.set_result(cast(T, stop.value))
        return done
    except asyncio.CancelledError:
        done = loop.create_future()
        done.cancel()
        return done
    except (KeyboardInterrupt, SystemExit):
        raise  # as a task would: these stop the loop
    except BaseException as exc:  # noqa: BLE001 - the outcome, as a task would keep it
        done = loop.create_future()
        done.set_exception(exc)
        return done
    return continue_in_task(coro, yielded, context=ctx)


def continue_in_task(
    coro: Coroutine[Any, Any, T], yielded: Any, *, context: contextvars.Context | None = None
) -> asyncio.Task[T]:
    """The task that drives the rest of ``coro``, started by hand and suspended at
    ``yielded``."""
    return asyncio.get_running_loop().create_task(_resume(coro, yielded), context=context)


async def _resume(coro: Coroutine[Any, Any, T], yielded: Any) -> T:
    return await _finish(coro, yielded)


@types.coroutine
def _finish(coro: Coroutine[Any, Any, T], yielded: Any) -> Generator[Any, Any, T]:
    while True:
        try:
            sent = yield yielded
        except BaseException as exc:  # noqa: BLE001 - thrown in by the task: handed on
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return cast(T, stop.value)
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return cast(T, stop.value)


@dataclass(slots=True)
class Finished(Generic[T]):
    """How a coroutine driven by ``finish_shielded`` ended: its value or its error, and
    whether the task driving it was cancelled meanwhile."""

    value: T | None
    error: BaseException | None
    cancelled: bool


class ShieldableFuture(asyncio.Future[T]):
    """A future that ``finish_shielded`` can wait on directly, without a proxy.

    While ``shielded`` (set by ``finish_shielded`` as it waits on it) the future refuses
    to be cancelled: a cancellation of the waiting task then only marks the task, which
    asyncio delivers once the future is done. Everywhere else it is a plain future.
    Whoever settles it must always settle it (a store's I/O thread answering an append),
    since a shielded waiter waits for it whatever happens to its task.
    """

    shielded = False

    def cancel(self, msg: Any | None = None) -> bool:
        if self.shielded:
            return False
        return super().cancel(msg)


def _wake(proxy: asyncio.Future[None], _: object) -> None:
    if not proxy.done():
        proxy.set_result(None)


@types.coroutine
def finish_shielded(coro: Coroutine[Any, Any, T], yielded: Any) -> Generator[Any, Any, Finished[T]]:
    """Drive the rest of ``coro`` (suspended at ``yielded``) to its end in this task.

    A cancellation of this task meanwhile reaches neither ``coro`` nor the future it
    waits on: the task waits through a proxy future, which is all a cancellation
    cancels, or on a ``ShieldableFuture`` itself, which refuses it; it is noted in the
    outcome and the caller raises it once it has used the
    outcome. That is what awaiting a task through ``asyncio.shield`` until it is done
    gives, without the task, the shield and their two extra trips through the event loop
    per suspension. What ``coro`` raises (a ``CancelledError`` of its own included) is
    the outcome's ``error``, never raised here.
    """
    loop = asyncio.get_running_loop()
    cancelled = False
    while True:
        if yielded is None:  # a bare yield (``asyncio.sleep(0)``): one turn of the loop
            try:
                yield None
            except asyncio.CancelledError:
                cancelled = True
        elif type(yielded) is ShieldableFuture and not yielded.done():
            # the task waits on the future itself, which refuses the task's cancellation
            # meanwhile: one trip through the event loop fewer than through a proxy
            yielded.shielded = True
            yielded._asyncio_future_blocking = True  # the task's to wait on
            try:
                yield yielded
            except asyncio.CancelledError:
                cancelled = True  # delivered once the future was done
            except GeneratorExit:
                raise
            except BaseException:  # noqa: BLE001 - the future's own error, which coro gets
                pass
            finally:
                yielded.shielded = False
            if not yielded.done():  # woken before the future was done: wait again
                continue
        elif asyncio.isfuture(yielded):
            yielded._asyncio_future_blocking = False  # waited on here, not by the task
            while not yielded.done():
                proxy: asyncio.Future[None] = loop.create_future()
                wake = functools.partial(_wake, proxy)
                yielded.add_done_callback(wake)
                try:
                    yield from proxy
                except asyncio.CancelledError:
                    cancelled = True
                finally:
                    yielded.remove_done_callback(wake)
        else:
            error = RuntimeError(f"a coroutine driven in a task yielded {yielded!r}")
            try:
                yielded = coro.throw(error)
            except StopIteration as stop:
                return Finished(cast(T, stop.value), None, cancelled)
            except BaseException as exc:  # noqa: BLE001 - the outcome
                return Finished(None, exc, cancelled)
            continue
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            return Finished(cast(T, stop.value), None, cancelled)
        except BaseException as exc:  # noqa: BLE001 - the outcome, for the caller to judge
            return Finished(None, exc, cancelled)

"""A dedicated thread for a store's blocking calls (SQLite, fsync, file locks).

Calls run one at a time, in the order they were submitted, off the event loop. The
handoff is one ``SimpleQueue.put`` and one ``call_soon_threadsafe``: on the 2-core
machines we measure on this costs about 40 us a call, against about 110 us through
``loop.run_in_executor`` with a one-worker ``ThreadPoolExecutor`` (``bench/log_append.py``
is dominated by it: a durable append is one fsync plus this hop).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

from lodger.errors import UsageError

__all__ = ["IoThread"]

T = TypeVar("T")

_Job = tuple["asyncio.AbstractEventLoop | None", "asyncio.Future[Any] | None", Callable[[], Any]]


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled; the call still ran to its end
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class IoThread:
    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: SimpleQueue[_Job | None] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._start_lock = threading.Lock()

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the thread and return (or raise) what it did."""
        if self._closed:
            raise UsageError("this log store is closed", hint="open a new one", code="store_closed")
        self._ensure_started()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((loop, future, fn))
        return await future

    def post(self, fn: Callable[[], None]) -> None:
        """Queue ``fn`` behind every call submitted so far, with nobody awaiting it: it
        answers its own callers (the store's group commit resolves each waiter itself)."""
        if self._closed:
            raise UsageError("this log store is closed", hint="open a new one", code="store_closed")
        self._ensure_started()
        self._queue.put((None, None, fn))

    def _ensure_started(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
                self._thread.start()

    def _main(self) -> None:
        while (job := self._queue.get()) is not None:
            loop, future, fn = job
            if loop is None or future is None:
                fn()  # a posted job answers its own callers and raises nothing
                continue
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                error = exc
            # a closed loop raises RuntimeError: nobody is waiting for this call any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, future, result, error)

    async def close(self) -> None:
        """Finish every submitted call, then stop the thread."""
        if self._closed:
            return
        thread = self._thread
        if thread is not None:
            await self.run(lambda: None)  # everything before it has run
        self._closed = True
        self._queue.put(None)
        if thread is not None:
            await asyncio.to_thread(thread.join)

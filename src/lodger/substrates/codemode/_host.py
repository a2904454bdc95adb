"""The host side of a running cell: how its nested calls reach the pipeline.

Both substrates hand every ``tools.NAME(args)`` to one ``CellHost``. It enforces the
cell's call budget and concurrency, refuses tools a cell may not call, and runs each
nested call through ``ToolContext.nested`` (the pipeline's whole path: binding, schema,
permission, resources, T1, T2). What crosses back into the interpreter is a plain JSON
reply written here, never a Python exception: tracebacks and host paths stay outside.

A refusal (unknown or non-nestable tool), an exceeded limit or a failed commit stops the
cell: ``stopped`` is set and the exec tool ends the cell with a diagnostic (or, for a
failed commit, lets running nested calls settle and fails the turn).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any

from lodger.errors import CommitFailedError
from lodger.substrates.codemode.limits import CellLimits, LimitName
from lodger.tools.spec import NestedCaller

__all__ = ["CellHost", "Reply"]

Reply = dict[str, Any]
"""``{"ok": value}`` or ``{"error": {"code": ..., "message": ...}}``."""


def _error(code: str, message: str) -> Reply:
    return {"error": {"code": code, "message": message}}


class CellHost:
    def __init__(self, nested: NestedCaller, limits: CellLimits) -> None:
        self._nested = nested
        self._limits = limits
        self._callable = {t.name for t in nested.callable_tools()}
        self._slots = asyncio.Semaphore(limits.nested_in_flight)
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0
        #: the first reason the cell must stop, as (code, detail)
        self.stop_reason: tuple[str, str] | None = None
        #: the tool a refusal that stopped the cell named
        self.stop_tool: str | None = None
        self.exceeded: LimitName | None = None
        self.failure: CommitFailedError | None = None
        self.stopped = asyncio.Event()
        #: one line per nested call, in start order: (call id or "", tool, status)
        self.outcomes: list[tuple[str, str, str]] = []

    def names(self) -> list[str]:
        """Names a cell may try: the callable tools, plus bound ones it will be refused."""
        return sorted(self._callable | set(self._nested.bound_names()))

    def stop(self, code: str, detail: str, *, tool: str | None = None) -> None:
        if self.stop_reason is None:
            self.stop_reason = (code, detail)
            self.stop_tool = tool
        self.stopped.set()

    async def call(self, name: str, arguments: Any) -> Reply:
        """One nested call, answered as a JSON reply (never raises for the tool's faults)."""
        if self.stopped.is_set():
            return _error("cell_stopped", "the cell is stopping; no further tool call starts")
        if name not in self._callable:
            bound = self._nested.tool(name)
            if bound is None:
                code, why = "unknown_tool", f"no tool named {name!r} is bound"
            elif not bound.nestable:
                code, why = "not_nestable", f"tool {name!r} cannot be called from a cell"
            else:
                code, why = (
                    "not_activated",
                    (
                        f"tool {name!r} is deferred; activate it with tool_search in an earlier "
                        "step before a cell calls it"
                    ),
                )
            self.stop(code, why, tool=name)
            return _error(code, why)
        # every attempt counts, well-formed or not: the budget bounds the host's work
        self.calls += 1
        if self.calls > self._limits.nested_calls:
            self.exceeded = "nested_calls"
            why = f"the cell made more than {self._limits.nested_calls} nested calls"
            self.stop("limit_exceeded", why)
            return _error("limit_exceeded", why)
        if not isinstance(arguments, dict):
            return _error("invalid_arguments", f"tools.{name} takes one object of arguments")
        try:
            size = len(json.dumps(arguments, ensure_ascii=False).encode("utf-8", "replace"))
        except (TypeError, ValueError, RecursionError):
            return _error("invalid_arguments", f"the arguments of tools.{name} are not JSON")
        if size > self._limits.argument_bytes:
            # arguments are kept in the log: a cell must not write a gigabyte through
            # 32 calls of one large string
            self.exceeded = "argument_bytes"
            why = (
                f"the arguments of a call of {name!r} are larger than "
                f"{self._limits.argument_bytes} bytes"
            )
            self.stop("limit_exceeded", why)
            return _error("limit_exceeded", why)
        async with self._slots:
            if self.stopped.is_set():
                return _error("cell_stopped", "the cell is stopping; no further tool call starts")
            try:
                result = await self._nested.call(name, arguments)
            except CommitFailedError as exc:
                if self.failure is None:
                    self.failure = exc
                self.stop("commit_failed", "a commit failed; the turn stops")
                return _error("commit_failed", "a commit failed; the turn stops")
        status = result.status or "rejected"
        self.outcomes.append((result.call_id, name, status))
        if result.status == "ok":
            return {"ok": _parsed(result.content)}
        return _error(status, result.content)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (a nested call and the delivery of its reply) as a task this host
        owns: ``settle`` waits for every one."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self, *, cancel: bool) -> None:
        """Wait until every nested call has ended (cancelling them first with ``cancel``).

        A nested call past its T1 is never abandoned: cancelled, it records what it did
        before it ends. A second cancellation of the caller waits on all the same."""
        interrupted = False
        while self._tasks:
            pending = list(self._tasks)
            if cancel:
                for task in pending:
                    task.cancel()
            try:
                await asyncio.wait(pending)
            except asyncio.CancelledError:
                interrupted = cancel = True
            for task in pending:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: a delivery into a closed cell is moot
        if interrupted:
            raise asyncio.CancelledError


def _parsed(content: str) -> Any:
    """A tool's text result as the value a cell gets: parsed JSON, else the text."""
    try:
        return json.loads(content)
    except (ValueError, RecursionError):  # not JSON, or nested past the host's parser
        return content

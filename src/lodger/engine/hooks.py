"""Before- and after-call hooks: a stage of the call path, not a side channel.

A before-call hook sees a call that passed binding, visibility and schema checks and
returns ``None`` (go on), ``Veto(reason)`` (the call is rejected: a ``call_rejected`` fact
with reason ``vetoed`` and an error result the model reads) or ``Rewrite(arguments)``
(the call goes on with these arguments; they are checked against the tool's schema
again, and they are what T1 records). Hooks run in the order given, each seeing the
previous one's rewrite, before permission, resources and T1.

An after-call hook sees the outcome of a dispatched call before T2 and may return new
content for it; what it returns is what T2 records and what the model reads.

Hooks may be sync or async. A hook that raises is a bug in your code, not something the
model can fix: the call it raised on is rejected (before-call; nothing ran) or its result
is withheld (after-call; the tool ran and T2 says so), the step's other calls settle, and
the turn ends ``failed`` with ``lodger.errors.HookError`` raised, naming the hook.

A recovery re-dispatch (an ``idempotent`` call run again) takes the same stages in the
same order, hooks included: the before-call hooks see the arguments the interrupted T1
recorded (``origin`` is the call's own) and may veto the re-run (recovery then parks the
operation, with the veto as its reason) or rewrite it (the new T1 records the rewrite);
the after-call hooks see its outcome.

>>> def no_rm(call: CallInfo) -> Veto | None:
...     if call.tool == "shell" and "rm " in str(call.arguments.get("command", "")):
...         return Veto("rm is not allowed here")
...     return None
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lodger.events import Origin, ResultStatus

__all__ = ["AfterCall", "BeforeCall", "CallInfo", "CallResult", "Rewrite", "Veto"]


@dataclass(frozen=True, kw_only=True)
class CallInfo:
    """One call as a hook sees it: ``arguments`` are already schema-valid."""

    session_id: str
    turn_id: str
    call_id: str
    tool: str
    arguments: Mapping[str, Any]
    origin: Origin = "provider"
    deps: Any = None


@dataclass(frozen=True)
class Veto:
    """Reject the call; ``reason`` is what the model reads."""

    reason: str


@dataclass(frozen=True)
class Rewrite:
    """Go on with these arguments instead (checked against the schema again)."""

    arguments: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class CallResult:
    """A dispatched call's outcome as an after-call hook sees it."""

    status: ResultStatus
    content: str


BeforeCall = Callable[[CallInfo], "Veto | Rewrite | Awaitable[Veto | Rewrite | None] | None"]
AfterCall = Callable[[CallInfo, CallResult], "str | Awaitable[str | None] | None"]


async def call_before(hook: BeforeCall, info: CallInfo) -> Veto | Rewrite | None:
    result: Any = hook(info)
    if inspect.isawaitable(result):
        result = await result
    if result is not None and not isinstance(result, Veto | Rewrite):
        raise TypeError(f"a before-call hook returned {result!r}; return Veto, Rewrite or None")
    return result  # type: ignore[no-any-return,unused-ignore]


async def call_after(hook: AfterCall, info: CallInfo, outcome: CallResult) -> str | None:
    result: Any = hook(info, outcome)
    if inspect.isawaitable(result):
        result = await result
    if result is not None and not isinstance(result, str):
        raise TypeError(f"an after-call hook returned {result!r}; return a str or None")
    return result  # type: ignore[no-any-return,unused-ignore]

"""The remote substrate: work a call hands off to run elsewhere, settled by a later wake.

A tool declared with ``substrate=RemoteWork()`` hands its work off (to another worker, a
remote service) in its handler and returns ``Suspended(reason)``. The call then stays
dispatched, with T1 and no T2; the run ends waiting once its batch settles and the turn
stays open. When the session is woken, resume's recovery probe of the call (the tool is
``queryable``) gives its result, or says ``pending`` and the run waits again. A handler
may also finish the work at once and return its result (a delegation inside a code cell
runs its child inline).

``RemoteExecutor`` bounds the hand-off like any call (time limit, grace, cancellation
settles it) and is where a suspension is checked: a nested call of a code cell cannot
suspend, since the cell cannot wait for a wake, so such a hand-off ends as an error result.

>>> delegate = Tool(..., substrate=RemoteWork(), recovery="queryable", probe=probe_child)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from lodger.substrates.inprocess import STOP_GRACE, InProcessExecutor
from lodger.tools.spec import Execution, Executor, Tool, ToolContext

__all__ = ["RemoteExecutor", "RemoteWork"]


class RemoteExecutor:
    """Runs a tool's hand-off under a time limit; a ``Suspended`` result suspends the call."""

    def __init__(self, *, grace: float = STOP_GRACE) -> None:
        # the hand-off runs here, like any handler; what it hands off runs elsewhere
        self._here = InProcessExecutor(grace=grace)

    async def execute(
        self,
        *,
        tool: Tool,
        arguments: dict[str, Any],
        context: ToolContext,
        time_limit: float,
    ) -> Execution:
        execution = await self._here.execute(
            tool=tool, arguments=arguments, context=context, time_limit=time_limit
        )
        if execution.suspended and context.parent_call_id is not None:
            return Execution(
                "error",
                f"{tool.name} handed its work off from inside a code cell, which cannot wait "
                f"for it ({execution.content}); call {tool.name} as a call of its own",
            )
        return execution


_EXECUTOR = RemoteExecutor()


@dataclass(frozen=True, slots=True)
class RemoteWork:
    """Declares that a tool's calls hand their work off and suspend (``Tool.substrate``)."""

    @property
    def kind(self) -> Literal["remote"]:
        return "remote"

    @property
    def executor(self) -> Executor:
        return _EXECUTOR

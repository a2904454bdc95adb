"""The sandboxed-process substrate: a call that runs one command line in a sandbox.

A tool built with ``sandboxed(t, policy=..., settle=...)`` describes its call as a
``ProcessCommand`` (its handler checks the arguments and returns the argv, stdin and the
timeout the caller asked for); the substrate runs it in the policy's sandbox
(``lodger.substrates.sandbox``: bubblewrap, gVisor, or the host by explicit choice) with
the policy's
limits, a scrubbed environment with no credentials, the policy's network and the state
directory hidden; ``settle`` turns the ``SandboxResult`` into the tool's result.

``SandboxExecutor`` runs such a call for the pipeline. Its time limit is the sandbox's:
the wall time is the smallest of what the call asked for, the policy's ceiling and the
call's own limit, and at that wall time the sandbox kills the command and everything it
started. Reaching the call's own limit is ``timed_out``; reaching the timeout the call
asked for is the tool's own result (an error result naming it). Cancelling the caller
kills the whole tree, and the call settles ``cancelled``. The tool's handler runs the same
path for a direct call, outside any pipeline.

    shell = sandboxed(describe_command, policy=SandboxPolicy(), settle=render_result)
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lodger.errors import ToolCallError
from lodger.substrates.background import table_for
from lodger.substrates.inprocess import (
    STOP_GRACE,
    execution_of,
    failure_execution,
    result_execution,
    run_bounded,
)
from lodger.substrates.sandbox import Sandbox, SandboxPolicy, SandboxResult, sandbox_for
from lodger.tools.spec import Execution, Executor, Handler, Tool, ToolContext, ToolOutput

__all__ = [
    "ProcessCommand",
    "SandboxExecutor",
    "SandboxedProcess",
    "sandboxed",
    "scrubbed_env",
]

_SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: how a tool turns the sandbox's result into its own: ``(result, wall time it ran under)``
Settle = Callable[[SandboxResult, float], "str | ToolOutput"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessCommand:
    """One command line a call runs: ``argv`` in ``workspace`` (the resolved root)."""

    argv: tuple[str, ...]
    workspace: Path
    stdin: bytes = b""
    #: the seconds the caller asked for (None: the policy's wall time)
    timeout_s: float | None = None


def scrubbed_env(root: Path, policy: SandboxPolicy) -> dict[str, str]:
    """An allow-list environment: no credentials (``*_KEY``, ``*_TOKEN``...) can leak in;
    host variables enter only when the policy names them (never credential-like ones)."""
    path = _SANDBOX_PATH if policy.confined else os.environ.get("PATH") or os.defpath
    return {
        **policy.host_environment(),
        "PATH": path,
        "HOME": str(root),
        "LANG": os.environ.get("LANG") or "C.UTF-8",
    }


@dataclass(frozen=True, slots=True)
class _Ran:
    """A command that ran: its result, the wall time it had, whether that was the call's."""

    result: SandboxResult
    wall_time_s: float
    call_limit: bool


@dataclass(frozen=True, kw_only=True)
class SandboxedProcess:
    """Declares that a tool's calls run a command in a sandbox (``Tool.substrate``)."""

    policy: SandboxPolicy
    #: the tool's own handler: checks the arguments, returns a ``ProcessCommand``
    command: Handler
    settle: Settle
    #: the backend (None: the one the policy names)
    sandbox: Sandbox | None = None

    @property
    def kind(self) -> Literal["sandboxed_process"]:
        return "sandboxed_process"

    @property
    def executor(self) -> Executor:
        return _EXECUTOR

    async def handler(self, arguments: dict[str, Any], ctx: ToolContext) -> str | ToolOutput:
        """The tool's handler: the call run here, with no call time limit of its own."""
        ran = await self.run(arguments, ctx, time_limit=math.inf)
        return self.settle(ran.result, ran.wall_time_s)

    async def run(self, arguments: dict[str, Any], ctx: ToolContext, *, time_limit: float) -> _Ran:
        """Describe the command, check the backend, run it; ``ToolCallError`` for a refusal."""
        command = await self.command(arguments, ctx)
        if not isinstance(command, ProcessCommand):
            raise TypeError(f"the handler returned {command!r}, not a ProcessCommand")
        box = _in_session_net(
            self.sandbox if self.sandbox is not None else sandbox_for(self.policy),
            self.policy,
            ctx.session_id,
        )
        missing = box.unavailable()
        if missing is not None:
            raise ToolCallError(
                f"commands run in a {box.name} sandbox and it cannot start here: {missing}",
                hint="tell the user; nothing ran",
                code="sandbox_unavailable",
            )
        policy = self.policy
        # The caller picks timeout_s; the policy's wall time is the ceiling it cannot
        # raise, and the call's own limit is below both.
        asked = policy.limits.wall_time_s
        if command.timeout_s is not None:
            asked = min(command.timeout_s, asked)
        wall_time_s = min(asked, time_limit)
        result = await box.run(
            command.argv,
            workspace=command.workspace,
            stdin=command.stdin,
            env=scrubbed_env(command.workspace, policy),
            limits=dataclasses.replace(policy.limits, wall_time_s=wall_time_s),
            network=policy.network,
            hidden=ctx.hidden,
            git_writable=policy.git_writable,
        )
        return _Ran(result=result, wall_time_s=wall_time_s, call_limit=wall_time_s < asked)


def _in_session_net(box: Sandbox, policy: SandboxPolicy, session_id: str) -> Sandbox:
    """``box``, joining the session's network namespace where background processes run
    (``lodger.substrates.background``): a bubblewrap command with no network policy."""
    table = table_for(session_id, create=False)
    net = table.net_pid() if table is not None else None
    if net is None or policy.network.enabled:
        return box
    from lodger.substrates.sandbox.bubblewrap import BubblewrapSandbox

    if type(box) is not BubblewrapSandbox or box.join_net is not None:
        return box
    return BubblewrapSandbox(executable=box.executable, join_net=net)


class SandboxExecutor:
    """Runs a ``SandboxedProcess`` tool's call; the sandbox enforces its time limit."""

    def __init__(self, *, grace: float = STOP_GRACE) -> None:
        self.grace = grace

    async def execute(
        self,
        *,
        tool: Tool,
        arguments: dict[str, Any],
        context: ToolContext,
        time_limit: float,
    ) -> Execution:
        process = tool.substrate
        if not isinstance(process, SandboxedProcess):
            return Execution("error", f"{tool.name} does not declare a sandboxed process")
        # The sandbox kills the command at its wall time; the bound past it (plus grace)
        # is only for a backend that fails to: it cancels the run, which kills the tree.
        done, stopped_by = await run_bounded(
            process.run(arguments, context, time_limit=time_limit),
            time_limit=time_limit + self.grace,
            grace=self.grace,
        )
        if done.cancelled() or done.exception() is not None:
            return execution_of(tool.name, done, stopped_by, time_limit)
        ran: _Ran = done.result()
        try:
            execution = result_execution(tool.name, process.settle(ran.result, ran.wall_time_s))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the tool's own code: its error result
            return failure_execution(tool.name, exc)
        if stopped_by == "time_limit" or (ran.call_limit and ran.result.limit == "wall_time"):
            return Execution("timed_out", execution.content)
        return execution


_EXECUTOR = SandboxExecutor()


def sandboxed(
    t: Tool, *, policy: SandboxPolicy, settle: Settle, sandbox: Sandbox | None = None
) -> Tool:
    """``t`` on the sandboxed-process substrate: its handler describes a ``ProcessCommand``."""
    process = SandboxedProcess(policy=policy, command=t.handler, settle=settle, sandbox=sandbox)
    return t.with_options(handler=process.handler, substrate=process)

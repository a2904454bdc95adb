"""The background-process tools: ``start_process``, ``process_output``, ``process_wait``,
``process_input`` and ``process_stop`` (``process_tools(policy)``).

``start_process`` runs a bash command line in the session's bubblewrap sandbox (the same
confinement as ``shell``) and returns at once with a durable handle, the process id; its
``process_started`` fact commits with the call's T2. The other four are ordinary calls on
that handle, each with its own T1 and T2; an end any of them sees is committed with its T2
(``process_ended``). Processes stop when the turn ends unless started with
``keep="session"``; limits (``ProcessLimits``) cover how many run at once and what each
may use, and a process a limit stopped ends with ``status="limit"`` and the limit's name.
Commands without a network policy share the session's network namespace (loopback only,
``lodger.substrates.background``): ``shell`` reaches a server started here on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from lodger.errors import ToolCallError
from lodger.events import ProcessEnded, ProcessStarted
from lodger.substrates.background import (
    Keep,
    ProcessLimits,
    ProcessTable,
    _Process,
    process_identity,
    table_for,
)
from lodger.substrates.sandbox import SandboxPolicy, SandboxResult
from lodger.substrates.sandboxed import scrubbed_env
from lodger.substrates.shell import (
    _check_spawnable,
    _check_state_dir_not_named,
    _claims_for,
    _written_out,
)
from lodger.tools.spec import Tool, ToolContext, ToolOutput, tool
from lodger.tools.workspace import resolve_workspace_root

__all__ = ["process_tools"]

#: at most this many characters of output per ``process_output`` call
_CHUNK_CHARS = 20_000


def _table(ctx: ToolContext) -> ProcessTable:
    table = table_for(ctx.session_id)
    assert table is not None
    return table


def _check_backend(policy: SandboxPolicy) -> None:
    if policy.backend != "bubblewrap" or policy.network.enabled:
        raise ToolCallError(
            "background processes run only in a bubblewrap sandbox with no network policy",
            hint="run the command with shell instead, or tell the user",
            code="sandbox_unavailable",
        )


async def _spawn(
    table: ProcessTable,
    ctx: ToolContext,
    *,
    policy: SandboxPolicy,
    limits: ProcessLimits,
    process_id: str,
    command: str,
    keep: Keep,
) -> _Process:
    """Start ``command`` in the session's network namespace; returns once it runs."""
    from lodger.substrates.sandbox._git import git_placeholder
    from lodger.substrates.sandbox._process import disk_watch, run_confined
    from lodger.substrates.sandbox.bubblewrap import (
        BubblewrapSandbox,
        bubblewrap_argv,
        confinable_workspace,
        joining_net,
    )

    root = confinable_workspace(resolve_workspace_root(ctx.require_workspace()))
    box = BubblewrapSandbox()
    if (missing := box.unavailable()) is not None:
        raise ToolCallError(missing, hint="tell the user; nothing ran", code="sandbox_unavailable")
    holder = bubblewrap_argv(box.executable, ["sleep", "infinity"], workspace=root, cwd=root)
    net = await table.ensure_net(holder)
    stdin_r, stdin_w = os.pipe()
    filter_r = _filter_fd()
    confined = limits.sandbox_limits()
    argv = _command_line(
        box.executable, command, root, ctx, filter_r, stdin_r, tmp_bytes=confined.disk_bytes
    )
    p = _Process(
        process_id=process_id,
        command=command,
        keep=keep,
        pid=0,
        output=table.output_path(process_id),
        task=None,
        input_fd=stdin_w,
    )
    p.sink(limits.kept_bytes)
    spawned: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def run() -> SandboxResult:
        async with git_placeholder(root, writable=False):
            return await run_confined(
                joining_net(net, argv),
                backend=box.name,
                env=scrubbed_env(root, policy),
                cwd=root,
                stdin=b"",
                limits=confined,
                on_output=p.feed,
                signal_exit_codes=True,
                pass_fds=(filter_r, stdin_r),
                on_spawn=spawned.set_result,
                # what it writes is counted as a shell command's is, for its whole life
                disk=await disk_watch(confined, root, exclude=ctx.hidden),
            )

    # Owned by the table: stopped and awaited by process_stop or the turn's end.
    p.task = asyncio.create_task(run(), name=f"lodger-process-{process_id}")
    p.pid = await _started(p, spawned, stdin_w, (filter_r, stdin_r))
    table.processes[process_id] = p
    return p


async def _started(
    p: _Process, spawned: asyncio.Future[int], stdin_w: int, child_fds: tuple[int, int]
) -> int:
    """Wait until the process ``p.task`` runs spawned (its pid) or failed to start;
    closes the descriptors only the child keeps."""
    assert p.task is not None
    try:
        waited: list[asyncio.Future[object]] = [p.task, spawned]  # type: ignore[list-item]
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled while it starts: it must not run unowned
        p.task.cancel()
        await asyncio.wait([p.task])
        os.close(stdin_w)
        raise
    finally:
        for fd in child_fds:
            os.close(fd)
    if not spawned.done():
        os.close(stdin_w)
        exc = p.task.exception()
        raise ToolCallError(
            f"the background process could not start: {exc}",
            hint="tell the user; nothing ran",
            code="sandbox_unavailable",
        )
    return spawned.result()


def _filter_fd() -> int:
    """A pipe's read end holding the seccomp filter, for ``bwrap --seccomp``."""
    from lodger.substrates.sandbox._seccomp import refusal_filter

    filter_r, filter_w = os.pipe()
    with os.fdopen(filter_w, "wb") as pipe:
        pipe.write(refusal_filter())
    return filter_r


def _command_line(
    bwrap: str,
    command: str,
    root: Path,
    ctx: ToolContext,
    filter_r: int,
    stdin_r: int,
    *,
    tmp_bytes: int | None,
) -> list[str]:
    """bwrap's command line for ``command``, in no network namespace of its own; the
    descriptor ``stdin_r`` becomes its stdin, then bash evaluates the command line."""
    from lodger.substrates.sandbox.bubblewrap import bubblewrap_argv

    script = f'exec 0<&{stdin_r} {stdin_r}<&-; eval "$1"'
    return bubblewrap_argv(
        bwrap,
        ["bash", "-c", script, "bash", command],
        workspace=root,
        cwd=root,
        hidden=ctx.hidden,
        seccomp_fd=filter_r,
        share_net=True,
        tmp_bytes=tmp_bytes,
    )


def _start_tool(policy: SandboxPolicy, limits: ProcessLimits) -> Tool:
    @tool(
        name="start_process",
        group="shell",
        recovery="never_retry",
        writes=True,
        claims=_claims_for(policy),  # as shell's: the workspace, and the backend in T1
    )
    async def start_process(
        ctx: ToolContext,
        command: Annotated[str, Field(description="a bash command line, e.g. a dev server")],
        keep: Annotated[
            Literal["turn", "session"],
            Field(description="stop it when the turn ends (turn) or keep it (session)"),
        ] = "turn",
    ) -> ToolOutput:
        """Start a bash command in the background, in the same sandbox as shell, and return
        its process id at once. A server it starts on 127.0.0.1 is reachable from later
        shell calls. Read its output with process_output, wait for it with process_wait,
        write to its stdin with process_input, stop it with process_stop. It stops when
        the turn ends unless keep is "session"."""
        _check_backend(policy)
        root = resolve_workspace_root(ctx.require_workspace())
        _check_state_dir_not_named(command, root, ctx.hidden)
        _check_spawnable(command, "command")
        table = _table(ctx)
        ended = table.settled()
        if len(table.live()) >= limits.max_processes:
            raise ToolCallError(
                f"{limits.max_processes} background processes already run in this session "
                "(the process count limit)",
                hint="stop one with process_stop first",
                code="process_limit",
            )
        process_id = f"proc-{ctx.call_id}"  # call ids are unique in a session
        p = await _spawn(
            table,
            ctx,
            policy=policy,
            limits=limits,
            process_id=process_id,
            command=command,
            keep=keep,
        )
        started = ProcessStarted(
            process_id=process_id,
            operation_id=ctx.operation_id,
            command=command,
            pid=p.pid,
            sandbox=f"bubblewrap {process_identity(p.pid) or ''}".rstrip(),
            keep=keep,
        )
        text = f"started {process_id} (pid {p.pid}, stops at the end of the {keep})"
        return ToolOutput(content=text, facts=(*ended, started))

    return start_process


def _describe(p: _Process, ended: ProcessEnded | None) -> str:
    if ended is None:
        return f"{p.process_id} is running"
    what = f"{p.process_id} ended: {ended.status}"
    if ended.status == "limit":
        what += f" ({ended.reason.replace('_', ' ')} limit reached)"
    if ended.exit_code is not None:
        what += f", exit code {ended.exit_code}"
    return what


def _read(p: _Process, since: int) -> tuple[str, int]:
    if p.output is None:
        return "(output not kept: the process was adopted after a restart)", since
    with contextlib.suppress(FileNotFoundError), p.output.open("rb") as f:
        f.seek(since)
        data = f.read(_CHUNK_CHARS)
        return data.decode("utf-8", errors="replace"), since + len(data)
    return "", since


def _status_line(p: _Process, next_offset: int) -> str:
    dropped = p.total - p.written
    note = f"; {dropped} bytes past the kept {p.written} were not kept" if dropped > 0 else ""
    return f"[{_describe(p, p.ended)}; next_offset {next_offset}{note}]"


def _output_tool() -> Tool:
    @tool(name="process_output", group="shell", recovery="idempotent")
    async def process_output(
        ctx: ToolContext,
        process_id: Annotated[str, Field(description="the id start_process returned")],
        since_offset: Annotated[int, Field(ge=0, description="byte offset to read from")] = 0,
    ) -> ToolOutput:
        """Read a background process's output (stdout and stderr) from a byte offset; the
        result ends with the next offset to read from."""
        table = _table(ctx)
        p = table.get(process_id)
        ended = table.settled()
        text, upto = await asyncio.to_thread(_read, p, since_offset)
        body = _written_out(text) or "(no new output)"
        return ToolOutput(content=f"{body}\n{_status_line(p, upto)}", facts=tuple(ended))

    return process_output


def _wait_tool() -> Tool:
    @tool(name="process_wait", group="shell", recovery="idempotent")
    async def process_wait(
        ctx: ToolContext,
        process_id: Annotated[str, Field(description="the id start_process returned")],
        timeout_s: Annotated[float, Field(gt=0, le=600, description="seconds to wait")] = 30,
    ) -> ToolOutput:
        """Wait until a background process ends, at most timeout_s; say how it ended."""
        table = _table(ctx)
        p = table.get(process_id)
        if p.task is not None:
            await asyncio.wait([p.task], timeout=timeout_s)
        ended = table.settled()
        return ToolOutput(content=_describe(p, p.ended), facts=tuple(ended))

    return process_wait


def _input_tool() -> Tool:
    @tool(name="process_input", group="shell", recovery="never_retry", writes=True)
    async def process_input(
        ctx: ToolContext,
        process_id: Annotated[str, Field(description="the id start_process returned")],
        text: Annotated[str, Field(description="what to write to its stdin")],
        close: Annotated[bool, Field(description="close its stdin afterwards")] = False,
    ) -> ToolOutput:
        """Write text to a background process's stdin (add "\\n" for a line)."""
        data = _check_spawnable(text, "input")
        table = _table(ctx)
        p = table.get(process_id)
        ended = table.settled()
        if p.input_fd is None or p.ended is not None:
            raise ToolCallError(
                f"{process_id} takes no more input (it ended, or its stdin was closed)",
                code="process_ended",
            )
        fd = p.input_fd
        written = await asyncio.to_thread(_write_all, fd, data)
        if close:
            os.close(fd)
            p.input_fd = None
        return ToolOutput(content=f"wrote {written} bytes to {process_id}", facts=tuple(ended))

    return process_input


def _write_all(fd: int, data: bytes) -> int:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BrokenPipeError:
        raise ToolCallError("the process closed its stdin", code="process_ended") from None
    return len(data)


def _stop_tool() -> Tool:
    @tool(name="process_stop", group="shell", recovery="idempotent", writes=True)
    async def process_stop(
        ctx: ToolContext,
        process_id: Annotated[str, Field(description="the id start_process returned")],
    ) -> ToolOutput:
        """Stop a background process and everything it started."""
        table = _table(ctx)
        p = table.get(process_id)
        if not p.done():
            await table.stop(p)
        ended = table.settled()
        return ToolOutput(content=_describe(p, p.ended), facts=tuple(ended))

    return process_stop


def process_tools(
    policy: SandboxPolicy | None = None, *, limits: ProcessLimits | None = None
) -> list[Tool]:
    """The five background-process tools for ``policy`` (default: bubblewrap, no network)."""
    policy = policy or SandboxPolicy()
    limits = limits or ProcessLimits()
    return [_start_tool(policy, limits), _output_tool(), _wait_tool(), _input_tool(), _stop_tool()]

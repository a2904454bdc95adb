"""The shell tool: ``bash -c`` in the workspace, with a timeout, an output cap and a
scrubbed environment. It asks for approval until commands run in a sandbox.

Until the sandbox exists a command runs on the host with the user's rights, so nothing
here confines it. One cheap tripwire: a command line that names lodger's state directory
(its path, workspace-relative path or base name) when that directory is inside the
workspace is refused before anyone is asked to approve it. That catches a model that
means to read or rewrite its own log; it does not stop ``ls -a``, a glob such as ``.lod*``
or a script that finds the directory by itself. Only the sandbox, which will not mount
the state directory, closes that.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from lodger.authority.common import ResourceClaim
from lodger.errors import ToolCallError
from lodger.tools.files import _workspace_claims
from lodger.tools.spec import ToolContext, ToolOutput, tool
from lodger.tools.workspace import (
    resolve_workspace_root,
)

__all__ = ["shell"]

SHELL_MAX_OUTPUT_CHARS = 30_000
# Once a shell command is killed, how long to wait for the rest of its output.
_SHELL_DRAIN_GRACE_S = 1.0


def _scrubbed_env(root: Path) -> dict[str, str]:
    """An allow-list environment: no credentials (``*_KEY``, ``*_TOKEN``...) can leak in."""
    return {
        "PATH": os.environ.get("PATH") or os.defpath,
        "HOME": str(root),
        "LANG": os.environ.get("LANG") or "C.UTF-8",
    }


class _CappedOutput:
    """Keeps the first and the last bytes of a stream and counts what it dropped."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        # Bytes, not characters, arrive: keep enough for max_chars of multi-byte UTF-8.
        self._keep = 2 * max_chars
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._keep - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            if len(self._tail) > self._keep:
                del self._tail[: len(self._tail) - self._keep]

    @property
    def retained(self) -> int:
        """Bytes held in memory: bounded however much the command prints."""
        return len(self._head) + len(self._tail)

    def text(self) -> str:
        dropped = self.total - len(self._head) - len(self._tail)
        half = self.max_chars // 2
        if dropped == 0:
            whole = (self._head + self._tail).decode("utf-8", errors="replace")
            if len(whole) <= self.max_chars:
                return whole
            first, last = whole[:half], whole[-half:]
        else:
            first = self._head.decode("utf-8", errors="replace")[:half]
            last = self._tail.decode("utf-8", errors="replace")[-half:]
        return (
            f"{first}\n[... output cut: {self.total} bytes in total, only the first and last "
            f"{half} characters are shown ...]\n{last}"
        )


async def _drain(stream: asyncio.StreamReader, sink: _CappedOutput) -> None:
    while chunk := await stream.read(65536):
        sink.feed(chunk)


def _kill_group(process: asyncio.subprocess.Process) -> None:
    # The command runs in its own session, so its process group is everything it started
    # (unless something called setsid itself, which only a sandbox can contain).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _check_state_dir_not_named(command: str, root: Path, hidden: Sequence[Path]) -> None:
    """Refuse a command line that names a hidden path lying inside the workspace."""
    for path in hidden:
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(root) or real == root:
            continue
        rel = real.relative_to(root).as_posix()
        spellings = {str(path), str(real), rel, real.name}
        for spelling in sorted(spellings, key=len, reverse=True):
            # As a word of its own: '.lodger', './.lodger/x', "'.lodger'", not '.lodgerx'.
            if re.search(rf"(?<![\w.-]){re.escape(spelling)}(?![\w.-])", command):
                raise ToolCallError(
                    f"the command names {rel!r}, lodger's state directory; "
                    "no tool may read or write it",
                    hint="leave the session's log alone and work on the project's files",
                    code="path_hidden",
                )


def _shell_claims(arguments: dict[str, Any], ctx: ToolContext) -> Sequence[ResourceClaim]:
    # Checked here too, so a refused command is refused before anyone is asked to approve it.
    command = arguments.get("command")
    if isinstance(command, str):
        root = resolve_workspace_root(ctx.require_workspace())
        _check_state_dir_not_named(command, root, ctx.hidden)
    return _workspace_claims(arguments, ctx)


@tool(group="shell", recovery="never_retry", approval=True, claims=_shell_claims)
async def shell(
    ctx: ToolContext,
    command: Annotated[str, Field(description="a bash command line")],
    timeout_s: Annotated[
        float, Field(gt=0, le=3600, description="seconds before the command is killed")
    ] = 60,
) -> str | ToolOutput:
    """Run a bash command in the workspace root and return its output and exit code.

    stdout and stderr are combined; long output keeps its beginning and end. The command
    gets a minimal environment (PATH, HOME set to the workspace, LANG) and no stdin. On
    timeout the command and everything it started are killed.
    """
    root = resolve_workspace_root(ctx.require_workspace())
    _check_state_dir_not_named(command, root, ctx.hidden)
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        command,
        cwd=root,
        env=_scrubbed_env(root),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    stdout = process.stdout
    assert stdout is not None  # stdout=PIPE
    output = _CappedOutput(SHELL_MAX_OUTPUT_CHARS)
    timed_out = False
    try:
        # Waiting for EOF as well as the exit: a background job holding the pipe is still
        # part of the command, and the timeout covers it too.
        async with asyncio.timeout(timeout_s):
            await _drain(stdout, output)
            await process.wait()
    except TimeoutError:
        timed_out = True
        _kill_group(process)
        await process.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_SHELL_DRAIN_GRACE_S):
                await _drain(stdout, output)
    except asyncio.CancelledError:
        _kill_group(process)
        await process.wait()
        raise
    text = output.text().rstrip("\n") or "(no output)"
    if timed_out:
        note = f"[timed out after {timeout_s:g} s; the command and its children were killed]"
        return ToolOutput(content=f"{text}\n{note}", is_error=True)
    code = process.returncode
    assert code is not None  # wait() returned
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"number {-code}"
        return f"{text}\n[exit code {code}: killed by signal {name}]"
    return f"{text}\n[exit code {code}]"

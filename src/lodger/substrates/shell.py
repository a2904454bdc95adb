"""The shell and run_python tools: ``bash -c`` or a Python snippet in the workspace,
run in a sandbox (``lodger.substrates.sandbox``) with limits, a scrubbed environment and no network.

``shell_tool(policy)`` and ``python_tool(policy)`` build them for a ``SandboxPolicy``, on
the sandboxed-process substrate (``lodger.substrates.sandboxed``: each describes its command
line, the substrate runs it and this module renders the result);
``shell`` and ``run_python`` are the defaults (bubblewrap, no network, no approval: the
sandbox, not a person, is what confines the command). If the backend is missing the call
fails closed with a one-line fix. ``backend="none"`` runs on the host: that needs approval
unless the policy says otherwise, and every T1 records the backend as a resource
(``actor:sandbox:none``), so the choice is in the log; so is a policy that lets commands
write the workspace's ``.git`` (``actor:sandbox:git-writable``).

One cheap tripwire stays for every backend: a command line that names lodger's state
directory (its path, workspace-relative path or base name) when that directory is inside
the workspace is refused before anyone is asked to approve it. In a sandbox the directory
is not mounted anyway; on the host this catches only the obvious spellings.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from lodger._core.text import escape_matches
from lodger.authority.common import ResourceClaim
from lodger.errors import ToolCallError
from lodger.substrates.sandbox import Sandbox, SandboxPolicy, SandboxResult
from lodger.substrates.sandboxed import ProcessCommand, sandboxed
from lodger.tools.files import _workspace_claims
from lodger.tools.spec import Tool, ToolContext, ToolOutput, tool
from lodger.tools.workspace import (
    resolve_workspace_root,
)

__all__ = ["python_tool", "run_python", "shell", "shell_tool"]

SHELL_MAX_OUTPUT_CHARS = 30_000
# How many of the egress proxy's connections a result names one by one.
_NETWORK_SHOWN = 20
# Once a shell command is killed, how long to wait for the rest of its output.
_SHELL_DRAIN_GRACE_S = 1.0


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


def _check_spawnable(text: str, what: str) -> bytes:
    """``text`` as the bytes a process is given; a ``ToolCallError`` for what no process
    can take (valid JSON all the same): a NUL byte in a command line, a lone surrogate."""
    if what == "command" and "\0" in text:
        raise ToolCallError(
            f"the {what} holds a NUL byte, which no command line can carry",
            hint="remove it; write binary data with printf '\\000' instead",
        )
    try:
        return text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError as exc:
        raise ToolCallError(
            f"the {what} holds a lone surrogate ({text[exc.start]!a}), which is not text",
            hint="send the character itself, or its escape in the language of the " + what,
        ) from None


def _claims_for(policy: SandboxPolicy) -> Any:
    def claims(arguments: dict[str, Any], ctx: ToolContext) -> Sequence[ResourceClaim]:
        # Checked here too, so a refused command is refused before anyone is asked.
        command = arguments.get("command")
        if isinstance(command, str):
            root = resolve_workspace_root(ctx.require_workspace())
            _check_state_dir_not_named(command, root, ctx.hidden)
        # The backend is a resource of the call, so T1 records where it ran; and so is a
        # writable .git, so T1 says when the host's git may find what the command left.
        where = [ResourceClaim.actor(f"sandbox:{policy.backend}")]
        if policy.confined and policy.git_writable:
            where.append(ResourceClaim.actor("sandbox:git-writable"))
        return [*_workspace_claims(arguments, ctx), *where]

    return claims


# Control characters but tab, newline and CR, DEL, and the C1 set (U+0080-U+009F): they
# start terminal sequences (ESC, CSI) that would act on whoever views the result.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _written_out(text: str) -> str:
    r"""``text`` with each control character as an escape: ``\x1b[2J`` stays readable to
    the model and clears no one's screen (OSC 52 writes no one's clipboard)."""
    return escape_matches(_CONTROL, text)


_READ_ONLY_GIT = (
    "The workspace's .git is read-only: git status, log and diff work; what writes the "
    "repository (commit, add, stash, config) fails. Tell the user what to commit."
)


def _with_ceiling(t: Tool, policy: SandboxPolicy) -> Tool:
    """``t`` whose description names the policy's wall time: a model that asks for a
    longer ``timeout_s`` is cut there, so it is told before it asks; and, in a sandbox
    that keeps ``.git`` read-only, that git cannot commit there."""
    notes = f"timeout_s is capped at {policy.limits.wall_time_s:g} s (the sandbox's wall time)."
    if policy.confined and not policy.git_writable:
        notes += f" {_READ_ONLY_GIT}"
    return t.with_options(description=f"{t.description}\n\n{notes}")


def _settled(result: SandboxResult, timeout_s: float) -> str | ToolOutput:
    output = _CappedOutput(SHELL_MAX_OUTPUT_CHARS)
    output.feed(result.output)
    text = _written_out(output.text()).rstrip("\n") or "(no output)"
    egress = [
        f"{'allowed' if c.allowed else 'refused'} {c.method} {c.host}:{c.port}"
        + (" (TLS terminated by lodger)" if c.tls_terminated else "")
        + (" (credentials added)" if c.credentials_injected else "")
        for c in result.connections[:_NETWORK_SHOWN]
    ]
    if len(result.connections) > _NETWORK_SHOWN:
        # Bounded like the output: a command can make thousands of requests.
        allowed = sum(c.allowed for c in result.connections)
        egress.append(
            f"... {len(result.connections)} connections: {allowed} allowed, "
            f"{len(result.connections) - allowed} refused"
        )
        if not result.connections[-1].host:  # the proxy's count of the unrecorded rest
            egress.append(f"and {result.connections[-1].reason}")
    if egress:  # the hosts are what the command asked for: written out as well
        text += "\n[network: " + _written_out("; ".join(egress)) + "]"
    if result.limit == "wall_time":
        note = f"[timed out after {timeout_s:g} s; the command and its children were killed]"
        return ToolOutput(content=f"{text}\n{note}", is_error=True)
    if result.limit is not None:
        what = result.limit.replace("_", " ")
        extra = f", {result.output_total} bytes written" if result.limit == "output" else ""
        if result.limit == "disk":
            extra = " (what the workspace and /tmp may take); the files it wrote stay"
        note = f"[stopped: {what} limit reached{extra}; the command and its children were killed]"
        return ToolOutput(content=f"{text}\n{note}", is_error=True)
    if result.signal is not None:
        number = getattr(signal.Signals, result.signal, None)
        code = -int(number) if number is not None else "?"
        return f"{text}\n[exit code {code}: killed by signal {result.signal}]"
    return f"{text}\n[exit code {result.exit_code}]"


_HOST_SHELL_DESCRIPTION = """\
Run a bash command in the workspace root and return its output and exit code.

stdout and stderr are combined; long output keeps its beginning and end. The command runs
on the host, not in a sandbox. It gets a minimal environment (PATH, HOME set to the
workspace, LANG) and no stdin. When it returns or times out, it and everything it started
in its process group are killed."""


def shell_tool(
    policy: SandboxPolicy | None = None, *, sandbox: Sandbox | None = None, name: str = "shell"
) -> Tool:
    """The shell tool for ``policy`` (default: bubblewrap, no network, default limits)."""
    policy = policy or SandboxPolicy()

    @tool(
        name=name,
        group="shell",
        recovery="never_retry",
        approval=policy.approval or not policy.confined,
        writes=True,
        claims=_claims_for(policy),
    )
    async def run_shell(
        ctx: ToolContext,
        command: Annotated[str, Field(description="a bash command line")],
        timeout_s: Annotated[
            float,
            Field(gt=0, le=3600, description="seconds before the command is killed"),
        ] = 60,
    ) -> ProcessCommand:
        """Run a bash command in the workspace root and return its output and exit code.

        stdout and stderr are combined; long output keeps its beginning and end. The
        command runs in a sandbox: the workspace is writable, the system read-only, /tmp
        private, there is no network unless allowed, and memory, processes, CPU time and
        output are limited. It gets a minimal environment (PATH, HOME set to the
        workspace, LANG) and no stdin. When it returns, times out or hits a limit, it and
        everything it started are killed.
        """
        root = resolve_workspace_root(ctx.require_workspace())
        _check_state_dir_not_named(command, root, ctx.hidden)
        _check_spawnable(command, "command")
        return ProcessCommand(argv=("bash", "-c", command), workspace=root, timeout_s=timeout_s)

    t = sandboxed(run_shell, policy=policy, settle=_settled, sandbox=sandbox)
    if not policy.confined:
        return _with_ceiling(t.with_options(description=_HOST_SHELL_DESCRIPTION), policy)
    return _with_ceiling(t, policy)


def python_tool(policy: SandboxPolicy | None = None, *, sandbox: Sandbox | None = None) -> Tool:
    """The run_python tool: a snippet run by python3 in the same sandbox as shell."""
    policy = policy or SandboxPolicy()

    @tool(
        name="run_python",
        group="shell",
        recovery="never_retry",
        approval=policy.approval or not policy.confined,
        writes=True,
        claims=_claims_for(policy),
    )
    async def run_python(
        ctx: ToolContext,
        code: Annotated[str, Field(description="Python 3 source, run as a script")],
        timeout_s: Annotated[
            float, Field(gt=0, le=3600, description="seconds before it is killed")
        ] = 60,
    ) -> ProcessCommand:
        """Run a Python snippet in the workspace root (the current directory) and return
        what it printed and its exit code.

        For data work: read and write the workspace's files, compute, print results. It
        runs in the same sandbox as shell (no network unless allowed, limited memory,
        CPU time and output); only the standard library and the system's packages exist.
        """
        stdin = _check_spawnable(code, "snippet")
        root = resolve_workspace_root(ctx.require_workspace())
        return ProcessCommand(
            argv=("python3", "-"), workspace=root, stdin=stdin, timeout_s=timeout_s
        )

    return _with_ceiling(
        sandboxed(run_python, policy=policy, settle=_settled, sandbox=sandbox), policy
    )


shell = shell_tool()
run_python = python_tool()

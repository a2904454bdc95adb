"""The sandbox interface: run an argv confined, limited and offline, and say how it ended.

Every backend (``BubblewrapSandbox``, ``RunscSandbox``, the unconfined ``HostSandbox``)
implements ``Sandbox.run`` with the same meaning, and the same escape tests run against
each (tests/sandbox). A backend builds the command line that confines the argv; running
it, the limits and killing the whole tree are shared (``lodger.substrates.sandbox._process``).
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from lodger.substrates.sandbox.policy import Limits, NetworkPolicy

__all__ = ["Connection", "LimitName", "OutputSink", "Sandbox", "SandboxResult"]

LimitName = Literal["wall_time", "cpu_time", "memory", "processes", "output", "disk"]
OutputSink = Callable[[bytes], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class Connection:
    """One request the egress proxy saw (a ``CONNECT``, or each request on a connection):
    allowed and forwarded, or refused."""

    host: str
    port: int
    method: str
    allowed: bool
    credentials_injected: bool = False
    #: HTTPS the proxy ended with its lodger CA and re-opened upstream (``method`` is then
    #: the request's, not ``CONNECT``)
    tls_terminated: bool = False
    reason: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "port": self.port,
            "method": self.method,
            "allowed": self.allowed,
            "credentials_injected": self.credentials_injected,
            "tls_terminated": self.tls_terminated,
            "reason": self.reason,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxResult:
    """How a sandboxed command ended.

    ``exit_code`` is set when it exited, ``signal`` (``"SIGKILL"``) when a signal ended
    it; ``limit`` names the limit that stopped it, if one did. ``output`` is stdout and
    stderr combined, at most ``Limits.output_bytes``; ``output_total`` counts every byte.
    ``enforcement`` says how each limit was enforced on this host (``"cgroup v1"``...).
    """

    backend: str
    exit_code: int | None
    signal: str | None = None
    limit: LimitName | None = None
    output: bytes = b""
    output_total: int = 0
    duration_s: float = 0.0
    #: CPU time the whole tree used (None where no cgroup counted it)
    cpu_s: float | None = None
    #: CPU periods in which the ``cpu_rate`` limit held the tree back
    cpu_throttled: int = 0
    enforcement: Mapping[str, str] = field(default_factory=dict)
    connections: tuple[Connection, ...] = ()

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None

    def describe(self) -> str:
        """``exit code 0``, ``killed by SIGKILL: memory limit (1024 MiB) reached``..."""
        if self.signal is not None:
            ended = f"killed by {self.signal}"
        else:
            ended = f"exit code {self.exit_code}"
        if self.limit is not None:
            ended += f": {self.limit.replace('_', ' ')} limit reached"
        return ended


def signal_name(number: int) -> str:
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Sandbox(Protocol):
    """A place to run processes confined. ``name`` is what T1 and results record."""

    name: str

    def unavailable(self) -> str | None:
        """None when this host can run the backend, else one line saying how to fix it."""
        ...

    async def run(
        self,
        argv: Sequence[str],
        *,
        workspace: Path,
        cwd: Path | None = None,
        stdin: bytes = b"",
        env: Mapping[str, str],
        limits: Limits,
        network: NetworkPolicy | None = None,
        hidden: Sequence[Path] = (),
        git_writable: bool = False,
        on_output: OutputSink | None = None,
    ) -> SandboxResult:
        """Run ``argv`` in ``cwd`` (default: the workspace) and wait until every process
        it started has ended. Cancellation kills the whole tree, then propagates.

        ``hidden`` paths are not reachable; the workspace's ``.git`` is read-only unless
        ``git_writable`` (``lodger.substrates.sandbox.policy``)."""
        ...

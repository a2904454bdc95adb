"""The unconfined backend: the command runs on the host with lodger's rights.

Chosen only by an explicit policy (``backend = "none"``), never as a fallback. The
limits still apply (cgroup, rlimits, wall time, output; the disk limit over the
workspace, ``lodger.substrates.sandbox._disk``, not over the host's /tmp) and the
process group is killed when the command returns, but a process that calls ``setsid``
can outlive it unless a cgroup holds it, files outside the workspace are reachable and
the network is open.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from lodger.substrates.sandbox._process import disk_watch, run_confined
from lodger.substrates.sandbox.interface import OutputSink, SandboxResult
from lodger.substrates.sandbox.policy import Limits, NetworkPolicy

__all__ = ["HostSandbox"]


class HostSandbox:
    name = "none"

    def unavailable(self) -> str | None:
        return None

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
        git_writable: bool = False,  # unconfined: everything is writable
        on_output: OutputSink | None = None,
    ) -> SandboxResult:
        where = Path(await asyncio.to_thread(os.path.realpath, cwd or workspace))
        root = Path(await asyncio.to_thread(os.path.realpath, workspace))
        return await run_confined(
            argv,
            backend=self.name,
            env=env,
            cwd=where,
            stdin=stdin,
            limits=limits,
            on_output=on_output,
            signal_exit_codes=False,
            # the workspace only: /tmp is the host's, shared with everything else
            disk=await disk_watch(limits, root, exclude=hidden, private_tmp=False),
        )

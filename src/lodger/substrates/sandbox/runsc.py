"""The gVisor backend: the command runs on a user-space kernel (``runsc``), for hosts
without user namespaces or for stronger isolation than namespaces give.

Each run writes an OCI bundle into a private temporary directory and starts it with
``runsc --network=none run``, behind ``setpriv --pdeathsig KILL`` so that it dies with
lodger, even a SIGKILLed one (bubblewrap's ``--die-with-parent``). The bundle's root is
an empty read-only directory with the same mounts as the bubblewrap backend: the system
directories read-only (secret files masked), the workspace read-write at its own path
with ``lodger.toml`` and ``.git`` read-only (``lodger.substrates.sandbox._git``), a
private ``/tmp``; nothing else of the host exists inside. gVisor gives new PID,
network, IPC, UTS and mount namespaces.

Limits: runsc runs with ``--ignore-cgroups``, so the gVisor sandbox's host processes
(the Sentry, which holds all the memory the command allocates, and the gofer) stay in
the cgroup lodger made for the command and the kernel enforces its memory limit on them.
Without that flag runsc (release 20221219 here) moves them into a cgroup of its own at
the hierarchy's root, ``/<container id>``, outside lodger's limit: a 300 MB allocation
then succeeded under a 64 MB limit, and a SIGKILLed run left that cgroup behind. CPU time
is counted for the sandbox as a whole (see ``lodger.substrates.sandbox._process``); the process
count is ``RLIMIT_NPROC`` inside gVisor (the host's pids cgroup would count gVisor's own
threads, so it is not used, and a refused fork is not reported as
``limit="processes"``); wall time and output are watched by lodger, which kills the
sandbox.

Output: the command starts behind ``/bin/sh``, which reopens its stdout (see
``_STDIO_WRAPPER``): this gVisor release sometimes hands the command a non-blocking
stdout, on which a plain program fails with EAGAIN once lodger reads slower than it writes.

Network policy: only ``off`` is supported by this backend; a policy that allows domains
is refused (the egress proxy is wired into bubblewrap only).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lodger.errors import ConfigError
from lodger.substrates.sandbox._git import git_placeholder, protected_git
from lodger.substrates.sandbox._process import disk_watch, made_in_thread, run_confined
from lodger.substrates.sandbox.bubblewrap import (
    SYSTEM_DIRS,
    confinable_workspace,
    masked_paths,
    pinned_ancestors,
)
from lodger.substrates.sandbox.interface import OutputSink, SandboxResult
from lodger.substrates.sandbox.policy import Limits, NetworkPolicy, protected_files

__all__ = ["RunscSandbox", "oci_config"]

FIX = "gVisor is not installed; install it: apt-get install -y runsc"
SETPRIV_FIX = "setpriv is not installed; install it: apt-get install -y util-linux"


class RunscSandbox:
    name = "runsc"

    def __init__(self, *, executable: str | None = None) -> None:
        self.executable = executable or shutil.which("runsc") or "runsc"
        self.setpriv = shutil.which("setpriv") or "setpriv"

    def unavailable(self) -> str | None:
        if shutil.which(self.executable) is None:
            return FIX
        if shutil.which(self.setpriv) is None:
            return SETPRIV_FIX
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
        git_writable: bool = False,
        on_output: OutputSink | None = None,
    ) -> SandboxResult:
        if network is not None and network.enabled:
            raise ConfigError(
                "the runsc sandbox backend supports no network; its policy allows "
                + ", ".join(network.allow),
                hint="use the bubblewrap backend for a policy that allows domains",
            )
        root = await asyncio.to_thread(confinable_workspace, workspace)
        async with git_placeholder(root, writable=git_writable):
            return await self._run(
                argv,
                workspace=root,
                cwd=cwd,
                stdin=stdin,
                env=env,
                limits=limits,
                hidden=hidden,
                git_writable=git_writable,
                on_output=on_output,
            )

    async def _run(
        self,
        argv: Sequence[str],
        *,
        workspace: Path,
        cwd: Path | None,
        stdin: bytes,
        env: Mapping[str, str],
        limits: Limits,
        hidden: Sequence[Path],
        git_writable: bool,
        on_output: OutputSink | None,
    ) -> SandboxResult:
        disk = await disk_watch(limits, workspace, exclude=hidden, private_tmp=False)
        try:
            bundle = await made_in_thread(
                functools.partial(
                    _write_bundle,
                    argv,
                    workspace=workspace,
                    cwd=cwd,
                    env=env,
                    limits=limits,
                    hidden=hidden,
                    git_writable=git_writable,
                    file_bytes=disk.file_ceiling if disk is not None else None,
                ),
                undo=_remove_bundle,  # else it stays in the temporary folder for good
            )
        except BaseException:
            if disk is not None:
                disk.close()
            raise
        try:
            command = [
                # runsc has no --die-with-parent: without this, a SIGKILLed lodger left
                # the sandbox and its command running. Killing `runsc run` is enough: it
                # starts the sandbox --attached (it dies with runsc run).
                self.setpriv,
                "--pdeathsig",
                "KILL",
                "--",
                self.executable,
                "--network=none",
                "--ignore-cgroups",
                f"--root={bundle / 'state'}",
                "run",
                f"--bundle={bundle}",
                f"lodger-{uuid.uuid4().hex[:12]}",
            ]
            host_limits = dataclasses.replace(limits, max_processes=None)
            result = await run_confined(
                command,
                backend=self.name,
                env={"PATH": os.defpath},
                cwd=bundle,
                stdin=stdin,
                limits=host_limits,
                on_output=on_output,
                signal_exit_codes=True,
                # the gofer, a host process, writes the command's files: RLIMIT_FSIZE
                # would kill it, so the limit is set inside gVisor instead (oci_config)
                disk=disk,
                rlimit_fsize=False,
            )
        finally:
            await _remove_bundle(bundle)
        how = dict(result.enforcement)
        if limits.disk_bytes is not None:
            how["disk"] = (
                "RLIMIT_FSIZE per file inside gVisor, lodger kills the tree when the "
                "workspace holds that much more (/tmp: in the Sentry's memory)"
            )
        if limits.max_processes is not None:
            how["processes"] = "RLIMIT_NPROC inside gVisor"
        return dataclasses.replace(result, enforcement=how)


# This gVisor release imports the command's stdout now and then with O_NONBLOCK set (seen
# in /proc/self/fdinfo/1: 4 runs in 30), so a command that does not expect EAGAIN stops
# when lodger reads more slowly than it writes ("yes: standard output: Resource
# temporarily unavailable", exit 1, the output limit unseen). The command therefore
# starts behind a POSIX shell that reopens its stdout through /proc (a fresh, blocking
# open of the same pipe: 30 in 30 blocking) and points stderr at it, then execs it with
# its own argv; where the reopen fails, the command runs with the stdio it was given.
_STDIO_WRAPPER = (
    "/bin/sh",
    "-c",
    '{ command exec 1>/proc/self/fd/1; } 2>/dev/null && exec 2>&1; exec "$@"',
    "lodger-sandbox",
)


async def _remove_bundle(bundle: Path) -> None:
    await asyncio.to_thread(shutil.rmtree, bundle, True)


def _write_bundle(
    argv: Sequence[str],
    *,
    workspace: Path,
    cwd: Path | None,
    env: Mapping[str, str],
    limits: Limits,
    hidden: Sequence[Path],
    git_writable: bool,
    file_bytes: int | None,
) -> Path:
    root = Path(os.path.realpath(workspace))
    where = Path(os.path.realpath(cwd)) if cwd is not None else root
    # Before the bundle exists: a workspace refused here leaves nothing behind.
    config = oci_config(
        argv,
        workspace=root,
        cwd=where,
        env=env,
        limits=limits,
        hidden=hidden,
        git_writable=git_writable,
        file_bytes=file_bytes,
    )
    bundle = Path(tempfile.mkdtemp(prefix="lodger-runsc-"))
    (bundle / "rootfs").mkdir()
    (bundle / "state").mkdir()
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def oci_config(
    argv: Sequence[str],
    *,
    workspace: Path,
    cwd: Path,
    env: Mapping[str, str],
    limits: Limits,
    hidden: Sequence[Path] = (),
    git_writable: bool = False,
    file_bytes: int | None = None,
) -> dict[str, Any]:
    """The OCI runtime spec for one command (see the module doc); where ``workspace`` has
    no ``.git``, a caller that keeps it read-only holds ``git_placeholder`` meanwhile.
    ``file_bytes``: its RLIMIT_FSIZE (default: the disk limit; ``DiskWatch.file_ceiling``)."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
    ]
    for path in SYSTEM_DIRS:
        source = os.path.realpath(path)
        if os.path.isdir(source):
            mounts.append(_bind(source, path, writable=False))
    git = protected_git(workspace) if not git_writable else None
    mounts.append(_bind(str(workspace), str(workspace), writable=True))
    for between in pinned_ancestors(workspace, [*hidden, *(git.inner if git else ())]):
        mounts.append(_bind(between, between, writable=True))
    for trusted in protected_files(workspace):  # lodger.toml: the host's configuration
        mounts.append(_bind(trusted, trusted, writable=False))
    for trusted in git.read_only if git else ():  # .git: what the host's git runs
        mounts.append(_bind(trusted, trusted, writable=False))
    covered = [*masked_paths(), *(os.path.realpath(p) for p in hidden)]
    for path in covered:
        inside = any(Path(path).is_relative_to(d) for d in (*SYSTEM_DIRS, str(workspace)))
        if not inside or not os.path.lexists(path):
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            mounts.append(
                {"destination": path, "type": "tmpfs", "source": "tmpfs", "options": ["ro"]}
            )
        else:
            mounts.append(_bind("/dev/null", path, writable=False))
    rlimits = [{"type": "RLIMIT_CORE", "hard": 0, "soft": 0}]
    if file_bytes is None:
        file_bytes = limits.disk_bytes
    if file_bytes is not None:
        n = file_bytes
        rlimits.append({"type": "RLIMIT_FSIZE", "hard": n, "soft": n})
    if limits.max_processes is not None:
        n = limits.max_processes
        rlimits.append({"type": "RLIMIT_NPROC", "hard": n, "soft": n})
    return {
        "ociVersion": "1.0.0",
        "process": {
            "args": [*_STDIO_WRAPPER, *argv],
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": str(cwd),
            "user": {"uid": 0, "gid": 0},
            "rlimits": rlimits,
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "lodger-sandbox",
        "mounts": mounts,
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
    }


def _bind(source: str, destination: str, *, writable: bool) -> dict[str, Any]:
    return {
        "destination": destination,
        "type": "bind",
        "source": source,
        "options": ["rbind", "rw" if writable else "ro"],
    }

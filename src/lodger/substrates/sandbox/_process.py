"""Running a confining command line: limits, streamed output, and killing the whole tree.

Shared by every backend. The child joins its cgroup and gets its rlimits before it runs
the command, so everything it starts is counted and limited: it is started as a tiny
``/bin/sh`` trampoline (``_ENTER``) that writes its own pid into the cgroup, sets the
rlimits with ``ulimit`` and only then ``exec``s the command line (same pid). That keeps
the spawn a ``vfork``: a ``preexec_fn`` would make Python ``fork``, which copies the
page tables of this whole process while holding the event loop (37 ms measured with a
0.8 GB heap, 0.3 ms as a ``vfork``). A trampoline that cannot enter the cgroup or set a
limit exits 125 before running anything. Wall time and output size are watched here;
when either runs out, or the caller is cancelled, or the command returns, the process
group is SIGKILLed and so is everything left in the cgroup. Backends add their own
guarantee on top (bubblewrap: a PID namespace dies with its init).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from lodger.errors import UsageError
from lodger.substrates.sandbox._disk import DiskWatch
from lodger.substrates.sandbox.cgroups import Cgroup, CgroupUsage
from lodger.substrates.sandbox.interface import (
    Connection,
    LimitName,
    OutputSink,
    SandboxResult,
    signal_name,
)
from lodger.substrates.sandbox.policy import Limits

__all__ = ["ENTER_FAILED", "disk_watch", "made_in_thread", "run_confined"]

T = TypeVar("T")

_SH = "/bin/sh"
#: the trampoline's exit status when it could not confine itself (nothing was run)
ENTER_FAILED = 125
# $1: how many cgroup.procs files follow; then the RLIMIT_CPU hard and soft limits (or -),
# the RLIMIT_AS limit in KiB (or -), the RLIMIT_FSIZE limit in 512-byte blocks (POSIX
# ``ulimit -f``; or -), and the command line. Every value is an argument,
# never part of the script. The soft CPU limit goes first: a hard limit below the soft one
# still in force (unlimited) is refused.
_ENTER = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do '
    'echo "$$" > "$1" || { echo "lodger: cannot join the cgroup $1" >&2; exit {failed}; }; '
    "shift; n=$((n - 1)); done; "
    'ulimit -c 0 || { echo "lodger: cannot set RLIMIT_CORE" >&2; exit {failed}; }; '
    'if [ "$1" != - ]; then ulimit -S -t "$2" && ulimit -H -t "$1" '
    '|| { echo "lodger: cannot set RLIMIT_CPU" >&2; exit {failed}; }; fi; shift 2; '
    'if [ "$1" != - ]; then ulimit -v "$1" '
    '|| { echo "lodger: cannot set RLIMIT_AS" >&2; exit {failed}; }; fi; shift; '
    'if [ "$1" != - ]; then ulimit -f "$1" '
    '|| { echo "lodger: cannot set RLIMIT_FSIZE" >&2; exit {failed}; }; fi; shift; '
    'exec "$@"'
).replace("{failed}", str(ENTER_FAILED))


def trampoline(
    host_argv: Sequence[str],
    procs: Sequence[str | os.PathLike[str]],
    *,
    cpu_s: float | None,
    memory_bytes: int | None,
    file_bytes: int | None = None,
) -> list[str]:
    """The argv that joins ``procs`` (cgroup.procs files), sets RLIMIT_CORE to 0, RLIMIT_CPU
    to ``cpu_s`` (soft, rounded up; hard one second more), RLIMIT_AS to ``memory_bytes``
    (in whole KiB) and RLIMIT_FSIZE to ``file_bytes`` (in whole 512-byte blocks), then
    runs ``host_argv`` in its place."""
    if not host_argv:  # ``exec`` with nothing would "succeed" without running anything
        raise UsageError("an empty command line", hint="name a program to run", code="usage")
    cpu = ["-", "-"]
    if cpu_s is not None:
        soft = max(1, math.ceil(cpu_s))
        cpu = [str(soft + 1), str(soft)]
    memory = "-" if memory_bytes is None else str(max(1, memory_bytes // 1024))
    files = "-" if file_bytes is None else str(max(1, file_bytes // 512))
    return [_SH, "-c", _ENTER, "lodger-enter", str(len(procs)), *map(str, procs), *cpu,
            memory, files, *host_argv]  # fmt: skip


_READ = 65536
_REAP_GRACE_S = 2.0
# How often the whole tree's CPU time is read against its budget: the budget may be
# overrun by about this much times the number of CPUs.
_CPU_POLL_S = 0.05


async def run_confined(
    host_argv: Sequence[str],
    *,
    backend: str,
    env: Mapping[str, str],
    cwd: Path,
    stdin: bytes,
    limits: Limits,
    on_output: OutputSink | None,
    signal_exit_codes: bool,
    connections: list[Connection] | None = None,
    rlimit_cpu: bool = True,
    cgroup_root: Path | None = None,
    pass_fds: Sequence[int] = (),
    disk: DiskWatch | None = None,
    rlimit_fsize: bool = True,
    on_spawn: Callable[[int], None] = lambda pid: None,
) -> SandboxResult:
    """Run ``host_argv`` (the backend's full command line) under ``limits``.

    ``signal_exit_codes``: exit code 128+N means killed by signal N (bubblewrap, runsc).
    ``cgroup_root``: make the cgroup in this cgroup2 mount (``Cgroup.create(v2_root=)``).
    ``pass_fds``: the only descriptors the child keeps (bubblewrap's seccomp filter).
    ``disk``: the disk limit's watcher; ``rlimit_fsize``: RLIMIT_FSIZE too (not gVisor)."""
    if not host_argv:  # refused here, before a cgroup is made for it
        trampoline(host_argv, [], cpu_s=None, memory_bytes=None)
    cgroup = await _cgroup_for(limits, cgroup_root, disk)
    # The cgroup counts the whole tree's CPU time; RLIMIT_CPU (per process) only where
    # it cannot, since four processes could each use nearly the whole budget.
    tree_budget = limits.cpu_time_s if "cpuacct" in cgroup.enforced else None
    rlimit_cpu = rlimit_cpu and tree_budget is None
    enforcement = _enforcement(limits, cgroup, rlimit_cpu=rlimit_cpu)
    enforcement.update(_disk_enforcement(disk, rlimit_fsize))
    procs = cgroup.procs_files()
    use_rlimit_as = limits.memory_bytes is not None and "memory" not in cgroup.enforced

    argv = trampoline(
        host_argv,
        procs,
        cpu_s=limits.cpu_time_s if rlimit_cpu else None,
        memory_bytes=limits.memory_bytes if use_rlimit_as else None,
        file_bytes=_file_ceiling(limits, disk) if rlimit_fsize else None,
    )
    started = time.monotonic()
    watch = _Watch(limits=limits, cgroup=cgroup, on_output=on_output, disk=disk)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=dict(env),
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # with no preexec_fn: a vfork, not a fork
            pass_fds=tuple(pass_fds),
        )
        on_spawn(process.pid)  # the backend's pid, which leads its process group
        await watch.supervise(process, stdin, tree_budget)
        returncode = process.returncode
        assert returncode is not None
        usage = cgroup.usage()
    finally:
        if disk is not None:
            await asyncio.shield(asyncio.to_thread(disk.finish))
        await asyncio.shield(_cleanup(cgroup))
    exit_code, sig, limit = _verdict(returncode, watch.limit, usage, signal_exit_codes, disk)
    return SandboxResult(
        backend=backend,
        exit_code=exit_code,
        signal=sig,
        limit=limit,
        output=bytes(watch.kept),
        output_total=watch.total,
        duration_s=time.monotonic() - started,
        cpu_s=usage.cpu_s,
        cpu_throttled=usage.cpu_throttled,
        enforcement=enforcement,
        connections=tuple(connections or ()),
    )


async def disk_watch(
    limits: Limits, workspace: Path, *, exclude: Sequence[Path] = (), private_tmp: bool = True
) -> DiskWatch | None:
    """The watcher of ``limits.disk_bytes`` over ``workspace``, ready (every file's size
    recorded, its directories watched) before the command starts; None without a limit."""
    if limits.disk_bytes is None:
        return None
    watch = DiskWatch(workspace, limit=limits.disk_bytes, exclude=exclude, private_tmp=private_tmp)
    try:
        await asyncio.to_thread(watch.prepare)
    except BaseException:
        watch.close()
        raise
    return watch


def _file_ceiling(limits: Limits, disk: DiskWatch | None) -> int | None:
    return disk.file_ceiling if disk is not None else limits.disk_bytes


def _disk_enforcement(disk: DiskWatch | None, rlimit_fsize: bool) -> dict[str, str]:
    if disk is None:
        return {}
    how = "RLIMIT_FSIZE per file, " if rlimit_fsize else ""
    if disk.private_tmp:
        how += "a /tmp of that size, "
    return {"disk": how + "lodger kills the tree when the workspace and /tmp hold that much more"}


async def _cgroup_for(limits: Limits, cgroup_root: Path | None, disk: DiskWatch | None) -> Cgroup:
    """The command's own cgroup, made in a thread (and removed if the caller is
    cancelled meanwhile: else its directories stay in the host's hierarchy for good).
    If none can be made, the disk watcher is closed: the command will not run."""
    try:
        return await _made_cgroup(limits, cgroup_root)
    except BaseException:
        if disk is not None:
            disk.close()
        raise


async def _made_cgroup(limits: Limits, cgroup_root: Path | None) -> Cgroup:
    return await made_in_thread(
        functools.partial(
            Cgroup.create,
            memory_bytes=limits.memory_bytes,
            max_processes=limits.max_processes,
            cpu_rate=limits.cpu_rate,
            count_cpu=limits.cpu_time_s is not None,
            v2_root=cgroup_root,
        ),
        undo=_cleanup,
    )


@dataclass(kw_only=True)
class _Watch:
    """One confined command while it runs: its input fed, its output kept up to the
    limit, its CPU budget watched, and which limit (if any) stopped it."""

    limits: Limits
    cgroup: Cgroup
    on_output: OutputSink | None
    disk: DiskWatch | None = None
    limit: LimitName | None = None
    kept: bytearray = field(default_factory=bytearray)
    total: int = 0

    async def supervise(
        self, process: asyncio.subprocess.Process, stdin: bytes, tree_budget: float | None
    ) -> None:
        """Until the command has exited and closed its output, or a limit stopped it;
        whatever happens, nothing it started survives."""
        stdout = process.stdout
        assert stdout is not None  # stdout=PIPE
        watcher = (
            asyncio.create_task(self._watch_cpu(process, tree_budget)) if tree_budget else None
        )
        if self.disk is not None:  # a thread, stopped by run_confined (``finish``)
            self.disk.start(process.pid, functools.partial(_kill, process, self.cgroup))
        try:
            # EOF as well as the exit: a background process holding the pipe is still
            # part of the command, and the wall-time limit covers it too.
            async with asyncio.timeout(self.limits.wall_time_s):
                async with asyncio.TaskGroup() as group:
                    group.create_task(_feed(process, stdin))
                    group.create_task(self._drain(process, stdout))
                await process.wait()
        except TimeoutError:
            self.limit = "wall_time"
        finally:
            if watcher is not None:  # owned here: stopped and awaited before leaving
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            # Whatever happened (return, limit, cancellation): nothing it started survives.
            _kill(process, self.cgroup)
            await asyncio.shield(_reap(process, stdout))

    async def _drain(
        self, process: asyncio.subprocess.Process, stdout: asyncio.StreamReader
    ) -> None:
        limit = self.limits.output_bytes
        while chunk := await stdout.read(_READ):
            room = limit - self.total
            self.total += len(chunk)
            if room > 0:
                self.kept.extend(chunk[:room])
                if self.on_output is not None:
                    self.on_output(chunk[:room])
            if self.total > limit and self.limit is None:
                self.limit = "output"
                _kill(process, self.cgroup)
                # Go on reading (and dropping) to EOF: a pipe left unread stays paused,
                # and the process transport only finishes once its pipes have closed.

    async def _watch_cpu(self, process: asyncio.subprocess.Process, budget: float) -> None:
        while True:
            used = self.cgroup.cpu_seconds()
            if used is not None and used >= budget:
                if self.limit is None:
                    self.limit = "cpu_time"
                _kill(process, self.cgroup)
                return
            await asyncio.sleep(_CPU_POLL_S)


async def _feed(process: asyncio.subprocess.Process, stdin: bytes) -> None:
    if process.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        process.stdin.write(stdin)
        await process.stdin.drain()
    process.stdin.close()


def _verdict(
    returncode: int,
    limit: LimitName | None,
    usage: CgroupUsage,
    signal_exit_codes: bool,
    disk: DiskWatch | None = None,
) -> tuple[int | None, str | None, LimitName | None]:
    """The command's exit code or signal, and the limit that stopped it."""
    exit_code: int | None = returncode
    sig: str | None = None
    if returncode < 0:
        exit_code, sig = None, signal_name(-returncode)
    elif signal_exit_codes and returncode > 128 and returncode - 128 < signal.NSIG:
        exit_code, sig = None, signal_name(returncode - 128)
    if limit is None:
        if usage.oom_kills:
            limit = "memory"
        elif sig == "SIGXCPU":
            limit = "cpu_time"
        elif usage.pids_refused:
            limit = "processes"
        elif (disk is not None and disk.over) or sig == "SIGXFSZ":  # watcher, RLIMIT_FSIZE
            limit = "disk"
    return exit_code, sig, limit


async def _reap(process: asyncio.subprocess.Process, stdout: asyncio.StreamReader) -> None:
    # The process transport finishes (and wait() returns) only once its pipes have
    # closed, and a pipe nobody reads stays paused: read the rest and drop it.
    try:
        async with asyncio.timeout(_REAP_GRACE_S):
            while await stdout.read(_READ):
                pass
    except TimeoutError:
        # Something outside our kill still holds the pipe (an unconfined setsid child
        # with no cgroup): stop listening to it rather than wait for it forever.
        transport = process._transport  # type: ignore[attr-defined]
        transport.close()
    await process.wait()


def _kill(process: asyncio.subprocess.Process, cgroup: Cgroup) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    cgroup.kill_all()


async def made_in_thread(make: Callable[[], T], *, undo: Callable[[T], Awaitable[None]]) -> T:
    """``make()`` run in a worker thread. Cancelled meanwhile, the thread goes on all the
    same (a thread cannot be stopped): wait for it, ``undo`` what it made (a cgroup, a
    bundle directory), then let the cancellation go on, so nothing is left behind."""
    making = asyncio.ensure_future(asyncio.to_thread(make))
    try:
        return await asyncio.shield(making)
    except asyncio.CancelledError:
        await asyncio.wait({making})
        if not making.cancelled() and making.exception() is None:
            await asyncio.shield(undo(making.result()))
        raise


async def _cleanup(cgroup: Cgroup) -> None:
    # Killed processes leave the cgroup once they are reaped; that is quick but not instant.
    for _ in range(200):
        if await asyncio.to_thread(cgroup.remove):
            return
        await asyncio.sleep(0.01)


def _enforcement(limits: Limits, cgroup: Cgroup, *, rlimit_cpu: bool) -> dict[str, str]:
    how = {"wall_time": "lodger kills the tree", "output": "lodger kills the tree"}
    cg = f"cgroup v{cgroup.version}"
    if limits.memory_bytes is not None:
        how["memory"] = cg if "memory" in cgroup.enforced else "RLIMIT_AS per process"
    if limits.max_processes is not None:
        how["processes"] = cg if "pids" in cgroup.enforced else "not enforced on this host"
    if limits.cpu_time_s is not None:
        if "cpuacct" in cgroup.enforced:
            how["cpu_time"] = f"{cg}, whole tree: lodger kills it when the budget is spent"
        else:
            how["cpu_time"] = "RLIMIT_CPU per process" if rlimit_cpu else "not enforced"
    if limits.cpu_rate is not None:
        how["cpu_rate"] = cg if "cpu" in cgroup.enforced else "not enforced on this host"
    return how

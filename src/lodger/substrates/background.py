"""Background processes: commands that outlive the call that started them (DESIGN 13).

A session's ``ProcessTable`` (``table_for(session_id)``, one per session in this lodger
process) runs each background command in a bubblewrap sandbox like a shell command's,
under limits of its own (``ProcessLimits``), with its output in a bounded file and its
stdin a pipe lodger keeps open. Every command of the session (background or not) that has
no network policy shares one network namespace, held by a small sandboxed ``sleep``
(``_Holder``): it has only a loopback interface, so a server a background process starts
on ``127.0.0.1`` is reachable by a later ``shell`` call and by nothing outside.

Facts: ``process_started`` commits with the T2 of the call that started the process; a
process's end is recorded as ``process_ended`` with the T2 of the next process call that
sees it (``settled``), or at the turn's end (``turn_ending``: processes kept for the turn
are stopped then), or on resume (``reconcile``: a process the log says is live is adopted
when the same pid with the same start time still runs, else recorded ``unknown``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lodger.errors import ToolCallError
from lodger.events import Event, ProcessEnded, ProcessStarted
from lodger.substrates.sandbox.interface import SandboxResult
from lodger.substrates.sandbox.policy import Limits

__all__ = [
    "ProcessLimits",
    "ProcessTable",
    "process_identity",
    "reconcile",
    "table_for",
    "turn_ending",
    "unconverged",
]

Keep = Literal["turn", "session"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessLimits:
    """What a session's background processes may use. ``max_processes`` and
    ``kept_bytes`` cover the whole set; ``memory_bytes``, ``cpu_time_s``, ``wall_time_s``
    ``output_bytes`` and ``disk_bytes`` each process (a cgroup per process and a disk
    watcher, as for a shell command)."""

    max_processes: int = 4
    #: bytes of output kept in each process's file (the rest is counted, not kept)
    kept_bytes: int = 1024 * 1024
    #: total output after which the process is stopped (limit ``output``)
    output_bytes: int = 64 * 1024 * 1024
    wall_time_s: float = 3600.0
    cpu_time_s: float | None = 600.0
    memory_bytes: int | None = 1024 * 1024 * 1024
    #: what one process may write into the workspace and its private ``/tmp``, as a
    #: shell command's disk limit (``lodger.substrates.sandbox._disk``: limit ``disk``)
    disk_bytes: int | None = 1024 * 1024 * 1024

    def sandbox_limits(self) -> Limits:
        return Limits(
            wall_time_s=self.wall_time_s,
            cpu_time_s=self.cpu_time_s,
            memory_bytes=self.memory_bytes,
            output_bytes=self.output_bytes,
            disk_bytes=self.disk_bytes,
        )


def process_identity(pid: int) -> str | None:
    """``start=<ticks> boot=<boot id>`` for a live ``pid`` (what ``process_started``
    records as part of ``sandbox``), None when no such process runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    # the command name, in parentheses, may hold spaces: fields count from its end
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # exited, not yet reaped: not running
        return None
    return f"start={fields[19]} boot={boot}"


@dataclass(eq=False, kw_only=True)
class _Process:
    """One background process this lodger process runs (or adopted after a crash)."""

    process_id: str
    command: str
    keep: Keep
    pid: int
    output: Path | None
    task: asyncio.Task[SandboxResult] | None
    input_fd: int | None = None
    written: int = 0
    kept_limit: int = 0
    total: int = 0
    stopping: bool = False
    ended: ProcessEnded | None = None
    recorded: bool = False

    def done(self) -> bool:
        if self.task is not None:
            return self.task.done()
        return self.ended is not None or process_identity(self.pid) is None

    def sink(self, limit: int) -> None:
        """The output file; ``feed`` appends to it up to ``limit`` bytes."""
        assert self.output is not None
        self.output.touch()
        self.kept_limit = limit

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.kept_limit - self.written
        if room <= 0 or self.output is None:
            return
        with self.output.open("ab") as out:  # small appends; the page cache absorbs them
            out.write(chunk[:room])
        self.written += min(room, len(chunk))


def _ended_of(p: _Process) -> ProcessEnded:
    """How ``p`` ended, from its task (which is done)."""
    task = p.task
    if task is None:  # adopted: lodger saw no exit status
        return ProcessEnded(
            process_id=p.process_id, status="exited", reason="adopted; exit status unseen"
        )
    if task.cancelled() or p.stopping:
        return ProcessEnded(
            process_id=p.process_id, status="stopped", reason="stopped", output_bytes=p.total
        )
    exc = task.exception()
    if exc is not None:
        return ProcessEnded(
            process_id=p.process_id, status="killed", reason=str(exc)[:500], output_bytes=p.total
        )
    result = task.result()
    if result.limit is not None:
        return ProcessEnded(
            process_id=p.process_id,
            status="limit",
            reason=result.limit,
            exit_code=result.exit_code,
            output_bytes=result.output_total,
        )
    status: Literal["exited", "killed"] = "killed" if result.signal else "exited"
    return ProcessEnded(
        process_id=p.process_id,
        status=status,
        exit_code=result.exit_code,
        reason=result.signal or "",
        output_bytes=result.output_total,
    )


class _Holder:
    """The session's network namespace: a sandboxed ``sleep`` whose namespace (loopback
    only) every command of the session joins (``bubblewrap.joining_net``)."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self.inner: int | None = None

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self, argv: Sequence[str]) -> int:
        self.process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(500):  # bwrap's child, in the new namespaces, within milliseconds
            self.inner = _inner_of(self.process.pid)
            if self.inner is not None:
                return self.inner
            if self.process.returncode is not None:
                break
            await asyncio.sleep(0.01)
        await self.stop()
        raise ToolCallError(
            "the session's sandbox network could not be set up (bubblewrap did not start)",
            hint="tell the user; nothing ran",
            code="sandbox_unavailable",
        )

    async def stop(self) -> None:
        process, self.process, self.inner = self.process, None, None
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


def _inner_of(pid: int) -> int | None:
    """bwrap ``pid``'s child once it is in a network namespace other than lodger's."""
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if found and os.readlink(f"/proc/{found[0]}/ns/net") != os.readlink("/proc/self/ns/net"):
            return int(found[0])
    except (OSError, ValueError):
        pass
    return None


@dataclass(eq=False)
class ProcessTable:
    """The background processes of one session in this lodger process."""

    session_id: str
    processes: dict[str, _Process] = field(default_factory=dict)
    holder: _Holder = field(default_factory=_Holder)
    _dir: Path | None = None

    def live(self) -> list[_Process]:
        return [p for p in self.processes.values() if not p.done()]

    def net_pid(self) -> int | None:
        """The pid whose network namespace the session's commands share, if there is one."""
        return self.holder.inner if self.holder.alive() else None

    async def ensure_net(self, holder_argv: Sequence[str]) -> int:
        if self.holder.alive() and self.holder.inner is not None:
            return self.holder.inner
        return await self.holder.start(holder_argv)

    def output_path(self, process_id: str) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="lodger-processes-"))
        return self._dir / f"{process_id}.out"

    def get(self, process_id: str) -> _Process:
        p = self.processes.get(process_id)
        if p is None:
            raise ToolCallError(
                f"no background process {process_id!r} in this session",
                hint="use the process id start_process returned",
                code="unknown_process",
            )
        return p

    def settled(self) -> list[ProcessEnded]:
        """The ends not yet recorded of processes that ended: the caller records them."""
        out: list[ProcessEnded] = []
        for p in self.processes.values():
            if not p.recorded and p.done():
                p.ended = p.ended or _ended_of(p)
                p.recorded = True
                out.append(p.ended)
                _close_input(p)
        return out

    async def stop(self, p: _Process) -> None:
        """Stop ``p`` and everything it started (its task kills the tree)."""
        p.stopping = True
        if p.task is not None:
            p.task.cancel()
            await asyncio.wait([p.task])
        elif not p.done():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.ended = ProcessEnded(process_id=p.process_id, status="stopped", reason="stopped")
        _close_input(p)

    async def end_turn(self) -> list[ProcessEnded]:
        for p in self.live():
            if p.keep == "turn":
                await self.stop(p)
        ended = self.settled()
        if not self.live():
            await self.holder.stop()
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
            self.processes = {k: p for k, p in self.processes.items() if not p.recorded}
        return ended


def _close_input(p: _Process) -> None:
    if p.input_fd is not None:
        with contextlib.suppress(OSError):
            os.close(p.input_fd)
        p.input_fd = None


_TABLES: dict[str, ProcessTable] = {}


def table_for(session_id: str, *, create: bool = True) -> ProcessTable | None:
    """The session's table in this lodger process (None with ``create=False`` if none)."""
    table = _TABLES.get(session_id)
    if table is None and create:
        table = _TABLES[session_id] = ProcessTable(session_id)
    return table


async def turn_ending(session_id: str) -> list[ProcessEnded]:
    """Stop the session's processes kept for the turn; every end not yet recorded, for
    the turn's end to commit. Nothing (and no table made) for a session with none."""
    table = _TABLES.get(session_id)
    if table is None:
        return []
    ended = await table.end_turn()
    if not table.processes:
        del _TABLES[session_id]
    return ended


def _unended(events: Iterable[Event]) -> dict[str, ProcessStarted]:
    started: dict[str, ProcessStarted] = {}
    for event in events:
        body = event.body
        if isinstance(body, ProcessStarted):
            started[body.process_id] = body
        elif isinstance(body, ProcessEnded):
            started.pop(body.process_id, None)
    return started


def reconcile(session_id: str, events: Iterable[Event]) -> list[ProcessEnded]:
    """Before a resumed run starts: each process the log says is live is adopted when it
    still runs (in this lodger process's table, or the same pid with the same start time
    and boot), else its end is returned as ``unknown`` for the caller to record."""
    table = _TABLES.get(session_id)
    ended: list[ProcessEnded] = list(table.settled()) if table is not None else []
    for process_id, started in _unended(events).items():
        if any(e.process_id == process_id for e in ended):
            continue
        if table is not None and process_id in table.processes:
            continue  # this process runs it: still live (its end is recorded later)
        identity = process_identity(started.pid) if started.pid is not None else None
        if identity is not None and started.sandbox.endswith(identity):
            adopted = table_for(session_id)
            assert adopted is not None
            adopted.processes[process_id] = _Process(
                process_id=process_id,
                command=started.command,
                keep=started.keep,
                pid=started.pid or 0,
                output=None,
                task=None,
            )
            continue
        ended.append(
            ProcessEnded(
                process_id=process_id,
                status="unknown",
                reason="not running when the session resumed",
            )
        )
    return ended


def unconverged(
    session_id: str, events: Iterable[Event], ended: Iterable[ProcessEnded]
) -> tuple[str, ...]:
    """The resume invariant "no unconverged background work", checked as such: one line
    per process the log says is live that ``reconcile`` neither adopted (in this lodger
    process's table) nor ended (``ended``). Empty when every handle converged."""
    table = _TABLES.get(session_id)
    gone = {e.process_id for e in ended}
    return tuple(
        f"background: process {process_id} ({started.command!r}) is live in the log but "
        "neither running here nor ended"
        for process_id, started in _unended(events).items()
        if process_id not in gone and (table is None or process_id not in table.processes)
    )

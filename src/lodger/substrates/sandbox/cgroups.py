"""Memory, process-count and CPU limits through a cgroup, created per sandboxed command.

cgroup v2 is used where ``/sys/fs/cgroup`` is a writable unified hierarchy with the
``memory`` and ``pids`` controllers; otherwise the v1 ``memory``, ``pids``, ``cpu`` and
``cpuacct`` hierarchies if they are mounted and writable. If neither works the command
still runs, and ``Cgroup.enforced`` says which limits the kernel is not enforcing (the
caller falls back to ``RLIMIT_AS`` for memory and ``RLIMIT_CPU`` per process for CPU
time; nothing bounds the process count then, and the result says so).

CPU: a rate (``cpu_rate`` CPUs) is ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` (v1)
or ``cpu.max`` (v2); the CPU time the whole tree has used is ``cpuacct.usage`` (v1) or
``usage_usec`` of ``cpu.stat`` (v2, present in every v2 cgroup, no controller needed).
The caller polls ``cpu_seconds`` and kills the tree past its budget (the kernel has no
CPU-time limit for a group, only for one process).

The command joins the cgroup before it execs (the trampoline in ``_process`` writes its
pid to ``cgroup.procs``), so nothing it starts can be outside. ``kill_all`` SIGKILLs
every process left in it. A lodger killed with SIGKILL cannot remove its cgroups: the
first ``create`` in a process removes the ``lodger-*`` cgroups that are empty and older
than ``STALE_S`` (``sweep_stale``; the kernel refuses to remove one that holds a process).
``Cgroup.create(v2_root=...)`` makes the cgroup in a given cgroup2 mount instead (on a
hybrid host: ``/sys/fs/cgroup/unified``, where only the controller-less parts of v2
exist: ``cpu.stat`` and ``cgroup.kill``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CPU_PERIOD_US",
    "STALE_S",
    "Cgroup",
    "CgroupUsage",
    "cgroup2_mount",
    "cgroup_support",
    "sweep_stale",
]

_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
#: an empty lodger cgroup this old was left by a lodger that died before removing it (a
#: live one fills its cgroup within milliseconds of making it, and removes it at the end)
STALE_S = 600.0
_SWEPT: set[str] = set()
_SWEPT_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class CgroupUsage:
    oom_kills: int = 0
    pids_refused: int = 0
    #: CPU time the whole tree used, when the cgroup counts it
    cpu_s: float | None = None
    #: periods in which the CPU rate held the tree back
    cpu_throttled: int = 0


@dataclass(slots=True)
class Cgroup:
    """One cgroup (a directory per controller) for one command.

    ``dirs`` maps what is enforced (``memory``, ``pids``, ``cpu`` for the rate,
    ``cpuacct`` for counting CPU time) to the directory that does it.
    """

    version: int
    dirs: dict[str, Path] = field(default_factory=dict)

    @property
    def enforced(self) -> frozenset[str]:
        return frozenset(self.dirs)

    @classmethod
    def create(
        cls,
        *,
        memory_bytes: int | None,
        max_processes: int | None,
        cpu_rate: float | None = None,
        count_cpu: bool = False,
        v2_root: Path | None = None,
    ) -> Cgroup:
        name = f"lodger-{uuid.uuid4().hex[:12]}"
        wanted: dict[str, float | int] = {
            c: v
            for c, v in (("memory", memory_bytes), ("pids", max_processes), ("cpu", cpu_rate))
            if v is not None
        }
        if count_cpu:
            wanted["cpuacct"] = 1
        if not wanted:
            return cls(version=0)
        if v2_root is not None or _v2_usable():
            _sweep_once(v2_root or _v2_parent())
            group = _create_v2(v2_root or _v2_parent(), name, wanted)
            if group.dirs or v2_root is not None:
                return group
        group = cls(version=1)
        for controller, value in wanted.items():
            parent = _v1_parent(controller)
            _sweep_once(parent)
            # cpu and cpuacct mounted together: one directory serves both.
            shared = next((d for d in group.dirs.values() if _same(d.parent, parent)), None)
            path = shared or parent / name
            try:
                if shared is None:
                    path.mkdir()
                _configure(path, controller, value, version=1)
            except OSError:
                if shared is None:
                    _remove(path)
                continue
            group.dirs[controller] = path
        return group

    def procs_files(self) -> list[str]:
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    def cpu_seconds(self) -> float | None:
        """CPU time used so far by everything in the cgroup (None: not counted).

        A read of one small kernel file: cheap enough to call from the event loop."""
        path = self.dirs.get("cpuacct")
        if path is None:
            return None
        try:
            if self.version == 2:
                return _field(path / "cpu.stat", "usage_usec") / 1e6
            return int((path / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None

    def usage(self) -> CgroupUsage:
        oom = refused = throttled = 0
        memory = self.dirs.get("memory")
        if memory is not None:
            events = "memory.events" if self.version == 2 else "memory.oom_control"
            oom = _field(memory / events, "oom_kill")
        pids = self.dirs.get("pids")
        if pids is not None:
            refused = _field(pids / "pids.events", "max")
        cpu = self.dirs.get("cpu")
        if cpu is not None:
            throttled = _field(cpu / "cpu.stat", "nr_throttled")
        return CgroupUsage(
            oom_kills=oom,
            pids_refused=refused,
            cpu_s=self.cpu_seconds(),
            cpu_throttled=throttled,
        )

    def kill_all(self) -> None:
        """SIGKILL everything still in the cgroup (v2: ``cgroup.kill``)."""
        for path in {*self.dirs.values()}:
            if self.version == 2:
                with contextlib.suppress(OSError):
                    (path / "cgroup.kill").write_text("1")
            for _ in range(3):
                try:
                    pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

    def remove(self) -> bool:
        """Remove the directories; False while a killed process is still being reaped."""
        return all([_remove(path) for path in {*self.dirs.values()}])


def sweep_stale(parent: Path, *, older_than_s: float = STALE_S) -> list[Path]:
    """Remove the ``lodger-*`` cgroups under ``parent`` that are empty and were made more
    than ``older_than_s`` ago; the ones removed. Only ``rmdir``: nothing is killed, and
    the kernel refuses a cgroup that still holds a process (a command still running)."""
    removed: list[Path] = []
    cutoff = time.time() - older_than_s
    try:
        entries = sorted(parent.glob("lodger-*"))
    except OSError:
        return removed
    for path in entries:
        try:
            if path.stat().st_mtime > cutoff:
                continue
            path.rmdir()
        except OSError:
            continue  # busy (a process inside), gone meanwhile, or not ours to remove
        removed.append(path)
    return removed


def _sweep_once(parent: Path) -> None:
    with _SWEPT_LOCK:
        if str(parent) in _SWEPT:
            return
        _SWEPT.add(str(parent))
    sweep_stale(parent)


def _create_v2(parent: Path, name: str, wanted: dict[str, float | int]) -> Cgroup:
    path = parent / name
    group = Cgroup(version=2)
    try:
        path.mkdir()
    except OSError:
        return group
    for controller, value in wanted.items():
        try:
            _configure(path, controller, value, version=2)
        except OSError:
            continue  # that controller is not enabled for this subtree
        group.dirs[controller] = path
    if not group.dirs:
        _remove(path)
    return group


def _configure(path: Path, controller: str, value: float, *, version: int) -> None:
    if controller == "memory":
        if version == 2:
            (path / "memory.max").write_text(str(int(value)))
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0")
        else:
            (path / "memory.limit_in_bytes").write_text(str(int(value)))
            # Swap counts too where the kernel accounts it.
            with contextlib.suppress(OSError):
                (path / "memory.memsw.limit_in_bytes").write_text(str(int(value)))
    elif controller == "pids":
        (path / "pids.max").write_text(str(int(value)))
    elif controller == "cpu":
        quota = max(1000, round(value * CPU_PERIOD_US))
        if version == 2:
            (path / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        else:
            (path / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(quota))
    elif controller == "cpuacct":
        counter = "cpu.stat" if version == 2 else "cpuacct.usage"
        (path / counter).read_text()  # raises when this hierarchy does not count CPU time


def cgroup_support() -> str:
    """``"v2"``, ``"v1"`` or ``"none"``: what a command's memory/pids limits would use."""
    group = Cgroup.create(memory_bytes=1 << 30, max_processes=64)
    try:
        if group.version == 0 or not group.dirs:
            return "none"
        return f"v{group.version}"
    finally:
        group.remove()


def cgroup2_mount() -> Path | None:
    """Where a cgroup2 hierarchy is mounted (``/sys/fs/cgroup`` on a v2 host,
    ``/sys/fs/cgroup/unified`` on a hybrid one), or None."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return Path(left.split(" ")[4])
    return None


def _v2_usable() -> bool:
    controllers = _ROOT / "cgroup.controllers"
    try:
        return {"memory", "pids"} <= set(controllers.read_text().split())
    except OSError:
        return False


def _own_path(controller: str) -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if (controller == "" and names == "") or controller in names.split(","):
                return path.lstrip("/")
    return ""


def _v2_parent() -> Path:
    own = _ROOT / _own_path("")
    # A process may not sit in an inner node with children under v2: use the parent.
    return own.parent if own != _ROOT else own


def _v1_parent(controller: str) -> Path:
    base = _ROOT / controller
    own = base / _own_path(controller)
    return own if own.is_dir() else base


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _field(path: Path, name: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    return 0


def _remove(path: Path) -> bool:
    # A cgroup directory can only go once it is empty; its control files go with it.
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        with contextlib.suppress(OSError, ValueError):
            for pid in (int(p) for p in (path / "cgroup.procs").read_text().split()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return False
    return True

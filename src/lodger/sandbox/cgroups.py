"""Memory and process-count limits through a cgroup, created per sandboxed command.

cgroup v2 is used where ``/sys/fs/cgroup`` is a writable unified hierarchy with the
``memory`` and ``pids`` controllers; otherwise the v1 ``memory`` and ``pids`` hierarchies
if they are mounted and writable. If neither works the command still runs, and
``Cgroup.enforced`` says which limits the kernel is not enforcing (the caller falls back
to ``RLIMIT_AS`` for memory; nothing bounds the process count then, and the result says
so).

The process joins the cgroup before it execs (``join`` runs between fork and exec), so
nothing it starts can be outside. ``kill_all`` SIGKILLs every process left in it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Cgroup", "CgroupUsage", "cgroup_support"]

_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class CgroupUsage:
    oom_kills: int = 0
    pids_refused: int = 0


@dataclass(slots=True)
class Cgroup:
    """One cgroup (a directory per controller) for one command."""

    version: int
    dirs: dict[str, Path] = field(default_factory=dict)

    @property
    def enforced(self) -> frozenset[str]:
        return frozenset(self.dirs)

    @classmethod
    def create(cls, *, memory_bytes: int | None, max_processes: int | None) -> Cgroup:
        name = f"lodger-{uuid.uuid4().hex[:12]}"
        wanted = {
            c: v for c, v in (("memory", memory_bytes), ("pids", max_processes)) if v is not None
        }
        if not wanted:
            return cls(version=0)
        if _v2_usable():
            path = _v2_parent() / name
            try:
                path.mkdir()
                if "memory" in wanted:
                    (path / "memory.max").write_text(str(wanted["memory"]))
                    with contextlib.suppress(OSError):
                        (path / "memory.swap.max").write_text("0")
                if "pids" in wanted:
                    (path / "pids.max").write_text(str(wanted["pids"]))
            except OSError:
                _remove(path)
            else:
                return cls(version=2, dirs=dict.fromkeys(wanted, path))
        group = cls(version=1)
        for controller, value in wanted.items():
            path = _v1_parent(controller) / name
            try:
                path.mkdir()
                if controller == "memory":
                    (path / "memory.limit_in_bytes").write_text(str(value))
                    # Swap counts too where the kernel accounts it.
                    with contextlib.suppress(OSError):
                        (path / "memory.memsw.limit_in_bytes").write_text(str(value))
                else:
                    (path / "pids.max").write_text(str(value))
            except OSError:
                _remove(path)
                continue
            group.dirs[controller] = path
        return group

    def procs_files(self) -> list[str]:
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    def usage(self) -> CgroupUsage:
        oom = refused = 0
        memory = self.dirs.get("memory")
        if memory is not None:
            events = "memory.events" if self.version == 2 else "memory.oom_control"
            oom = _field(memory / events, "oom_kill")
        pids = self.dirs.get("pids")
        if pids is not None:
            refused = _field(pids / "pids.events", "max")
        return CgroupUsage(oom_kills=oom, pids_refused=refused)

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


def cgroup_support() -> str:
    """``"v2"``, ``"v1"`` or ``"none"``: what a command's memory/pids limits would use."""
    group = Cgroup.create(memory_bytes=1 << 30, max_processes=64)
    try:
        if group.version == 0 or not group.dirs:
            return "none"
        return f"v{group.version}"
    finally:
        group.remove()


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

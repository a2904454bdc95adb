"""Who holds a writer lock, and whether that process is still alive.

A writer names itself by host, pid and what makes a pid unambiguous on Linux: the boot
(``/proc/sys/kernel/random/boot_id``), the pid namespace and the process's start time
(field 22 of ``/proc/<pid>/stat``), so a recycled pid is never taken for the holder. On
the holder's own machine a dead holder is known at once; elsewhere only its lease's
expiry tells (``alive`` answers None: cannot tell). A holder killed and not yet reaped by
its parent (a zombie: state ``Z`` or ``X``, kept with its pid and start time until the
parent waits for it) is dead too: it runs no code and can write nothing again.
"""

from __future__ import annotations

import contextlib
import os
import socket
from functools import cache
from typing import Any

__all__ = ["alive", "describe", "this_process"]

#: process states of a holder that exited but is not reaped yet (zombie, dead)
_DEAD = frozenset({"Z", "X", "x"})


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (the state first)."""
    stat = _read(f"/proc/{pid}/stat")
    # the command name (field 2) is in parentheses and may hold spaces: split after it
    return stat.rpartition(")")[2].split()


def _start_time(pid: int) -> str:
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else ""


@cache
def _pid_namespace() -> str:
    with contextlib.suppress(OSError):
        return str(os.stat("/proc/self/ns/pid").st_ino)
    return ""


def this_process() -> dict[str, Any]:
    """This process as a writer record (a JSON object)."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "pid": pid,
        "boot": _read("/proc/sys/kernel/random/boot_id"),
        "pidns": _pid_namespace(),
        "start": _start_time(pid),
    }


def alive(record: dict[str, Any]) -> bool | None:
    """Whether the process ``record`` names still runs: None when that cannot be told
    from here (another machine, another boot or pid namespace, or an incomplete record)."""
    me = this_process()
    if not record.get("boot") or not record.get("start"):
        return None
    if any(record.get(k) != me[k] for k in ("host", "boot", "pidns")):
        return None
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return None
    fields = _stat(pid)
    if len(fields) <= 19 or fields[19] != str(record["start"]):
        return False  # gone, or its pid is another process's now
    return fields[0] not in _DEAD


def describe(record: dict[str, Any]) -> str:
    """``pid 123 on host`` (the wording SQLite's lock refusal uses)."""
    return f"pid {record.get('pid')} on {record.get('host')}"

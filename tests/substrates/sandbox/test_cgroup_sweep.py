"""Cgroups a SIGKILLed lodger left behind are removed by the next one (``sweep_stale``).

A lodger killed with SIGKILL never reaches the end of its commands, where it removes
their cgroups; on a host that runs many sessions (or the crash tests) they piled up by
the hundred. The sweep may only take what is truly abandoned: an empty cgroup made long
ago. A fresh one (a live lodger about to start its command) and one with a process in it
(a command still running) stay.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lodger.substrates.sandbox.cgroups import (
    _v1_parent,
    _v2_parent,
    _v2_usable,
    cgroup_support,
    sweep_stale,
)


@pytest.fixture
def parent() -> Path:
    # CI runs as root with cgroups (scripts/install.sh, README): a failure, not a skip.
    support = cgroup_support()
    assert support != "none", "no writable cgroup hierarchy: run as root (see README)"
    return _v2_parent() if _v2_usable() else _v1_parent("pids")


def _make(parent: Path, name: str, *, age_s: float) -> Path:
    path = parent / name
    path.mkdir()
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_only_empty_and_old_lodger_cgroups_are_removed(parent: Path) -> None:
    tag = os.urandom(4).hex()
    stale = _make(parent, f"lodger-stale{tag}", age_s=3600)
    fresh = _make(parent, f"lodger-fresh{tag}", age_s=0)
    busy = _make(parent, f"lodger-busy{tag}", age_s=3600)
    other = _make(parent, f"other-stale{tag}", age_s=3600)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (busy / "cgroup.procs").write_text(str(sleeper.pid))
        removed = sweep_stale(parent, older_than_s=600)
        assert stale in removed and not stale.exists()
        assert fresh.exists() and busy.exists() and other.exists()
        assert fresh not in removed and busy not in removed
        # Nothing was killed: the running command's process is alive.
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
        for path in (fresh, busy, other):
            for _ in range(50):  # the killed process leaves the cgroup as it is reaped
                with contextlib.suppress(FileNotFoundError):
                    try:
                        path.rmdir()
                    except OSError:
                        time.sleep(0.05)
                        continue
                break


def test_a_new_process_sweeps_before_its_first_cgroup(parent: Path) -> None:
    # The sweep runs once per process, at its first Cgroup.create: in a fresh interpreter.
    stale = _make(parent, f"lodger-left{os.urandom(4).hex()}", age_s=3600)
    script = (
        "from lodger.substrates.sandbox.cgroups import Cgroup\n"
        "g = Cgroup.create(memory_bytes=1 << 28, max_processes=32)\n"
        "print(sorted(str(d) for d in g.dirs.values()))\n"
        "g.remove()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    if stale.exists():
        stale.rmdir()
        pytest.fail(f"{stale} was left by the first Cgroup.create of a new process")

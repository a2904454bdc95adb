"""CPU limits for the whole process tree: a budget counted by the cgroup (the kernel's
RLIMIT_CPU is per process, so four processes could use four budgets) and a rate capped by
the cpu controller. Real sandboxes, real burning processes, real cgroups (v1 on the
project's machine; the controller-less parts of v2 on its hybrid cgroup2 mount)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from lodger.errors import ConfigError
from lodger.substrates.sandbox import Limits, Sandbox, policy_from_config
from lodger.substrates.sandbox._process import run_confined
from lodger.substrates.sandbox.bubblewrap import bubblewrap_argv
from lodger.substrates.sandbox.cgroups import cgroup2_mount

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}


def burners(token: str, n: int) -> list[str]:
    # n processes burning CPU in parallel; the shell waits for all of them.
    one = f"exec -a {token} python3 -c 'while True: pass'"
    return ["bash", "-c", " ".join([f"({one}) &"] * n) + " wait; echo FINISHED"]


def host_processes_named(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(token.encode()):
                found.append(int(entry.name))
    return found


@pytest.mark.slow
async def test_four_processes_in_parallel_share_one_cpu_budget(
    box: Sandbox, tmp_path: Path
) -> None:
    token = f"lodger-burn-{uuid.uuid4().hex[:8]}"
    result = await box.run(
        burners(token, 4),
        workspace=tmp_path,
        env=ENV,
        limits=Limits(wall_time_s=60, cpu_time_s=1.0),
    )
    assert result.limit == "cpu_time", result
    assert result.signal == "SIGKILL" and b"FINISHED" not in result.output
    assert "whole tree" in result.enforcement["cpu_time"], result.enforcement
    # Stopped at the budget for the tree: per process it would have been 4 CPU-seconds.
    assert result.cpu_s is not None and 1.0 <= result.cpu_s < 3.0, result.cpu_s
    assert host_processes_named(token) == []


@pytest.mark.slow
async def test_a_cpu_rate_holds_the_tree_back(box: Sandbox, tmp_path: Path) -> None:
    result = await box.run(
        burners(f"lodger-rate-{uuid.uuid4().hex[:8]}", 2),
        workspace=tmp_path,
        env=ENV,
        limits=Limits(wall_time_s=60, cpu_time_s=0.3, cpu_rate=0.2),
    )
    assert result.limit == "cpu_time", result
    assert result.enforcement["cpu_rate"].startswith("cgroup v"), result.enforcement
    assert result.cpu_throttled > 0
    # 0.3 CPU-seconds at 0.2 CPU take 1.5 s at least, however idle the machine is.
    assert result.duration_s >= 1.2, result.duration_s


@pytest.mark.slow
async def test_the_cgroup_v2_path_counts_and_kills_the_tree(tmp_path: Path) -> None:
    mount = cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup2 hierarchy is mounted on this host")
    token = f"lodger-v2-{uuid.uuid4().hex[:8]}"
    command = bubblewrap_argv("bwrap", burners(token, 4), workspace=tmp_path, cwd=tmp_path)
    result = await run_confined(
        command,
        backend="bubblewrap",
        env=ENV,
        cwd=tmp_path,
        stdin=b"",
        limits=Limits(wall_time_s=60, cpu_time_s=1.0, memory_bytes=None, max_processes=None),
        on_output=None,
        signal_exit_codes=True,
        cgroup_root=mount,
    )
    assert result.limit == "cpu_time", result
    assert result.enforcement["cpu_time"].startswith("cgroup v2, whole tree"), result
    assert result.cpu_s is not None and 1.0 <= result.cpu_s < 3.0, result.cpu_s
    assert host_processes_named(token) == []
    assert list(mount.glob("lodger-*")) == []  # the cgroup is gone with its processes


def test_cpu_rate_is_configured_and_checked() -> None:
    policy = policy_from_config({"cpu_rate": 1.5, "cpu_time_s": 30})
    assert policy.limits.cpu_rate == 1.5 and policy.limits.cpu_time_s == 30
    assert "rate 1.5 cpu" in policy.describe()
    with pytest.raises(ConfigError, match="cpu_rate must be positive"):
        Limits(cpu_rate=0)

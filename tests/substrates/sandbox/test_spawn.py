"""Starting a confined command: the ``/bin/sh`` trampoline joins every cgroup.procs file
and sets the rlimits before it ``exec``s the command line (same pid), passes every
argument verbatim, and refuses to run anything it could not confine; and a spawn no
longer copies this process (a ``vfork``, not a ``fork``): with a 2 GB heap the event loop
is not held while a command starts."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lodger.errors import UsageError
from lodger.substrates.sandbox._process import ENTER_FAILED, trampoline

SRC = Path(__file__).resolve().parents[3] / "src"


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, env=env)


# a command's environment is the policy's: even one that sets what a shell reads changes
# nothing in how the trampoline confines it
HOSTILE_ENV = {"PATH": "/usr/bin:/bin", "IFS": "0123456789", "ENV": "/no/such", "n": "9"}


@pytest.mark.parametrize("env", [None, HOSTILE_ENV], ids=["inherited", "hostile"])
def test_it_joins_every_procs_file_and_sets_the_limits(
    tmp_path: Path, env: dict[str, str] | None
) -> None:
    procs = [tmp_path / "a.procs", tmp_path / "b.procs"]
    for path in procs:
        path.write_text("")
    shown = "echo $$; ulimit -H -t; ulimit -S -t; ulimit -v; ulimit -c"
    argv = trampoline(["/bin/sh", "-c", shown], procs, cpu_s=2.5, memory_bytes=300 << 20)
    done = _run(argv, env)
    assert done.returncode == 0, done.stderr
    pid, cpu_hard, cpu_soft, memory_kib, core = done.stdout.split()
    assert [p.read_text().strip() for p in procs] == [pid, pid]  # the command's own pid
    assert (cpu_hard, cpu_soft) == ("4", "3")  # soft rounded up, hard one second more
    assert memory_kib == str(300 << 10)
    assert core == "0"


def test_without_limits_it_sets_only_the_core_limit(tmp_path: Path) -> None:
    done = _run(trampoline(["/bin/sh", "-c", "ulimit -t; ulimit -v; ulimit -c"], [],
                           cpu_s=None, memory_bytes=None))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["unlimited", "unlimited", "0"]


def _hard_cpu_limit_of_2s() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (1, 2))


def test_it_refuses_to_run_what_it_could_not_confine(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    touch = ["/usr/bin/touch", str(ran)]
    cannot_join = trampoline(
        touch, [tmp_path / "no" / "such" / "cgroup.procs"], cpu_s=None, memory_bytes=None
    )
    done = _run(cannot_join)
    assert done.returncode == ENTER_FAILED
    assert "lodger: cannot join the cgroup" in done.stderr
    # a CPU limit above the hard limit it inherited cannot be set
    above = subprocess.run(
        trampoline(touch, [], cpu_s=5, memory_bytes=None),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        preexec_fn=_hard_cpu_limit_of_2s,  # the test's own child: a fork is fine here
    )
    assert above.returncode == ENTER_FAILED
    assert "lodger: cannot set RLIMIT_CPU" in above.stderr
    assert not ran.exists()


def test_a_command_over_its_cpu_rlimit_is_stopped() -> None:
    """Where no cgroup counts CPU time, RLIMIT_CPU is the limit: SIGXCPU at the soft one."""
    spin = [sys.executable, "-c", "while True: pass"]
    done = subprocess.run(
        trampoline(spin, [], cpu_s=1, memory_bytes=None), capture_output=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode in (-signal.SIGXCPU, -signal.SIGKILL)


def test_a_command_over_its_address_space_rlimit_cannot_allocate() -> None:
    grab = [sys.executable, "-c", "b = bytearray(600 << 20)"]
    done = _run(trampoline(grab, [], cpu_s=None, memory_bytes=300 << 20))
    assert done.returncode != 0 and "MemoryError" in done.stderr


def test_an_empty_command_line_is_refused() -> None:
    with pytest.raises(UsageError, match="empty command line"):
        trampoline([], [], cpu_s=None, memory_bytes=None)


def test_arguments_reach_the_command_verbatim(tmp_path: Path) -> None:
    hostile = ["$(touch pwned)", "a b", "'\"", "`id`", "-", "--", "*", "$1", ""]
    argv = [sys.executable, "-c", "import sys; print(sys.argv[1:])", *hostile]
    done = subprocess.run(
        trampoline(argv, [], cpu_s=1, memory_bytes=None),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr(hostile)
    assert not (tmp_path / "pwned").exists()


_LAG = textwrap.dedent(
    """
    import asyncio, sys, tempfile, time
    from pathlib import Path
    from lodger.substrates.sandbox.host import HostSandbox
    from lodger.substrates.sandbox.policy import Limits

    heap = bytearray(2 * 1024**3)
    for i in range(0, len(heap), 4096):  # touched: its pages are mapped
        heap[i] = 1

    async def main():
        box, lags, done = HostSandbox(), [], asyncio.Event()

        async def tick():
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                lags.append(now - last - 0.001)
                last = now

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0.05)
        for _ in range(5):
            result = await box.run(
                ["/bin/true"], workspace=Path(tempfile.mkdtemp()),
                env={"PATH": "/usr/bin:/bin"}, limits=Limits(memory_bytes=1 << 30),
            )
            assert result.exit_code == 0, result
        done.set()
        await ticker
        print(max(lags) * 1e3)

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_starting_a_command_does_not_hold_the_loop_with_a_large_heap() -> None:
    """Before the trampoline (a ``preexec_fn``, so a ``fork``) this measured 87 ms here."""
    done = subprocess.run(
        [sys.executable, "-c", _LAG],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 40.0  # the loop's longest stall, in ms

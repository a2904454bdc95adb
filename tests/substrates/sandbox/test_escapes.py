"""Escape attempts, each a real command in a real sandbox, on every installed backend.

Every attempt must be refused or killed, and the host is checked afterwards: the file
outside is unchanged, no process is left, the host server saw no connection.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from lodger.substrates.sandbox import Limits, Sandbox, SandboxResult

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
LIMITS = Limits(
    wall_time_s=30, cpu_time_s=30, memory_bytes=256 << 20, max_processes=64, output_bytes=1 << 20
)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "outside.txt").write_text("host secret\n")
    return root


async def sh(box: Sandbox, ws: Path, command: str, **kw: object) -> SandboxResult:
    limits = kw.pop("limits", LIMITS)
    assert isinstance(limits, Limits)
    hidden = kw.pop("hidden", ())
    return await box.run(
        ["bash", "-c", command], workspace=ws, env=ENV, limits=limits, hidden=hidden
    )  # type: ignore[arg-type]


def text(result: SandboxResult) -> str:
    return result.output.decode(errors="replace")


async def test_the_workspace_is_writable_and_the_system_read_only(box: Sandbox, ws: Path) -> None:
    result = await sh(box, ws, "echo made > made.txt; pwd; echo x > /usr/lodger-x || echo RO")
    assert result.exit_code == 0, text(result)
    assert (ws / "made.txt").read_text() == "made\n"
    assert f"{ws}\n" in text(result) and "RO" in text(result)
    assert not Path("/usr/lodger-x").exists()  # noqa: ASYNC240 - a test reading the host after the fact


async def test_dotdot_and_symlinks_do_not_lead_out(box: Sandbox, ws: Path) -> None:
    outside = ws.parent / "outside.txt"
    (ws / "link").symlink_to(outside)
    (ws / "rootlink").symlink_to("/root")
    result = await sh(
        box,
        ws,
        "cat ../outside.txt; cat link; cat ./rootlink/.bashrc; cat ../../*/outside.txt;"
        f" cat {outside}; echo DONE",
    )
    assert "host secret" not in text(result)
    assert "DONE" in text(result)


async def test_writes_outside_the_workspace_do_not_reach_the_host(box: Sandbox, ws: Path) -> None:
    outside = ws.parent / "outside.txt"
    token = uuid.uuid4().hex
    result = await sh(
        box,
        ws,
        f"echo pwned > ../outside.txt; echo pwned > {outside}; echo pwned > ../new-{token};"
        f" echo pwned > /tmp/{token}; ln -s {outside} l; echo pwned > l; echo DONE",
    )
    assert "DONE" in text(result)
    assert outside.read_text() == "host secret\n"
    assert not (ws.parent / f"new-{token}").exists()
    assert not Path(f"/tmp/{token}").exists()  # noqa: ASYNC240 - a test reading the host after the fact


async def test_state_dir_home_and_root_are_not_visible(box: Sandbox, ws: Path) -> None:
    inside = ws / ".lodger"
    inside.mkdir()
    (inside / "log.sqlite").write_text("the log\n")
    elsewhere = ws.parent / "state"
    elsewhere.mkdir()
    (elsewhere / "key").write_text("state key\n")
    home = Path.home()
    result = await sh(
        box,
        ws,
        f"ls -a .lodger; cat .lodger/log.sqlite; echo x > .lodger/log.sqlite; cat {elsewhere}/key;"
        f" ls {home}; ls /root; cat /etc/shadow; echo DONE",
        hidden=(inside, elsewhere),
    )
    out = text(result)
    assert "DONE" in out
    lines = out.splitlines()
    assert "the log" not in lines and "state key" not in lines and "log.sqlite" not in lines
    assert (inside / "log.sqlite").read_text() == "the log\n"
    assert not any(line.startswith("root:") for line in out.splitlines())


async def test_host_environment_secrets_do_not_enter(
    box: Sandbox, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_API_KEY", "sk-should-not-leak")
    result = await sh(box, ws, "env; cat /proc/1/environ; cat /proc/self/environ")
    assert "should-not-leak" not in text(result)


async def test_host_loopback_and_dns_are_unreachable(box: Sandbox, ws: Path) -> None:
    seen: list[str] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append("connected")
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = (
        "import socket\n"
        f"for addr in [('127.0.0.1', {port}), ('10.0.2.2', {port})]:\n"
        "    try:\n"
        "        socket.create_connection(addr, timeout=3); print('CONNECTED', addr)\n"
        "    except OSError as e: print('refused', e)\n"
        "try:\n"
        "    print('RESOLVED', socket.getaddrinfo('example.com', 80))\n"
        "except OSError as e: print('no dns', e)\n"
    )
    async with server:
        result = await box.run(["python3", "-c", probe], workspace=ws, env=ENV, limits=LIMITS)
    assert result.exit_code == 0, text(result)
    assert "CONNECTED" not in text(result) and "RESOLVED" not in text(result)
    assert "no dns" in text(result)
    assert seen == []


async def test_a_fork_bomb_is_refused_at_the_process_limit(box: Sandbox, ws: Path) -> None:
    token = f"lodger-bomb-{uuid.uuid4().hex[:8]}"
    bomb = (
        f"# {token}\n"
        "import os, signal\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            signal.pause()\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('refused after', n, e.strerror)\n"
    )
    result = await box.run(
        ["python3", "-c", bomb], workspace=ws, env=ENV,
        limits=Limits(wall_time_s=60, max_processes=32),
    )  # fmt: skip
    words = text(result).split()
    assert words[:2] == ["refused", "after"], text(result)
    assert int(words[2]) < 40
    if box.name == "bubblewrap":
        assert result.limit == "processes"  # gVisor does not say why a fork failed
    assert _host_processes_named(token) == []  # every forked child died with the command


@pytest.mark.slow
async def test_a_memory_bomb_is_killed(box: Sandbox, ws: Path) -> None:
    # runsc: the gVisor sandbox (Sentry and gofer) stays in the command's cgroup
    # (--ignore-cgroups), so the kernel limits the memory the user-space kernel holds.
    result = await box.run(
        ["python3", "-c", "x = [b'y' * (16 << 20) for _ in range(64)]; print('ALLOCATED')"],
        workspace=ws,
        env=ENV,
        limits=Limits(wall_time_s=30, memory_bytes=64 << 20),
    )
    assert "ALLOCATED" not in text(result)
    assert result.limit == "memory", result
    # The same limit leaves room for an ordinary command.
    small = await box.run(
        ["python3", "-c", "x = b'y' * (8 << 20); print('fits', len(x))"],
        workspace=ws,
        env=ENV,
        limits=Limits(wall_time_s=30, memory_bytes=64 << 20),
    )
    assert text(small) == f"fits {8 << 20}\n", small


@pytest.mark.slow
async def test_an_infinite_loop_is_killed_at_its_cpu_limit(box: Sandbox, ws: Path) -> None:
    result = await box.run(
        ["python3", "-c", "while True: pass"],
        workspace=ws,
        env=ENV,
        limits=Limits(wall_time_s=60, cpu_time_s=1),
    )
    assert result.limit == "cpu_time", result


@pytest.mark.slow
async def test_a_command_past_its_wall_time_is_killed(box: Sandbox, ws: Path) -> None:
    result = await sh(box, ws, "echo started; exec sleep 600", limits=Limits(wall_time_s=1))
    assert result.limit == "wall_time"
    assert result.signal == "SIGKILL"
    assert text(result) == "started\n"


def _host_processes_named(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline and b"bash\x00-c" not in cmdline:
                found.append(int(entry.name))
    return found


async def test_nothing_started_in_the_background_outlives_the_command(
    box: Sandbox, ws: Path
) -> None:
    token = f"lodger-bg-{uuid.uuid4().hex[:8]}"
    result = await sh(
        box,
        ws,
        f"(exec -a {token}-plain sleep 600) & "
        f"setsid bash -c 'exec -a {token}-setsid sleep 600' & "
        f"( ( exec -a {token}-double sleep 600 ) & ) ; "
        f"nohup bash -c 'exec -a {token}-nohup sleep 600' >/dev/null 2>&1 & "
        "echo returned",
    )
    assert text(result).strip() == "returned"
    left = _host_processes_named(token)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []
    if box.name == "runsc":
        assert _host_processes_named(str(ws)) == []  # no gVisor sandbox left either


async def test_huge_output_is_cut_at_the_output_limit(box: Sandbox, ws: Path) -> None:
    result = await sh(box, ws, "yes lodger", limits=Limits(wall_time_s=30, output_bytes=1 << 20))
    assert result.limit == "output"
    assert len(result.output) == 1 << 20
    assert result.output_total > 1 << 20


async def test_proc_1_root_sys_writes_and_mounting_are_refused(box: Sandbox, ws: Path) -> None:
    outside = ws.parent / "outside.txt"
    token = uuid.uuid4().hex[:8]
    cgroup_dir = Path(f"/sys/fs/cgroup/memory/lodger-escape-{token}")
    result = await sh(
        box,
        ws,
        f"cat /proc/1/root{outside}; cat /proc/1/root/root/.bashrc;"
        f" mkdir {cgroup_dir}; echo 1 > /proc/sys/vm/drop_caches;"
        " mkdir m; mount -t tmpfs none m && echo MOUNTED; mount --bind / m && echo MOUNTED;"
        " echo DONE",
    )
    out = text(result)
    assert "DONE" in out
    assert "host secret" not in out and "MOUNTED" not in out
    assert not cgroup_dir.exists()  # noqa: ASYNC240 - a test reading the host after the fact


async def test_a_host_process_cannot_be_traced_or_signalled(box: Sandbox, ws: Path) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # noqa: ASYNC220 - a test reading the host after the fact
    try:
        probe = (
            "import ctypes, os, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            f"pid = {victim.pid}\n"
            "print('attach', libc.ptrace(16, pid, 0, 0), ctypes.get_errno())\n"
            "try:\n"
            "    os.kill(pid, 19); print('SIGNALLED')\n"
            "except OSError as e: print('kill refused', e)\n"
        )
        result = await box.run(["python3", "-c", probe], workspace=ws, env=ENV, limits=LIMITS)
        assert "attach -1" in text(result), text(result)
        assert "SIGNALLED" not in text(result)
        status = Path(f"/proc/{victim.pid}/status").read_text()  # noqa: ASYNC240 - a test reading the host after the fact
        assert "\nTracerPid:\t0\n" in status
        assert "\nState:\tS" in status
    finally:
        victim.kill()
        victim.wait()
    assert ctypes  # ctypes is used inside the sandbox; imported here to keep the probe honest

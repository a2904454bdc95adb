"""Audit of the sandboxes: attacks the other sandbox tests do not try.

Each test is a real attack on a real backend, egress proxy or policy parser; the defects
this audit fixed each have one here (named in the test's docstring), next to attacks that
held and that no other test covered.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import ipaddress
import math
import os
import platform
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostgit import host_git, make_repository, tree

from lodger.errors import ConfigError, ToolCallError, UsageError
from lodger.runtime.config import CONFIG_FILE, load_mcp_servers, load_sandbox_policy
from lodger.runtime.project import Project
from lodger.runtime.trust import TrustStore
from lodger.substrates.sandbox import (
    BubblewrapSandbox,
    Connection,
    EgressProxy,
    Limits,
    NetworkPolicy,
    RunscSandbox,
    Sandbox,
    SandboxPolicy,
    SandboxResult,
    policy_from_config,
)
from lodger.substrates.sandbox._process import run_confined
from lodger.substrates.sandbox._seccomp import KEYRING_SYSCALLS, REFUSED_SYSCALLS, refusal_filter
from lodger.substrates.sandbox.cgroups import cgroup2_mount
from lodger.substrates.sandbox.egress import MAX_CONNECTIONS, MAX_RECORDS
from lodger.substrates.sandbox.policy import TRUSTED_BY_HOST
from lodger.substrates.sandbox.tls import LEAF_CACHE, LodgerCA
from lodger.substrates.shell import _settled, python_tool, run_python, shell, shell_tool
from lodger.tools.spec import ToolContext, ToolOutput

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
SRC = Path(__file__).resolve().parents[3] / "src"


async def _upstream(seen: list[bytes]) -> asyncio.Server:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def _ask(proxy: EgressProxy, request: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_plain_http_credentials_go_to_the_requested_host_not_a_forged_host_header() -> None:
    """Broke: a plain-HTTP request for an allowed domain kept the sandbox's own ``Host``
    header, so the proxy added the domain's credentials to a request a shared front end
    (a CDN, a virtual-host server) routes to whatever host the sandbox named."""
    seen: list[bytes] = []
    server = await _upstream(seen)
    port = server.sockets[0].getsockname()[1]
    policy = NetworkPolicy(
        allow=("localhost",), credentials={"localhost": {"Authorization": "Bearer s3cret"}}
    )
    async with server, EgressProxy(policy) as proxy:
        answer = await _ask(
            proxy,
            f"GET http://localhost:{port}/x HTTP/1.1\r\nHost: evil.example\r\n"
            "host: evil2.example\r\nHost : evil3.example\r\n\r\n".encode(),
        )
    assert answer.endswith(b"ok"), answer
    assert len(seen) == 1
    lines = seen[0].decode().lower().split("\r\n")
    assert f"host: localhost:{port}" in lines, seen[0]
    assert not any("evil" in line for line in lines), seen[0]
    assert "authorization: bearer s3cret" in lines


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_flood_of_idle_proxy_connections_cannot_exhaust_lodgers_descriptors() -> None:
    """Broke: every connection the sandbox opened to the egress socket held a descriptor
    (and a task) in lodger's own process until the command ended; a few thousand idle
    ones took lodger to its RLIMIT_NOFILE, and its log and database with it. Past
    ``MAX_CONNECTIONS`` at once a connection is now refused at once, and recorded."""
    policy = NetworkPolicy(allow=("localhost",))
    flood = MAX_CONNECTIONS + 100
    async with EgressProxy(policy) as proxy:
        before = _open_fds()
        clients = [await asyncio.open_unix_connection(str(proxy.socket_path)) for _ in range(flood)]
        try:
            # The refused ones are answered and closed by the proxy: read each to its end.
            refused = 0
            for reader, _ in clients[MAX_CONNECTIONS:]:
                answer = await asyncio.wait_for(reader.read(), 10)
                refused += answer.startswith(b"HTTP/1.1 503")
            held = _open_fds() - before - flood  # the proxy's side, in this process
        finally:
            for _, writer in clients:
                writer.close()
        assert refused == 100
        assert held <= MAX_CONNECTIONS + 8, held
        busy = [c for c in proxy.connections if not c.allowed]
        assert len(busy) == 100 and "too many" in busy[0].reason
        # Once the idle ones are gone the proxy serves again.
        for _ in range(200):
            if len(proxy.connections) == 100 and _open_fds() <= before + 8:
                break
            await asyncio.sleep(0.01)
        again = await _ask(proxy, b"GET http://not-allowed.example/ HTTP/1.1\r\n\r\n")
        assert again.startswith(b"HTTP/1.1 403"), again


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("wall_time_s", math.nan),
        ("cpu_time_s", math.nan),
        ("cpu_rate", math.nan),
        ("memory_mb", math.nan),
        ("output_mb", math.nan),
        ("memory_mb", math.inf),
        ("max_processes", math.inf),
        ("cpu_time_s", math.inf),
        ("max_processes", 0.5),
        ("memory_mb", -math.inf),
    ],
)
def test_a_limit_that_is_not_a_finite_positive_number_is_a_config_error(
    key: str, value: float
) -> None:
    """Broke: ``cpu_time_s = nan`` in lodger.toml (TOML has nan and inf) was accepted and
    never ran out (NaN compares false), ``wall_time_s = nan`` likewise, and ``memory_mb =
    nan`` or ``max_processes = inf`` crashed with a bare ValueError/OverflowError."""
    with pytest.raises(ConfigError, match=key):
        policy_from_config({key: value})


def test_limits_built_in_code_refuse_nan_and_fractions_too() -> None:
    with pytest.raises(ConfigError, match="cpu_time_s"):
        Limits(cpu_time_s=math.nan)
    with pytest.raises(ConfigError, match="max_processes"):
        Limits(max_processes=2.5)  # type: ignore[arg-type]
    # A fractional size in MiB is still a whole number of bytes.
    assert policy_from_config({"memory_mb": 0.5}).limits.memory_bytes == 512 * 1024


@pytest.fixture
def private_etc_file() -> Iterator[Path]:
    """A file under /etc only its owner may read (as TLS keys, VPN and Wi-Fi configs are)
    and a directory only its owner may enter, each holding a token."""
    if not os.access("/etc", os.W_OK):
        pytest.skip("needs write access to /etc to plant a private file there")
    token = uuid.uuid4().hex[:8]
    secret = Path(f"/etc/lodger-audit-{token}.key")
    folder = Path(f"/etc/lodger-audit-{token}.d")
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, f"private-key-{token}\n".encode())
    os.close(fd)
    folder.mkdir(mode=0o700)
    (folder / "inner.conf").write_text(f"inner-secret-{token}\n")
    (folder / "inner.conf").chmod(0o644)  # readable, but its directory is not
    try:
        yield secret
    finally:
        secret.unlink()
        (folder / "inner.conf").unlink()
        folder.rmdir()


async def test_private_files_under_etc_are_covered(
    box: Sandbox, tmp_path: Path, private_etc_file: Path
) -> None:
    """Broke: only a fixed list (/etc/shadow, /etc/ssh...) was masked in the read-only
    /etc. Running as root (containers, CI) the sandbox's uid owns every root file, so a
    command read /etc/ssl/private keys, /etc/wireguard configs and the like. Now every
    entry under /etc that others may not read (or, a directory, enter) is covered."""
    folder = private_etc_file.with_suffix(".d")
    result = await box.run(
        ["bash", "-c", f"cat {private_etc_file}; cat {folder}/inner.conf; ls {folder}; echo DONE"],
        workspace=tmp_path,
        env=ENV,
        limits=Limits(wall_time_s=60),
    )
    lines = result.output.decode(errors="replace").splitlines()
    assert lines[-1:] == ["DONE"], lines
    assert not any(line.startswith(("private-key-", "inner-secret-")) for line in lines), lines
    assert "inner.conf" not in lines, lines  # what ls would list
    # The rest of /etc is still there: a command needs its passwd, hosts, certificates.
    check = await box.run(
        ["bash", "-c", "head -c 5 /etc/passwd; test -r /etc/ssl/certs/ca-certificates.crt"],
        workspace=tmp_path,
        env=ENV,
        limits=Limits(wall_time_s=60),
    )
    assert check.exit_code == 0 and check.output.startswith(b"root:"), check


_MACHINE_ABI = {"x86_64": "x86_64", "aarch64": "aarch64"}.get(platform.machine())
_KEYRING_PROBE = r"""
import ctypes, sys
add_key, request_key, keyctl = map(int, sys.argv[1:4])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
key = libc.syscall(request_key, b"user", sys.argv[4].encode(), None, 0)
print("request_key", key, ctypes.get_errno())
buf = ctypes.create_string_buffer(256)
n = libc.syscall(keyctl, 11, ctypes.c_long(key), buf, 256)  # KEYCTL_READ
print("read", buf.raw[: max(n, 0)].decode())
"""


@pytest.mark.skipif(_MACHINE_ABI is None, reason="system call numbers known for x86-64/arm64")
async def test_the_session_keyring_of_lodger_is_not_reachable(box: Sandbox, tmp_path: Path) -> None:
    """Broke (bubblewrap): namespaces do not separate kernel keyrings, and the command
    inherited lodger's session keyring: ``request_key`` + ``keyctl read`` printed a key
    lodger's session held. A seccomp filter now refuses the keyring calls (ENOSYS)."""
    assert _MACHINE_ABI is not None
    add_key, request_key, keyctl = KEYRING_SYSCALLS[_MACHINE_ABI]
    name = f"lodger-audit-{uuid.uuid4().hex[:8]}"
    secret = f"sk-keyring-{uuid.uuid4().hex}"

    def in_a_session_of_its_own() -> bytes:
        # Credentials are per thread: this thread joins a new anonymous session keyring
        # (the test process's stays as it was), adds the key and starts the sandbox.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        assert libc.syscall(keyctl, 1, None) > 0, ctypes.get_errno()  # JOIN_SESSION_KEYRING
        key = libc.syscall(add_key, b"user", name.encode(), secret.encode(), len(secret), -3)
        assert key > 0, ctypes.get_errno()
        probe = ["python3", "-c", _KEYRING_PROBE, str(add_key), str(request_key), str(keyctl)]

        async def run() -> bytes:
            result = await box.run(
                [*probe, name], workspace=tmp_path, env=ENV, limits=Limits(wall_time_s=60)
            )
            return result.output

        return asyncio.run(run())

    output = (await asyncio.to_thread(in_a_session_of_its_own)).decode(errors="replace")
    assert "request_key -1" in output, output
    assert secret not in output


_KERNEL_SURFACE = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
for name, nr, args in (("io_uring_setup", int(sys.argv[1]), (1, params)),
                       ("userfaultfd", int(sys.argv[2]), (0,))):
    ctypes.set_errno(0)
    print(name, libc.syscall(nr, *args), ctypes.get_errno())
"""


@pytest.mark.skipif(_MACHINE_ABI is None, reason="system call numbers known for x86-64/arm64")
async def test_io_uring_and_userfaultfd_are_not_reachable(tmp_path: Path) -> None:
    """Broke (bubblewrap): a command could open an io_uring and a userfaultfd, the two
    kernel interfaces exploits start from, though no command needs either. The seccomp
    filter now answers ENOSYS, as a kernel without them would."""
    assert _MACHINE_ABI is not None
    io_uring_setup, userfaultfd = 425, REFUSED_SYSCALLS[_MACHINE_ABI][3]
    probe = ["python3", "-c", _KERNEL_SURFACE, str(io_uring_setup), str(userfaultfd)]
    # This kernel has both, so the filter is what refuses them inside.
    done = await asyncio.to_thread(subprocess.run, probe, capture_output=True, text=True)
    host = done.stdout.split()
    assert int(host[1]) >= 0 and int(host[4]) >= 0, f"the host refuses them itself: {host}"
    result = await BubblewrapSandbox().run(
        probe, workspace=tmp_path, env=ENV, limits=Limits(wall_time_s=60)
    )
    words = result.output.decode().split()
    assert words == [
        "io_uring_setup",
        "-1",
        str(errno.ENOSYS),
        "userfaultfd",
        "-1",
        str(errno.ENOSYS),
    ]


def _verdict(program: bytes, arch: int, nr: int) -> int:
    """What the classic BPF ``program`` returns for one system call (the few opcodes
    the keyring filter uses; any other is a failure of the test)."""
    insns = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    data = struct.pack("=iI", nr, arch)
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x54:  # and #k
            acc &= k
        elif code == 0x15:  # jeq #k
            pc += jt if acc == k else jf
        elif code == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
        pc += 1


@pytest.mark.parametrize(
    ("arch", "refused", "allowed"),
    [
        (
            0xC000003E,
            (248, 249, 250, 0x40000000 | 250, 323, 425, 426, 427, 0x40000000 | 425),
            (0, 59, 247, 251, 0x40000000 | 59, 322, 324, 424, 428),
        ),
        (0x40000003, (286, 287, 288, 374, 425, 426, 427), (248, 249, 250, 11, 323, 373, 428)),
        (0xC00000B7, (217, 218, 219, 282, 425, 426, 427), (221, 248, 250, 281, 283, 424)),
        (0x40000028, (309, 310, 311, 388, 425, 426, 427), (11, 250, 387, 389)),
        (0x12345678, (), (248, 250, 288, 323, 425)),
    ],
    ids=["x86_64+x32", "i386", "aarch64", "arm", "unknown"],
)
def test_the_filter_refuses_exactly_its_calls_in_every_abi(
    arch: int, refused: tuple[int, ...], allowed: tuple[int, ...]
) -> None:
    """The filter itself, for the ABIs a test on one machine cannot all reach (i386 via
    ``int 0x80`` and x32 on x86-64, arm on arm64)."""
    program = refusal_filter()
    for nr in refused:
        assert _verdict(program, arch, nr) == 0x00050000 | errno.ENOSYS, nr
    for nr in allowed:
        assert _verdict(program, arch, nr) == 0x7FFF0000, nr


_HOLDER = r"""
import asyncio, sys
from pathlib import Path
from lodger.substrates.sandbox import BubblewrapSandbox, Limits, RunscSandbox
box = {"bubblewrap": BubblewrapSandbox, "runsc": RunscSandbox}[sys.argv[1]]()
ws = Path(sys.argv[2])
asyncio.run(box.run(["bash", "-c", "echo up > started; exec sleep 600"], workspace=ws,
                    env={"PATH": "/usr/bin:/bin"}, limits=Limits(wall_time_s=600)))
"""


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if text.encode() in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


@pytest.mark.slow
async def test_a_sandbox_dies_with_a_sigkilled_lodger(box: Sandbox, tmp_path: Path) -> None:
    """Broke (runsc): ``runsc run`` had no parent-death signal, so when lodger was
    SIGKILLed mid-command the gVisor sandbox (runsc, its Sentry and gofer) and the
    command in it ran on, past every time limit, outside anyone's reach. It now starts
    behind ``setpriv --pdeathsig KILL``. bubblewrap held (``--die-with-parent``)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    scratch = tmp_path / "tmp"  # the runsc bundle lands here: its processes name it
    scratch.mkdir()
    holder = subprocess.Popen(  # noqa: ASYNC220 - a lodger process to SIGKILL
        [sys.executable, "-c", _HOLDER, box.name, str(ws)],
        env={**os.environ, "PYTHONPATH": str(SRC), "TMPDIR": str(scratch)},
    )
    try:
        for _ in range(600):
            if (ws / "started").exists() or holder.poll() is not None:
                break
            await asyncio.sleep(0.05)
        assert (ws / "started").exists(), "the command never started"
        mark = str(scratch) if box.name == "runsc" else str(ws)
        assert _processes_mentioning(mark), "no sandbox process found to watch"
    finally:
        holder.kill()
        holder.wait()
    left = _processes_mentioning(mark)
    for _ in range(200):
        if not left:
            break
        await asyncio.sleep(0.05)
        left = _processes_mentioning(mark)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert left == []


@pytest.mark.parametrize("workspace", ["/", "/etc", "/etc/ssl", "/usr", "/bin", "/proc/self"])
async def test_a_workspace_that_would_expose_the_system_is_refused(
    box: Sandbox, workspace: str
) -> None:
    """Broke: the workspace is bound read-write after the read-only system directories
    and their masks, so a workspace of ``/`` (lodger started from ``/``, as in many
    containers) or ``/etc`` gave the command the host's /etc/shadow and a writable /etc.
    The sandbox now refuses to start."""
    probe = Path(f"/etc/lodger-audit-{uuid.uuid4().hex[:8]}")
    try:
        with pytest.raises(ConfigError, match="workspace"):
            await box.run(
                ["bash", "-c", f"touch {probe}; cat /etc/shadow"],
                workspace=Path(workspace),
                env=ENV,
                limits=Limits(wall_time_s=60),
            )
        assert not os.path.lexists(probe)  # noqa: ASYNC240 - a test reading the host after the fact
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(probe)


async def test_a_port_out_of_range_is_refused_and_recorded_not_wrapped_around() -> None:
    """Broke: ``CONNECT localhost:<port + 65536>`` reached ``port`` (the resolver wraps
    the number) while the record said the other number; ``localhost:abc`` and
    ``http://localhost:99999/`` closed the connection with nothing recorded."""
    seen: list[bytes] = []
    server = await _upstream(seen)
    port = server.sockets[0].getsockname()[1]
    policy = NetworkPolicy(allow=("localhost",))
    requests = [
        f"CONNECT localhost:{port + 65536} HTTP/1.1\r\n\r\n",
        "CONNECT localhost:abc HTTP/1.1\r\n\r\n",
        "CONNECT localhost:0 HTTP/1.1\r\n\r\n",
        f"GET http://localhost:{port + 65536}/ HTTP/1.1\r\n\r\n",
        "GET http://localhost:0/ HTTP/1.1\r\n\r\n",
        "GET http://localhost:8x/ HTTP/1.1\r\n\r\n",
    ]
    async with server, EgressProxy(policy) as proxy:
        answers = [await _ask(proxy, request.encode()) for request in requests]
    assert all(answer.startswith(b"HTTP/1.1 400") for answer in answers), answers
    assert seen == []
    assert [(c.allowed, c.reason) for c in proxy.connections] == [(False, "bad port")] * 6


def test_the_network_summary_of_a_shell_result_is_bounded() -> None:
    """Broke: the command's output is cut to SHELL_MAX_OUTPUT_CHARS, but every connection
    the egress proxy saw was appended to the tool result after it: a command making
    thousands of refused requests (each answered at once) put megabytes into the log and
    the model's context. The summary now names the first few and counts the rest."""
    many = tuple(
        Connection(host=f"h{i}.example", port=80, method="GET", allowed=False, reason="no")
        for i in range(5000)
    )
    allowed = Connection(host="pypi.org", port=443, method="CONNECT", allowed=True)
    result = SandboxResult(backend="bubblewrap", exit_code=0, connections=(allowed, *many))
    text = _settled(result, 60)
    assert isinstance(text, str)
    assert len(text) < 2000, len(text)
    assert "allowed CONNECT pypi.org:443" in text and "refused GET h0.example:80" in text
    assert "5001 connections: 1 allowed, 5000 refused" in text


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("shell", {"command": "echo a\x00b"}),
        ("shell", {"command": "echo \ud800"}),
        ("run_python", {"code": "print('\ud800')"}),
    ],
    ids=["shell-nul", "shell-surrogate", "python-surrogate"],
)
async def test_a_command_no_process_can_be_given_is_the_models_error(
    tmp_path: Path, tool: str, arguments: dict[str, str]
) -> None:
    """Broke: a NUL byte or a lone surrogate (valid JSON, ``\\u0000``, ``\\ud800``) in
    a shell command or Python snippet raised a bare ValueError/UnicodeEncodeError from
    the spawn instead of telling the model what to fix."""
    ctx = ToolContext(
        session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o",
        workspace=tmp_path, hidden=(),
    )  # fmt: skip
    handler = (shell if tool == "shell" else run_python).handler
    with pytest.raises(ToolCallError, match=r"NUL|surrogate") as raised:
        await handler(dict(arguments), ctx)
    assert raised.value.code == "tool_call"


@pytest.mark.parametrize(
    "smuggled",
    ["X-A: 1\nHost: evil.example", "X-A: 1\rHost: evil.example", "X-A: 1\x00Host: evil.example"],
    ids=["bare-lf", "bare-cr", "nul"],
)
async def test_a_header_line_with_a_bare_line_break_is_refused(smuggled: str) -> None:
    """Broke: the proxy splits a request head on CRLF only, so ``X-A: 1\\nHost: evil``
    passed as one header (not a Host header) with the credentials added, and a server
    that ends lines at a bare LF (many do) read the forged Host after all. A head with
    a bare CR, LF or a NUL is now refused (400) before anything is sent."""
    seen: list[bytes] = []
    server = await _upstream(seen)
    port = server.sockets[0].getsockname()[1]
    policy = NetworkPolicy(
        allow=("localhost",), credentials={"localhost": {"Authorization": "Bearer s3cret"}}
    )
    async with server, EgressProxy(policy) as proxy:
        answer = await _ask(
            proxy, f"GET http://localhost:{port}/ HTTP/1.1\r\n{smuggled}\r\n\r\n".encode()
        )
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert seen == []
    assert [(c.allowed, c.reason) for c in proxy.connections] == [(False, "malformed request head")]


async def test_a_bare_line_break_is_refused_inside_terminated_tls_too() -> None:
    policy = NetworkPolicy(
        allow=("localhost",),
        terminate_tls=("localhost",),
        credentials={"localhost": {"Authorization": "Bearer s3cret"}},
    )
    async with EgressProxy(policy) as proxy:
        assert proxy.ca is not None
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        try:
            writer.write(b"CONNECT localhost:443 HTTP/1.1\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            trust = ssl.create_default_context(cadata=proxy.ca.certificate_pem.decode())
            await writer.start_tls(trust, server_hostname="localhost")
            writer.write(b"GET / HTTP/1.1\r\nX-A: 1\nHost: evil.example\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert [(c.allowed, c.reason) for c in proxy.connections] == [(False, "malformed request head")]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATABASE_URL", "postgresql://app:hunter2@db.internal/app"),
        ("PIP_INDEX_URL", "https://__token__:pypi-AgEIcHlwaS5vcmc@pypi.example/simple"),
        ("BROKER", "amqp://guest:guest@localhost:5672//"),
    ],
)
def test_a_passed_variable_whose_value_holds_a_password_is_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """Broke: only the names of passed variables were checked (``*_KEY``, ``*_TOKEN``...),
    so ``env = ["DATABASE_URL"]`` put a database password into every command. A value
    that is a URL with a password in it is now refused, naming the variable only."""
    monkeypatch.setenv(name, value)
    policy = SandboxPolicy(env=(name,))
    with pytest.raises(ConfigError, match=name) as raised:
        policy.host_environment()
    assert value.split("@")[0].split(":")[-1] not in str(raised.value)
    # A URL without a password, and a user name alone, still pass.
    monkeypatch.setenv(name, "https://pypi.org/simple https://user@mirror.example/x")
    assert policy.host_environment() == {name: os.environ[name]}


# Attacks that held, not covered elsewhere: kept so that a regression shows.

_NEIGHBOURS = r"""
import os, socket, subprocess, sys
def attempt(name, call):
    try:
        call()
        print(name, "DONE")
    except OSError as e:
        print(name, "refused", e.errno)
attempt("abstract", lambda: socket.socket(socket.AF_UNIX).connect("\0" + sys.argv[1]))
attempt("ipv6", lambda: socket.create_connection(("::1", int(sys.argv[2])), timeout=3))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
print("interfaces", [name for _, name in socket.if_nameindex()])
print("fds", sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
su = subprocess.run(["su", "-c", "id -u"], capture_output=True, text=True,
                    stdin=subprocess.DEVNULL, timeout=10)
print("su", su.returncode, su.stdout.strip() or "-")
attempt("hardlink-setuid", lambda: os.link("/usr/bin/su", "su-copy"))
"""


async def test_host_sockets_descriptors_and_setuid_stay_out_of_reach(
    box: Sandbox, tmp_path: Path
) -> None:
    """An abstract Unix socket and an IPv6 loopback server of the host (where a database
    or an MCP server may listen), raw and packet sockets, a descriptor lodger left
    inheritable (its log, say), a setuid binary and a hard link to one: all refused."""
    name = f"lodger-audit-{uuid.uuid4().hex[:8]}"
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0" + name)
    abstract.listen()
    six = socket.socket(socket.AF_INET6)
    six.bind(("::1", 0))
    six.listen()
    log = tmp_path / "log.sqlite"
    log.write_bytes(b"SQLite format 3\0")
    leaked = os.open(log, os.O_RDONLY)
    os.set_inheritable(leaked, True)
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        result = await box.run(
            ["python3", "-c", _NEIGHBOURS, name, str(six.getsockname()[1])],
            workspace=ws,
            env=ENV,
            limits=Limits(wall_time_s=60),
        )
    finally:
        os.close(leaked)
        abstract.close()
        six.close()
    lines = result.output.decode(errors="replace").splitlines()
    assert result.exit_code == 0, lines
    for attack in ("abstract", "ipv6", "raw", "packet", "hardlink-setuid"):
        assert any(line.startswith(f"{attack} refused") for line in lines), (attack, lines)
    assert "interfaces ['lo']" in lines
    fds = next(line for line in lines if line.startswith("fds "))
    assert fds in ("fds [0, 1, 2]", "fds [0, 1, 2, 3]"), fds  # 3: listdir's own
    su = next(line for line in lines if line.startswith("su "))
    assert su.split()[1] != "0", su
    assert not (ws / "su-copy").exists()


async def test_filling_tmp_and_dev_shm_counts_against_the_memory_limit(
    box: Sandbox, tmp_path: Path
) -> None:
    """/tmp and /dev/shm inside are memory (tmpfs) with no size of their own: what a
    command writes there must count against its memory limit, not the host's RAM."""
    limits = Limits(wall_time_s=60, memory_bytes=64 << 20)
    for target in ("/tmp/fill", "/dev/shm/fill"):
        result = await box.run(
            ["bash", "-c", f"head -c 400M /dev/zero > {target}; echo WROTE $?"],
            workspace=tmp_path,
            env=ENV,
            limits=limits,
        )
        if result.enforcement.get("memory", "").startswith("RLIMIT"):
            pytest.skip("no memory cgroup here: tmpfs pages are not limited")
        assert "WROTE 0" not in result.output.decode(), (target, result)


async def test_filling_the_workspace_is_stopped_by_a_limit(tmp_path: Path) -> None:
    """Broke: there was no disk quota on the workspace, so a command could fill the host's
    disk there. ``Limits.disk_bytes`` (``[sandbox] disk_mb``) now bounds what one command
    writes (``lodger.substrates.sandbox._disk``; more cases in test_disk_limit.py)."""
    limit = 32 << 20
    result = await BubblewrapSandbox().run(
        ["bash", "-c", "head -c 96M /dev/zero > big; echo WROTE $?"],
        workspace=tmp_path,
        env=ENV,
        limits=Limits(
            wall_time_s=60, memory_bytes=32 << 20, output_bytes=1 << 20, disk_bytes=limit
        ),
    )
    size = (tmp_path / "big").stat().st_size if (tmp_path / "big").exists() else 0
    (tmp_path / "big").unlink(missing_ok=True)
    assert result.limit == "disk" and size < limit * 1.1, (result, size)


def test_the_lodger_ca_keeps_a_bounded_number_of_leaf_certificates() -> None:
    """Broke: with ``terminate_tls = ["*.example.com"]`` every distinct name a command
    CONNECTed to (``a1.example.com``, ``a2.example.com``...) got a leaf and a TLS context
    kept for the life of the proxy, about 25 KB and 1.5 ms each, in lodger's own process:
    a minute of a loop took hundreds of MB. The contexts are now an LRU of
    ``LEAF_CACHE``; a name pushed out is issued again when asked for."""
    ca = LodgerCA(("*.example.com",))
    first = ca.server_context("h0.example.com")
    assert ca.server_context("h0.example.com") is first  # cached while recent
    for i in range(1, LEAF_CACHE + 50):
        ca.server_context(f"h{i}.example.com")
    assert len(ca._contexts) <= LEAF_CACHE
    again = ca.server_context("h0.example.com")
    assert again is not first and isinstance(again, ssl.SSLContext)


async def test_a_command_cannot_leave_code_for_the_hosts_git_to_run(
    box: Sandbox, tmp_path: Path
) -> None:
    """Broke: the workspace's .git was writable in the sandbox, so a command could leave
    a hook, a ``core.fsmonitor`` (run by every ``git status``) or a ``core.pager``, which
    the host's git runs later, outside any sandbox. .git is now bound read-only onto
    itself (``lodger.substrates.sandbox._git``): nothing under it can be written, and it
    can be neither renamed nor removed to make room for another repository."""
    ws = make_repository(tmp_path / "ws")
    marker = tmp_path / "ran-on-the-host"
    plant = f"touch {marker}"
    hook = f"printf '#!/bin/sh\\n{plant}\\n' > .git/hooks/{{}} && chmod +x .git/hooks/{{}}"
    attempts = [
        f"git config core.fsmonitor '{plant}; false'",
        f"git config core.pager '{plant}; cat'",
        f"git config alias.st '!{plant}'",
        "git config core.hooksPath planted-hooks",
        hook.format("pre-commit", "pre-commit"),
        hook.format("post-checkout", "post-checkout"),
        f"printf '[core]\\n\\tfsmonitor = {plant}\\n' >> .git/config",
        "echo x > .git/info/attributes",
        "mkdir .git/hooks/x",
        "rm -f .git/HEAD .git/config",
        "rm -rf .git/objects",
        "chmod 777 .git/config",
        "touch -d 2000-01-01 .git/config",
        "git commit -qam planted",
        "git add a.txt",
        "git update-ref refs/heads/planted HEAD",
        f"mv .git old && git init -q . && git config core.fsmonitor '{plant}; false'",
        f"rm -rf .git; git init -q . && git config core.fsmonitor '{plant}; false'",
        "python3 -c \"import os; os.rename('.git', 'old')\"",
        "ln -sfn /tmp .git",
    ]
    before = tree(ws / ".git")
    for attempt in attempts:
        result = await box.run(
            ["bash", "-c", attempt], workspace=ws, env=ENV, limits=Limits(wall_time_s=60)
        )
        assert result.exit_code != 0, (attempt, result.output)
        assert tree(ws / ".git") == before, attempt
    assert sorted(p.name for p in ws.iterdir()) == [".git", "a.txt"]
    # Later, on the host, someone looks at the project and commits.
    assert host_git("config", "--get", "core.pager", cwd=ws).stdout == ""
    assert host_git("status", "--short", cwd=ws).stdout == " M a.txt\n"
    host_git("commit", "-qam", "by hand", cwd=ws, check=True)
    assert not marker.exists()


async def test_a_nested_state_directory_cannot_be_moved_out_from_under_its_cover(
    box: Sandbox, tmp_path: Path
) -> None:
    """Broke: with the state directory nested in the workspace (``state_dir =
    "sub/.lodger"``) only the directory itself was covered, so a command renamed its
    parent (``mv sub sub2; mkdir -p sub/.lodger``): the next command's cover fell on the
    decoy, and it read and wrote the real log at ``sub2/.lodger``. Every directory
    between the workspace and a hidden path is now a mount point too, which no rename
    can move."""
    ws = tmp_path / "ws"
    state = ws / "sub" / "deeper" / ".lodger"
    state.mkdir(parents=True)
    (state / "log.sqlite").write_text("the log\n")

    async def run(command: str) -> str:
        result = await box.run(
            ["bash", "-c", command],
            workspace=ws,
            env=ENV,
            limits=Limits(wall_time_s=60),
            hidden=(state,),
        )
        return result.output.decode(errors="replace")

    first = await run(
        "mv sub sub2; mv sub/deeper sub/deeper2; mkdir -p sub/deeper/.lodger; echo DONE"
    )
    second = await run(
        "cat sub2/deeper/.lodger/log.sqlite sub/deeper2/.lodger/log.sqlite;"
        " echo x >> sub2/deeper/.lodger/log.sqlite; echo x >> sub/deeper2/.lodger/log.sqlite;"
        " echo DONE"
    )
    assert "DONE" in first and "DONE" in second, (first, second)
    assert "the log" not in first + second
    assert (state / "log.sqlite").read_text() == "the log\n"
    assert not (ws / "sub2").exists() and not (ws / "sub" / "deeper2").exists()


def test_a_literal_secret_in_lodger_toml_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broke: lodger.toml lies in the workspace, which every sandboxed command reads, yet
    ``Authorization = "Bearer sk-..."`` written there literally was accepted: the secret
    the proxy adds "so it never enters the sandbox" was one ``cat lodger.toml`` away. A
    credential-named header must now take its value from the environment (``${NAME}``)
    or the secrets file; a plain header (``X-Team = "blue"``) still may be literal."""
    (tmp_path / "lodger.toml").write_text(
        '[sandbox.network]\nallow = ["api.example.com"]\n'
        '[sandbox.network.credentials."api.example.com"]\n'
        'Authorization = "Bearer sk-literal-1234"\n'
    )
    with pytest.raises(ConfigError, match="Authorization") as raised:
        load_sandbox_policy(tmp_path)
    assert "sk-literal" not in str(raised.value) and "${" in (raised.value.hint or "")
    monkeypatch.setenv("EXAMPLE_TOKEN", "sk-from-env")
    (tmp_path / "lodger.toml").write_text(
        '[sandbox.network]\nallow = ["api.example.com"]\n'
        '[sandbox.network.credentials."api.example.com"]\n'
        'Authorization = "Bearer ${EXAMPLE_TOKEN}"\nX-Team = "blue"\n'
    )
    policy = load_sandbox_policy(tmp_path)
    assert policy is not None
    assert policy.network.headers_for("api.example.com") == {
        "Authorization": "Bearer sk-from-env",
        "X-Team": "blue",
    }


async def test_the_record_of_connections_is_bounded() -> None:
    """Broke: every connection was recorded, in lodger's memory, for as long as the
    command ran (up to an hour): a loop of refused requests, answered at once, grew it
    by about a thousand records a second. Past ``MAX_RECORDS`` the proxy only counts,
    and the last record says how many more there were."""
    policy = NetworkPolicy(allow=("localhost",))
    async with EgressProxy(policy) as proxy:
        for _ in range(MAX_RECORDS + 30):
            answer = await _ask(proxy, b"GET http://blocked.example/ HTTP/1.1\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 403")
    assert len(proxy.connections) == MAX_RECORDS
    last = proxy.connections[-1]
    assert last.reason == "31 more connections (0 allowed) not recorded", last
    result = SandboxResult(backend="bubblewrap", exit_code=0, connections=(*proxy.connections,))
    summary = _settled(result, 60)
    assert isinstance(summary, str) and "and 31 more connections (0 allowed)" in summary


async def test_terminal_control_sequences_in_output_are_written_out(tmp_path: Path) -> None:
    """Broke: a command's output reached the tool result byte for byte, and the CLI shows
    its first line on the operator's terminal (rich strips BEL and CR, not ESC): a
    sandboxed command could clear the screen, retitle the window or, with OSC 52, write
    the operator's clipboard. Control characters other than tab, newline and CR are now
    written out as escapes (``\\x1b``) in the result."""
    ctx = ToolContext(
        session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o",
        workspace=tmp_path, hidden=(),
    )  # fmt: skip
    out = await shell.handler(
        {"command": r"printf 'a\033]52;c;cHduZWQ=\033\\b\033[2J\tc\302\233x\r\nnext\n'"}, ctx
    )
    assert isinstance(out, str)
    assert not any(ch in out for ch in "\x1b\x9b\x07"), repr(out)
    assert out.startswith("a\\x1b]52;c;cHduZWQ=\\x1b\\b\\x1b[2J\tc\\x9bx\r\nnext\n"), repr(out)
    # The hosts a command asks the egress proxy for are its words too.
    asked = Connection(host="\x1b]0;pwned\x1b\\", port=443, method="CONNECT", allowed=False)
    text = _settled(SandboxResult(backend="bubblewrap", exit_code=0, connections=(asked,)), 60)
    assert isinstance(text, str) and "\x1b" not in text and "\\x1b]0;pwned" in text


@pytest.fixture
def private_cgroup_parent() -> Iterator[Path]:
    """A cgroup2 directory of this test's own, to make commands' cgroups in and count
    what is left (named apart from ``lodger-*``, which the CPU tests count globally)."""
    mount = cgroup2_mount()
    if mount is None or not os.access(mount, os.W_OK):
        pytest.skip("no writable cgroup2 hierarchy to make a private parent in")
    parent = mount / f"audit-sandbox-{uuid.uuid4().hex[:8]}"
    parent.mkdir()
    try:
        yield parent
    finally:
        for child in parent.iterdir():
            if child.is_dir():
                with contextlib.suppress(OSError):
                    child.rmdir()
        parent.rmdir()


async def test_an_empty_command_line_makes_no_cgroup(private_cgroup_parent: Path) -> None:
    """Broke: ``run_confined([])`` made the command's cgroup, then the trampoline refused
    the empty command line before the cleanup was in place: a directory left per call."""
    with pytest.raises(UsageError, match="empty command line"):
        await run_confined(
            [],
            backend="none",
            env=ENV,
            cwd=private_cgroup_parent,
            stdin=b"",
            limits=Limits(wall_time_s=30, cpu_time_s=10),
            on_output=None,
            signal_exit_codes=False,
            cgroup_root=private_cgroup_parent,
        )
    assert [p for p in private_cgroup_parent.iterdir() if p.is_dir()] == []  # noqa: ASYNC240 - a test reading the host after the fact


async def test_a_run_cancelled_while_its_cgroup_is_made_leaves_no_cgroup(
    private_cgroup_parent: Path,
) -> None:
    """Broke: the cgroup is made in a worker thread; a run cancelled meanwhile (a tool's
    time limit, a stopped turn) lost the thread's result, and the directories stayed in
    the host's hierarchy for good (7 of 30 quick cancellations here). The run now waits
    for the thread, removes what it made, then lets the cancellation go on."""
    for i in range(30):
        run = asyncio.create_task(
            run_confined(
                ["/bin/sleep", "5"],
                backend="none",
                env=ENV,
                cwd=private_cgroup_parent,
                stdin=b"",
                limits=Limits(wall_time_s=30, cpu_time_s=10),
                on_output=None,
                signal_exit_codes=False,
                cgroup_root=private_cgroup_parent,
            )
        )
        for _ in range(i % 5):  # cancel at different points of the start
            await asyncio.sleep(0)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    assert [p.name for p in private_cgroup_parent.iterdir() if p.is_dir()] == []  # noqa: ASYNC240 - a test reading the host after the fact


async def test_a_runsc_run_cancelled_while_its_bundle_is_written_leaves_no_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broke (runsc): the OCI bundle is written in a worker thread; a run cancelled
    meanwhile lost the thread's result and its directory (a copy of the policy, the
    command line) stayed in the temporary folder for good. The run now waits for the
    thread, removes the bundle, then lets the cancellation go on."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    for i in range(30):
        run = asyncio.create_task(
            RunscSandbox().run(
                ["/bin/true"], workspace=workspace, env=ENV, limits=Limits(wall_time_s=30)
            )
        )
        # Cancel at different points of the start: the bundle takes milliseconds to write.
        await asyncio.sleep(i * 0.0005)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    assert sorted(p.name for p in scratch.iterdir()) == []


def test_a_wildcard_allows_no_address_spelled_as_a_name_and_no_localhost() -> None:
    """Broke: an allow-list names domains and "a literal IP or 'localhost' never matches
    a pattern", but only dotted decimal was recognised: ``0x7f000001`` and ``0x7f.1``
    (the resolver reads both as 127.0.0.1) matched ``*``, and so did ``localhost``."""
    anything = NetworkPolicy(allow=("*",))
    for host in ("0x7f000001", "0x7f.1", "0x7f.0.0.1", "0xa9fea9fe", "localhost", "db.localhost"):
        assert not anything.allows(host), host
    assert anything.allows("pypi.org") and anything.allows("0x1.example.com")
    assert NetworkPolicy(allow=("localhost",)).allows("localhost")  # named outright: yes
    assert not NetworkPolicy(allow=("*.localhost",)).allows("db.localhost")


async def test_the_proxy_does_not_reach_the_hosts_loopback_through_a_hex_address() -> None:
    seen: list[bytes] = []
    server = await _upstream(seen)
    port = server.sockets[0].getsockname()[1]
    async with server, EgressProxy(NetworkPolicy(allow=("*",))) as proxy:
        answer = await _ask(proxy, f"GET http://0x7f000001:{port}/ HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403"), answer
    assert seen == []


def _loopback_hostname() -> str:
    name = socket.gethostname().lower()
    try:
        address = ipaddress.ip_address(socket.gethostbyname(name))
    except (OSError, ValueError):
        pytest.skip("this machine's hostname does not resolve (README: may skip)")
    if not address.is_loopback or not NetworkPolicy(allow=("*",)).allows(name):
        pytest.skip("this machine's hostname is not a loopback name (README: may skip)")
    return name


async def test_a_name_resolving_to_the_hosts_loopback_is_not_reached() -> None:
    """Broke: the allow-list was checked on names, not on the addresses they resolve to:
    a name a wildcard allows that resolves to loopback or a private address (this
    machine's own hostname, a DNS-rebinding name, a cloud metadata alias) took the proxy,
    which runs on the host, to the host's own services. A wildcard now leads to public
    addresses only, and the proxy connects to the address it checked."""
    name = _loopback_hostname()
    seen: list[bytes] = []
    server = await _upstream(seen)
    port = server.sockets[0].getsockname()[1]
    async with server, EgressProxy(NetworkPolicy(allow=("*",))) as proxy:
        answer = await _ask(proxy, f"GET http://{name}:{port}/ HTTP/1.1\r\n\r\n".encode())
        tunnel = await _ask(proxy, f"CONNECT {name}:{port} HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403") and tunnel.startswith(b"HTTP/1.1 403")
    assert seen == []
    reasons = [c.reason for c in proxy.connections]
    assert all("not a public address" in (r or "") for r in reasons), reasons


async def test_a_name_spelled_out_in_the_allow_list_may_lead_inside() -> None:
    name = _loopback_hostname()
    seen: list[bytes] = []
    server = await _upstream(seen)
    port = server.sockets[0].getsockname()[1]
    async with server, EgressProxy(NetworkPolicy(allow=(name.upper(),))) as proxy:
        answer = await _ask(proxy, f"GET http://{name}:{port}/ok HTTP/1.1\r\n\r\n".encode())
    assert not answer.startswith(b"HTTP/1.1 403"), answer
    assert seen and seen[0].startswith(b"GET /ok ")


async def test_the_proxy_tries_each_checked_address_in_turn() -> None:
    """Connecting only to the first address checked would break a name whose first
    address does not answer (IPv6 first, from a host without IPv6): the next is tried."""
    from lodger.substrates.sandbox.egress import _connect

    seen: list[bytes] = []
    server = await _upstream(seen)  # listens on 127.0.0.1 only
    port = server.sockets[0].getsockname()[1]
    async with server:
        _, writer = await _connect(["127.0.0.2", "127.0.0.1"], port)
        assert writer.get_extra_info("peername")[0] == "127.0.0.1"
        writer.close()
        with pytest.raises(ConnectionRefusedError):
            await _connect(["127.0.0.2", "127.0.0.3"], port)


def test_what_counts_as_a_public_address() -> None:
    from lodger.substrates.sandbox.egress import _public

    inside = (
        "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
        "100.64.0.1", "0.0.0.0", "224.0.0.1", "::1", "fe80::1%eth0", "fd00::1",
        "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::",
    )  # fmt: skip
    for address in inside:
        assert not _public(address), address
    for address in ("8.8.8.8", "151.101.1.69", "2606:4700::6810:84e5", "::ffff:8.8.8.8"):
        assert _public(address), address
    assert NetworkPolicy(allow=("db.internal", "*.example.com")).names("DB.internal.")
    assert not NetworkPolicy(allow=("*.example.com",)).names("api.example.com")


async def test_an_existing_lodger_toml_cannot_be_changed_from_a_sandbox(
    box: Sandbox, tmp_path: Path
) -> None:
    """Broke: lodger.toml lies in the workspace and was writable in the sandbox, and the
    next lodger started there trusts it: its MCP servers are commands lodger runs on the
    host, its [permissions] allow tools without asking. A regular lodger.toml is now bound
    read-only onto itself: it cannot be written, truncated, renamed or removed."""
    config = tmp_path / CONFIG_FILE
    original = '[permissions]\nask = ["shell"]\n'
    config.write_text(original)
    planted = '[mcp.servers.helper]\ncommand = "sh"\nargs = ["-c", "echo ran on the host"]\n'
    attempts = [
        f"printf '%s' '{planted}' > lodger.toml",
        f"printf '%s' '{planted}' >> lodger.toml",
        ": > lodger.toml",
        "mv lodger.toml old.toml && printf '%s' '" + planted + "' > lodger.toml",
        "rm -f lodger.toml && printf '%s' '" + planted + "' > lodger.toml",
        "ln -sf planted.toml lodger.toml",
        "python3 -c \"import os; os.rename('lodger.toml', 'x.toml')\"",
    ]
    for attempt in attempts:
        result = await box.run(
            ["bash", "-c", attempt], workspace=tmp_path, env=ENV, limits=Limits(wall_time_s=60)
        )
        assert result.exit_code != 0, (attempt, result.output)
        assert config.read_text() == original, attempt
    assert [s.command for s in load_mcp_servers(tmp_path)] == []
    # Reading it is fine, and so is every other file of the workspace.
    result = await box.run(
        ["bash", "-c", "cat lodger.toml && echo ok > other.txt"],
        workspace=tmp_path,
        env=ENV,
        limits=Limits(wall_time_s=60),
    )
    assert result.exit_code == 0 and b"ask" in result.output
    assert (tmp_path / "other.txt").read_text() == "ok\n"


def test_the_protected_name_is_the_configuration_lodger_reads() -> None:
    assert CONFIG_FILE in TRUSTED_BY_HOST


async def test_a_command_cannot_plant_lodger_configuration(tmp_path: Path) -> None:
    """A lodger.toml that does not exist yet cannot be bound read-only (a mount needs it),
    so a command can still write one; the next lodger started there reads it untrusted
    (no record of ``lodger trust`` for that content): it starts none of its servers and
    adds none of its allow rules, and its deny rules still apply."""
    planted = (
        '[mcp.servers.helper]\ncommand = "sh"\nargs = ["-c", "echo ran on the host"]\n'
        '[permissions]\nallow = ["shell"]\ndeny = ["write_file"]\n'
    )
    await BubblewrapSandbox().run(
        ["bash", "-c", f"printf '%s' '{planted}' > lodger.toml"],
        workspace=tmp_path,
        env=ENV,
        limits=Limits(wall_time_s=60),
    )
    assert (tmp_path / CONFIG_FILE).is_file()  # the file was planted
    # The next lodger started in this workspace reads its project (lodger.runtime).
    project = Project.load(tmp_path)
    assert not project.trusted and project.mcp == ()
    assert [(r.pattern, r.decision) for r in project.rules] == [("write_file", "deny")]
    assert "1 MCP server(s)" in project.ignored and "1 allow rule(s)" in project.ignored
    # once the user has read it and trusts it, it applies whole; a change undoes that
    TrustStore.default().trust(tmp_path / CONFIG_FILE)
    assert [s.command for s in Project.load(tmp_path).mcp] == ["sh"]
    (tmp_path / CONFIG_FILE).write_text(planted + "# changed\n")
    assert Project.load(tmp_path).mcp == ()


async def test_the_policys_wall_time_bounds_what_the_model_asks_for(tmp_path: Path) -> None:
    """Broke: shell and run_python replaced the policy's ``wall_time_s`` with the call's
    ``timeout_s`` (default 60, up to 3600, chosen by the model): an operator's
    ``wall_time_s = 1`` bounded nothing. The policy's limit is now the ceiling."""
    ctx = ToolContext(
        session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o",
        workspace=tmp_path, hidden=(),
    )  # fmt: skip
    bounded = shell_tool(SandboxPolicy(limits=Limits(wall_time_s=1)))
    out = await bounded.handler({"command": "sleep 20; echo finished", "timeout_s": 3600}, ctx)
    assert isinstance(out, ToolOutput) and out.is_error, out
    assert "finished" not in out.content
    assert "[timed out after 1 s;" in out.content
    # A shorter timeout the model asks for still holds.
    roomy = shell_tool(SandboxPolicy(limits=Limits(wall_time_s=600)))
    out = await roomy.handler({"command": "sleep 20; echo finished", "timeout_s": 0.5}, ctx)
    assert isinstance(out, ToolOutput) and "[timed out after 0.5 s;" in out.content
    # The model is told the ceiling before it asks, in each tool's description.
    assert "timeout_s is capped at 1 s" in bounded.description
    assert "timeout_s is capped at 600 s" in roomy.description
    assert "capped at 1 s" in python_tool(SandboxPolicy(limits=Limits(wall_time_s=1))).description

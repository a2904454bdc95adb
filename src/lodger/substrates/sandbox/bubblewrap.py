"""The bubblewrap backend: Linux namespaces, no daemon, a few milliseconds per start.

What the command sees: the system directories (``/usr``, ``/etc``, ``/bin``, ``/lib*``)
read-only, with ``/etc/shadow`` and every file under ``/etc`` others may not read masked
(``masked_paths``); the workspace read-write at its own path (not ``/``, a system
directory or a path in ``/etc``: ``confinable_workspace``), the directories between it
and a hidden path pinned (``pinned_ancestors``); a private ``/tmp`` (a tmpfs of the disk
limit's size: ``lodger.substrates.sandbox._disk``), ``/dev`` and ``/proc``; nothing
else. Home directories, ``/root``, the lodger state directory, other projects and
credential directories are not mounted at all, so no ``..`` or symlink can
reach them; a hidden path inside the workspace or a system directory is covered by an
empty read-only tmpfs. ``lodger.toml`` and ``.git`` are bound read-only onto themselves
(``.git`` unless the policy lets commands write it: ``lodger.substrates.sandbox._git``).
New user, PID, IPC, UTS, cgroup and network namespaces; every capability dropped; no
kernel keyrings, io_uring or userfaultfd (a seccomp filter,
``lodger.substrates.sandbox._seccomp``: lodger's session keyring would be shared, and the
other two are the kernel surface exploits start from); ``--new-session`` (no terminal
injection) and ``--die-with-parent``. With an unshared PID namespace, when the command returns
bubblewrap's init exits and the kernel kills everything left inside, so nothing started
in the background (setsid, double fork, nohup) outlives the command.

Network: only a loopback interface. When the policy allows domains, the egress proxy's
Unix socket is mounted in and a small forwarder inside serves it on 127.0.0.1 as an HTTP
proxy (``lodger.substrates.sandbox.egress``). When the policy terminates TLS for some domains, the
proxy's trust bundle (the lodger CA's certificate and the host's CAs) is mounted
read-only at ``/run/lodger/ca-bundle.pem`` and ``SSL_CERT_FILE`` & co. point at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from lodger.errors import ConfigError
from lodger.substrates.sandbox._git import git_placeholder, protected_git
from lodger.substrates.sandbox._private import PrivateEntries
from lodger.substrates.sandbox._process import disk_watch, run_confined
from lodger.substrates.sandbox._seccomp import refusal_filter
from lodger.substrates.sandbox.egress import (
    EgressProxy,
    forwarder_argv,
    proxy_environment,
    trust_environment,
)
from lodger.substrates.sandbox.interface import OutputSink, SandboxResult
from lodger.substrates.sandbox.policy import SYSTEM_DIRS, Limits, NetworkPolicy, protected_files

__all__ = [
    "MASKED",
    "PRIVATE_ROOTS",
    "SYSTEM_DIRS",
    "BubblewrapSandbox",
    "bubblewrap_argv",
    "confinable_workspace",
    "joining_net",
    "masked_paths",
    "pinned_ancestors",
]

#: files under the system directories that hold secrets; covered even though /etc is bound
MASKED = (
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/shadow-",
    "/etc/gshadow-",
    "/etc/ssh",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/security/opasswd",
)
#: where files others may not read are looked for and covered too (``masked_paths``): the
#: system's configuration, where keys and passwords live (/etc/ssl/private, VPN configs).
#: /usr holds none and is far too large to walk for every command.
PRIVATE_ROOTS = ("/etc", "/usr/local/etc")
EGRESS_SOCKET = "/run/lodger/egress.sock"
TRUST_BUNDLE = "/run/lodger/ca-bundle.pem"
_PRIVATE = PrivateEntries(PRIVATE_ROOTS)
FIX = "bubblewrap is not installed; install it: apt-get install -y bubblewrap"


class BubblewrapSandbox:
    """``join_net``: the pid of a process whose network namespace commands share (the
    session's, ``lodger.substrates.background``) instead of a loopback of their own; only
    for commands with no network policy: that namespace has nothing but loopback."""

    name = "bubblewrap"

    def __init__(self, *, executable: str | None = None, join_net: int | None = None) -> None:
        self.executable = executable or shutil.which("bwrap") or "bwrap"
        self.join_net = join_net

    def unavailable(self) -> str | None:
        if shutil.which(self.executable) is None:
            return FIX
        return None

    async def run(
        self,
        argv: Sequence[str],
        *,
        workspace: Path,
        cwd: Path | None = None,
        stdin: bytes = b"",
        env: Mapping[str, str],
        limits: Limits,
        network: NetworkPolicy | None = None,
        hidden: Sequence[Path] = (),
        git_writable: bool = False,
        on_output: OutputSink | None = None,
    ) -> SandboxResult:
        network = network or NetworkPolicy()
        workspace, where = await asyncio.to_thread(_real, workspace, cwd)
        async with git_placeholder(workspace, writable=git_writable):
            with _filter_fd() as seccomp_fd:
                return await self._run(
                    argv,
                    workspace=workspace,
                    where=where,
                    stdin=stdin,
                    env=dict(env),
                    limits=limits,
                    network=network,
                    hidden=hidden,
                    git_writable=git_writable,
                    on_output=on_output,
                    seccomp_fd=seccomp_fd,
                )

    async def _run(
        self,
        argv: Sequence[str],
        *,
        workspace: Path,
        where: Path,
        stdin: bytes,
        env: dict[str, str],
        limits: Limits,
        network: NetworkPolicy,
        hidden: Sequence[Path],
        git_writable: bool,
        on_output: OutputSink | None,
        seccomp_fd: int,
    ) -> SandboxResult:
        if not network.enabled:
            command = await asyncio.to_thread(
                bubblewrap_argv,
                self.executable,
                argv,
                workspace=workspace,
                cwd=where,
                hidden=hidden,
                git_writable=git_writable,
                seccomp_fd=seccomp_fd,
                tmp_bytes=limits.disk_bytes,
                share_net=self.join_net is not None,
            )
            if self.join_net is not None:
                command = joining_net(self.join_net, command)
            return await run_confined(
                command,
                backend=self.name,
                env=env,
                cwd=workspace,
                stdin=stdin,
                limits=limits,
                on_output=on_output,
                signal_exit_codes=True,
                pass_fds=(seccomp_fd,),
                disk=await disk_watch(limits, workspace, exclude=hidden),
            )
        async with EgressProxy(network) as proxy:
            env.update(proxy_environment())
            ro_binds: list[tuple[Path, str]] = []
            if proxy.trust_bundle_path is not None:
                # The lodger CA's certificate (never its key) and the host's CAs.
                ro_binds.append((proxy.trust_bundle_path, TRUST_BUNDLE))
                env.update(trust_environment(TRUST_BUNDLE))
            command = await asyncio.to_thread(
                bubblewrap_argv,
                self.executable,
                forwarder_argv(EGRESS_SOCKET, argv),
                workspace=workspace,
                cwd=where,
                hidden=hidden,
                binds=((proxy.socket_path, EGRESS_SOCKET),),
                ro_binds=ro_binds,
                git_writable=git_writable,
                seccomp_fd=seccomp_fd,
                tmp_bytes=limits.disk_bytes,
            )
            return await run_confined(
                command,
                backend=self.name,
                env=env,
                cwd=workspace,
                stdin=stdin,
                limits=limits,
                on_output=on_output,
                signal_exit_codes=True,
                connections=proxy.connections,
                pass_fds=(seccomp_fd,),
                disk=await disk_watch(limits, workspace, exclude=hidden),
            )


def bubblewrap_argv(
    executable: str,
    argv: Sequence[str],
    *,
    workspace: Path,
    cwd: Path,
    hidden: Sequence[Path] = (),
    binds: Sequence[tuple[Path, str]] = (),
    ro_binds: Sequence[tuple[Path, str]] = (),
    git_writable: bool = False,
    seccomp_fd: int | None = None,
    tmp_bytes: int | None = None,
    share_net: bool = False,
) -> list[str]:
    """The bwrap command line that runs ``argv`` confined (see the module doc);
    ``share_net``: no network namespace of its own (``joining_net`` says whose);
    ``seccomp_fd``: a descriptor bwrap reads its seccomp filter from (``_filter_fd``);
    ``tmp_bytes``: the size of its private ``/tmp`` (the disk limit).
    Where ``workspace`` has no ``.git``, a caller that keeps it read-only holds
    ``git_placeholder`` while the command runs."""
    args = [
        executable,
        "--die-with-parent",
        "--new-session",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        *(() if share_net else ("--unshare-net",)),
        "--unshare-cgroup-try",
        "--hostname",
        "lodger-sandbox",
        "--cap-drop",
        "ALL",
    ]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in masked_paths():
        args += _cover(path)
    args += ["--proc", "/proc", "--dev", "/dev"]
    if tmp_bytes is not None:
        args += ["--size", str(tmp_bytes)]
    args += ["--tmpfs", "/tmp", "--tmpfs", "/run"]
    for source, target in binds:
        args += ["--bind", str(source), target]
    for source, target in ro_binds:
        args += ["--ro-bind", str(source), target]
    git = protected_git(workspace) if not git_writable else None
    args += ["--bind", str(workspace), str(workspace)]
    for between in pinned_ancestors(workspace, [*hidden, *(git.inner if git else ())]):
        args += ["--bind", between, between]
    for trusted in protected_files(workspace):  # lodger.toml: the host's configuration
        args += ["--ro-bind", trusted, trusted]
    for trusted in git.read_only if git else ():  # .git: what the host's git runs
        args += ["--ro-bind", trusted, trusted]
    for hidden_path in hidden:
        real = os.path.realpath(hidden_path)
        if any(Path(real).is_relative_to(d) for d in (*SYSTEM_DIRS, str(workspace))):
            args += _cover(real)
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    args += ["--chdir", str(cwd), "--", *argv]
    return args


def joining_net(pid: int, command: Sequence[str]) -> list[str]:
    """``command`` (a bwrap command line built with ``share_net``) run in the user and
    network namespaces of ``pid``: a sandbox's, which has only a loopback interface."""
    nsenter = shutil.which("nsenter") or "nsenter"
    return [nsenter, f"--target={pid}", "--user", "--net", "--preserve-credentials", *command]


@contextlib.contextmanager
def _filter_fd() -> Iterator[int]:
    """A pipe's read end holding the seccomp filter (``lodger.substrates.sandbox._seccomp``), for
    ``bwrap --seccomp``; a few hundred bytes, so the write never blocks."""
    read, write = os.pipe()
    try:
        with os.fdopen(write, "wb") as pipe:
            pipe.write(refusal_filter())
        yield read
    finally:
        os.close(read)


def pinned_ancestors(workspace: Path, hidden: Sequence[Path]) -> list[str]:
    """The directories between ``workspace`` and each hidden path inside it (``ws/sub``
    for ``ws/sub/.lodger``), outermost first. Each is bound onto itself, read-write as
    before: a mount point cannot be renamed, so no command can move a hidden path out
    from under its cover (``mv sub elsewhere``) and leave a decoy to be covered next."""
    pinned: list[str] = []
    for hidden_path in hidden:
        real = Path(os.path.realpath(hidden_path))
        if real == workspace or not real.is_relative_to(workspace):
            continue
        for between in reversed(real.parents):
            inside = between.is_relative_to(workspace) and between != workspace
            if inside and str(between) not in pinned and between.is_dir():
                pinned.append(str(between))
    return pinned


def masked_paths() -> list[str]:
    """``MASKED`` and every entry under ``PRIVATE_ROOTS`` that others may not read (a
    directory: read or enter): private to its owner or group, so no business of a
    command. It must be covered even so: the sandbox keeps lodger's uid and groups, and
    run as root it owns every root file. The walk is repeated whenever anything under
    the roots changed since the last one (``_private``: inotify and the mount table)."""
    found = [path for path in MASKED if os.path.lexists(path)]
    found += _PRIVATE.get()
    covered: list[str] = []
    # A path inside a directory already covered (a key in /etc/ssh) is gone with it.
    for path in sorted(set(found), key=lambda p: (p.count("/"), p)):
        if not any(path.startswith(done + "/") for done in covered):
            covered.append(path)
    return covered


def _real(workspace: Path, cwd: Path | None) -> tuple[Path, Path]:
    root = confinable_workspace(workspace)
    return root, Path(os.path.realpath(cwd)) if cwd is not None else root


#: where no workspace may lie: the configuration (its masks would be undone) and the
#: kernel's filesystems
_NO_WORKSPACE_INSIDE = ("/etc", "/proc", "/sys", "/dev")


def confinable_workspace(workspace: Path) -> Path:
    """The real path of ``workspace``; a ``ConfigError`` when binding it read-write (after
    the read-only system directories and their masks) would undo the sandbox: ``/`` or
    another parent of a system directory, a system directory itself, a path in ``/etc``
    or a kernel filesystem. A project under ``/usr/local/src`` is fine."""
    root = Path(os.path.realpath(workspace))
    for system in (*SYSTEM_DIRS, *_NO_WORKSPACE_INSIDE):
        real = Path(os.path.realpath(system))
        inside = system in _NO_WORKSPACE_INSIDE and root.is_relative_to(real)
        if inside or real.is_relative_to(root):
            raise ConfigError(
                f"the workspace {root} would give sandboxed commands {real} read-write",
                hint="give lodger a project directory as its workspace (--workspace DIR, "
                "or start it there), not / or a system directory",
            )
    return root


def _cover(path: str) -> list[str]:
    # Not there: nothing to cover. A directory: an empty read-only tmpfs. A file: /dev/null.
    if os.path.isdir(path) and not os.path.islink(path):
        return ["--tmpfs", path, "--remount-ro", path]
    if os.path.lexists(path):
        return ["--ro-bind", "/dev/null", path]
    return []

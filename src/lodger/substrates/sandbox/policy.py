"""What a sandboxed process may do: which backend confines it, its limits, which host
environment variables it sees and where its network traffic may go.

    [sandbox]                       # in lodger.toml; every key is optional
    backend = "bubblewrap"          # "bubblewrap" (default), "runsc" (gVisor) or "none"
    approval = false                # ask before each command even though it is confined
    git_writable = false            # let commands write the workspace's .git (see below)
    env = ["CI"]                    # host variables passed in by name (never credentials)
    wall_time_s = 60                # limits; see ``Limits``
    cpu_time_s = 60
    memory_mb = 1024
    max_processes = 256
    output_mb = 16
    disk_mb = 1024                  # what one command may write (workspace and /tmp)

    cpu_rate = 1.0                  # CPUs the whole tree may keep busy (default: no cap)
    secrets_file = "~/.config/lodger/secrets.toml"   # or LODGER_SECRETS_FILE; see
                                                     # ``lodger.substrates.sandbox.secrets``

    [sandbox.network]
    allow = ["pypi.org", "*.pythonhosted.org", "api.example.com"]  # default: no network
    terminate_tls = ["api.example.com"]          # HTTPS there gets the credentials too
    upstream_ca = "/path/ca.pem"                 # verify upstreams with this, not the host's
    [sandbox.network.credentials."api.example.com"]
    Authorization = "Bearer ${EXAMPLE_TOKEN}"    # injected by the egress proxy, outside

``backend = "none"`` runs commands on the host, unconfined: an explicit choice that the
shell tool records in every T1 (``actor:sandbox:none``), never a fallback.

``.git`` is read-only inside a sandbox (DESIGN section 8): the host's git runs what a
repository's hooks and config name (``core.fsmonitor`` on every ``git status``,
``core.pager``, ``core.hooksPath``, aliases...), outside any sandbox, so a command must
not be able to leave any there. Reading works (``git status``, ``log``, ``diff``,
``blame``); committing, staging, fetching and changing config inside fail with "Read-only
file system" (the shell tools' description tells the model). ``git_writable = true`` opts
in to a writable ``.git``, as before: the shell tools' T1 then records
``actor:sandbox:git-writable`` and ``lodger tools list`` shows it.
It widens, so a project that is not trusted cannot set it (``lodger.runtime.project``).
Case by case (``lodger.substrates.sandbox._git``), for the ``.git`` at the workspace
root only:

- a directory: bound read-only onto itself. Nothing under it can be written, and as a
  mount point it can be neither renamed nor removed, so no command can put another
  repository in its place.
- a gitdir file (a linked worktree, a submodule checked out on its own): the file is
  bound read-only, so it cannot be pointed elsewhere. The git directory it names
  usually lies outside the workspace, so it is not mounted at all (git inside then
  finds no repository); one inside the workspace is bound read-only too, with its
  worktree's ``commondir`` and every directory between it and the workspace pinned.
  A path through a symlink inside the workspace, a git directory that is missing or is
  the workspace itself are refused (``ConfigError``): a command could make or redirect
  what the host's git would follow.
- a symlink (or a socket, a device): refused with a ``ConfigError``. A mount cannot
  hold a symlink in place, so a command could replace it with a repository of its own.
- none (no repository, or the workspace is a folder of one whose ``.git`` lies above
  it, outside the sandbox): an empty placeholder directory is made there for the run
  and bound read-only, so a command cannot ``git init`` (or write a gitdir file) where
  the host's git would find it later, ahead of any repository above, and trust it. It
  is removed when the last run holding it ends (a shared ``flock`` per run; a run
  killed with lodger leaves it empty, and the next run takes it over and removes it).
  An empty ``.git`` is no repository to git, which looks on past it in the parent
  directories, so the placeholder changes nothing for the host meanwhile. This was
  chosen over allowing a fresh repository (the command's, hooks and all, trusted by
  the next ``git commit`` on the host) and over refusing commands in workspaces
  without a repository; ``git init`` there needs ``git_writable = true``.

Beyond the root's ``.git``:

- submodules: the gitlinks (mode 160000) of the root's index, read by lodger itself (it
  runs no git in a repository a command may have shaped), and those of each submodule's
  own index, nested ones included: the host's ``git status`` at the root recurses into
  each and runs its ``core.fsmonitor``. A checked-out submodule's ``.git`` (a gitdir file
  or a directory) is bound read-only and the directories on its way pinned; where one
  is not checked out (an empty directory, or a path missing from some point on), an
  empty placeholder stands where its path first goes missing, read-only, for the run.
  A submodule path through a symlink is refused; so is a workspace with more than
  ``_git.MAX_GITLINKS`` submodules.
- a root without a repository (no ``.git``, or the empty placeholder): git reads a
  directory with a valid ``HEAD`` beside ``objects/`` and ``refs/`` as a bare
  repository, config and all, so ``HEAD`` there is held too: a placeholder directory for
  the run (which is no valid ``HEAD``), or the file of that name read-only; a symlink
  named ``HEAD`` there is refused.
- the file tools run on the host: ``write_file`` and ``edit_file`` refuse any path with
  a ``.git`` component (in any letter case), the directory the root's gitdir file names
  inside the workspace, and ``HEAD`` at a root without a repository, unless
  ``git_writable = true`` (``lodger.tools.files``).

Not covered: a repository a command makes below the root that is no submodule
(``git init sub``) is the command's, and the host's git trusts it when someone runs git
in that directory; git's own ``safe.bareRepository = explicit`` (and not running git
inside directories an agent made) is the user's defence there.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lodger.errors import ConfigError
from lodger.substrates.sandbox.secrets import SECRETS_VARIABLE, load_secrets_file
from lodger.tools.workspace import TRUSTED_BY_HOST

__all__ = [
    "BACKENDS",
    "SYSTEM_DIRS",
    "TRUSTED_BY_HOST",
    "Backend",
    "Limits",
    "NetworkPolicy",
    "SandboxPolicy",
    "expand_variables",
    "looks_like_credential",
    "policy_from_config",
    "protected_files",
]

#: the host's system directories every sandbox mounts read-only (nothing secret lives there)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


Backend = Literal["bubblewrap", "runsc", "none"]
BACKENDS: tuple[Backend, ...] = ("bubblewrap", "runsc", "none")

_CREDENTIAL = re.compile(
    r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|SESSION|COOKIE|PRIVATE)", re.I
)


# RFC 9110's token: what a header name may be; and what must never be in a header value
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_BREAK = re.compile(r"[\r\n\x00]")

# scheme://user:password@...: a URL that carries a password
_URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s:]*:[^/?#@\s]+@")


def protected_files(workspace: Path) -> list[str]:
    """The ``TRUSTED_BY_HOST`` files of ``workspace`` to bind read-only onto themselves: a
    mount point can be neither written, renamed nor removed. A symlink is left out (the
    link itself could still be replaced), and so is a file that does not exist."""
    found: list[str] = []
    for name in TRUSTED_BY_HOST:
        path = workspace / name
        try:
            mode = path.lstat().st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode):
            found.append(str(path))
    return found


def looks_like_credential(name: str) -> bool:
    """``GITHUB_TOKEN``, ``AWS_SECRET_ACCESS_KEY``...: names never passed into a sandbox."""
    return bool(_CREDENTIAL.search(name))


_WHOLE = ("memory_bytes", "max_processes", "output_bytes", "disk_bytes")


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one sandboxed command may use; ``None`` means no limit of that kind.

    ``wall_time_s`` and ``output_bytes`` are enforced by lodger (it kills the sandbox);
    ``memory_bytes`` and ``max_processes`` by a cgroup where one can be created (else
    memory by ``RLIMIT_AS``). ``cpu_time_s`` is a budget for the whole process tree,
    counted by the cgroup (lodger kills the tree when it is spent; ``RLIMIT_CPU`` per
    process where no cgroup counts CPU time); ``cpu_rate`` caps how many CPUs the tree
    may keep busy at once (the cgroup cpu controller; 0.5 = half of one CPU).
    ``disk_bytes`` bounds what one command writes into the workspace and its private
    ``/tmp`` together: lodger kills the tree once they hold that much more than before it
    started (``lodger.substrates.sandbox._disk`` says how, and what it does not cover).
    """

    wall_time_s: float = 60.0
    cpu_time_s: float | None = 60.0
    memory_bytes: int | None = 1024 * 1024 * 1024
    max_processes: int | None = 256
    output_bytes: int = 16 * 1024 * 1024
    cpu_rate: float | None = None
    disk_bytes: int | None = 1024 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in (
            "wall_time_s",
            "cpu_time_s",
            "memory_bytes",
            "max_processes",
            "output_bytes",
            "cpu_rate",
            "disk_bytes",
        ):
            value = getattr(self, name)
            if value is None:
                continue
            # NaN compares false with everything: a NaN budget would never run out.
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"sandbox limit {name} must be a number, not {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"sandbox limit {name} must be positive, not {value}")
            if name in _WHOLE and not isinstance(value, int):
                raise ConfigError(f"sandbox limit {name} must be a whole number, not {value}")

    def describe(self) -> str:
        parts = [f"wall {self.wall_time_s:g}s"]
        if self.cpu_time_s is not None:
            parts.append(f"cpu {self.cpu_time_s:g}s")
        if self.cpu_rate is not None:
            parts.append(f"rate {self.cpu_rate:g} cpu")
        if self.memory_bytes is not None:
            parts.append(f"mem {self.memory_bytes // (1024 * 1024)}MiB")
        if self.max_processes is not None:
            parts.append(f"procs {self.max_processes}")
        parts.append(f"out {self.output_bytes // (1024 * 1024)}MiB")
        if self.disk_bytes is not None:
            parts.append(f"disk {self.disk_bytes // (1024 * 1024)}MiB")
        return " ".join(parts)


@dataclass(frozen=True, kw_only=True)
class NetworkPolicy:
    """No network unless ``allow`` names domains (``example.com``, ``*.example.com``).

    Allowed traffic leaves only through lodger's egress proxy, which runs outside the
    sandbox; ``credentials`` maps a domain to headers the proxy adds to plain-HTTP
    requests for it, so the secret never enters the sandbox. HTTPS to an allowed domain
    is tunnelled untouched, unless ``terminate_tls`` marks it: then the proxy ends the
    sandbox's TLS with a certificate from a lodger CA only the sandbox trusts, adds the
    headers, and opens its own TLS connection upstream, verified against the host's
    trust store (or ``upstream_ca``, a PEM file).
    """

    allow: tuple[str, ...] = ()
    credentials: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    terminate_tls: tuple[str, ...] = ()
    upstream_ca: Path | None = None

    def __post_init__(self) -> None:
        for domain, headers in self.credentials.items():
            for name, value in headers.items():
                # A line break in a value (or a name) would end the header the proxy writes
                # and start another, or a body: the secret's source (an environment
                # variable, the secrets file) is not the proxy's to trust with that.
                # Errors name the domain and header, never the value.
                if not _HEADER_NAME.fullmatch(name):
                    raise ConfigError(
                        f"the network policy's credential header {name!r} for {domain!r} "
                        "is not a header name",
                        hint="use letters, digits and - in header names",
                    )
                if _HEADER_BREAK.search(value):
                    raise ConfigError(
                        f"the network policy's credential header {name!r} for {domain!r} "
                        "has a line break or NUL in its value",
                        hint="check where the value comes from (its environment variable or "
                        "the secrets file): a header value is one line",
                    )
        for pattern in self.terminate_tls:
            if not any(fnmatch.fnmatchcase(pattern.lower(), a.lower()) for a in self.allow):
                raise ConfigError(
                    f"the network policy terminates TLS for {pattern!r}, "
                    "which its allow-list does not name",
                    hint=f"add {pattern!r} to network.allow, or drop it from terminate_tls",
                )

    @property
    def enabled(self) -> bool:
        return bool(self.allow)

    def terminates(self, host: str) -> bool:
        """Whether the proxy terminates TLS for ``host`` (an allowed, marked domain)."""
        host = host.lower().rstrip(".")
        return self.allows(host) and any(
            fnmatch.fnmatchcase(host, pattern.lower()) for pattern in self.terminate_tls
        )

    def names(self, host: str) -> bool:
        """Whether the allow-list spells ``host`` out, not through a wildcard: only such a
        name may lead to an address inside (loopback, a private network), since a
        wildcard cannot say which names it lets in."""
        host = host.lower().rstrip(".")
        return any(
            pattern.lower().rstrip(".") == host and not any(c in pattern for c in "*?[")
            for pattern in self.allow
        )

    def allows(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        if not _is_domain(host):
            return False
        loopback = host == "localhost" or host.endswith(".localhost")
        return any(
            fnmatch.fnmatchcase(host, pattern.lower())
            # 'localhost' (RFC 6761: always this machine) only where named outright
            and not (loopback and any(c in pattern for c in "*?["))
            for pattern in self.allow
        )

    def headers_for(self, host: str) -> Mapping[str, str]:
        host = host.lower().rstrip(".")
        for pattern, headers in self.credentials.items():
            if fnmatch.fnmatchcase(host, pattern.lower()):
                return headers
        return {}

    def describe(self) -> str:
        if not self.allow:
            return "off"
        text = "proxy: " + ", ".join(self.allow)
        if self.terminate_tls:
            text += " (TLS terminated: " + ", ".join(self.terminate_tls) + ")"
        if self.credentials:
            text += " (credentials for: " + ", ".join(self.credentials) + ")"
        return text


def _is_domain(host: str) -> bool:
    # An allow-list names domains; a literal IP never matches a pattern, nor does
    # 'localhost' a wildcard (``allows``).
    if not re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+)*", host):
        return False
    try:
        # Every spelling of an IPv4 address the resolver takes: 127.1, 0x7f000001, 0x7f.1
        socket.inet_aton(host)
    except OSError:
        return True
    return False


@dataclass(frozen=True, kw_only=True)
class SandboxPolicy:
    """How the processes a tool starts are confined."""

    backend: Backend = "bubblewrap"
    limits: Limits = field(default_factory=Limits)
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    #: host environment variables passed in by name; credential-like names are refused
    env: tuple[str, ...] = ()
    #: ask for approval before each command even though it runs confined
    approval: bool = False
    #: let commands write the workspace's ``.git`` (default: read-only; see the module doc)
    git_writable: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"unknown sandbox backend {self.backend!r}",
                hint="choose one of " + ", ".join(BACKENDS),
            )
        for name in self.env:
            if looks_like_credential(name):
                raise ConfigError(
                    f"the sandbox policy passes {name!r}, which looks like a credential",
                    hint="give credentials to the egress proxy "
                    "(network.credentials), never to the sandbox",
                )

    @property
    def confined(self) -> bool:
        return self.backend != "none"

    def host_environment(self) -> dict[str, str]:
        """The named host variables that are set; a ``ConfigError`` for one whose value
        carries a password in a URL (``postgresql://app:secret@db/app``)."""
        found = {name: os.environ[name] for name in self.env if name in os.environ}
        for name, value in found.items():
            if _URL_PASSWORD.search(value):
                raise ConfigError(
                    f"the sandbox policy passes {name!r}, whose value is a URL with a "
                    "password in it",
                    hint="give credentials to the egress proxy (network.credentials), "
                    f"never to the sandbox; or drop {name!r} from [sandbox] env",
                )
        return found

    def describe(self) -> str:
        git = "writable" if self.git_writable or not self.confined else "read-only"
        return (
            f"{self.backend}; {self.limits.describe()}; net {self.network.describe()}; .git {git}"
        )


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_variables(value: str, where: str) -> str:
    """``value`` with each ``${NAME}`` replaced from the environment; an unset name is a
    ``ConfigError`` naming ``where``."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise ConfigError(
                f"{where} uses ${{{name}}}, which is not set in the environment",
                hint=f"export {name}=... before running lodger",
            )
        return os.environ[name]

    return _VARIABLE.sub(one, value)


_LIMIT_KEYS = {
    "wall_time_s": ("wall_time_s", 1.0),
    "cpu_time_s": ("cpu_time_s", 1.0),
    "memory_mb": ("memory_bytes", 1024 * 1024),
    "max_processes": ("max_processes", 1),
    "output_mb": ("output_bytes", 1024 * 1024),
    "cpu_rate": ("cpu_rate", 1.0),
    "disk_mb": ("disk_bytes", 1024 * 1024),
}


def policy_from_config(
    table: Mapping[str, Any], *, where: str = "[sandbox]", workspace: Path | None = None
) -> SandboxPolicy:
    """A policy from the ``[sandbox]`` table of ``lodger.toml`` (see the module doc).

    ``workspace``: where sandboxed commands work, which a secrets file must lie outside
    (default: the current directory)."""
    known = {"backend", "approval", "env", "git_writable", "network", "secrets_file", *_LIMIT_KEYS}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(
            f"{where} has unknown keys: {', '.join(unknown)}",
            hint="known keys: " + ", ".join(sorted(known)),
        )
    limits = _limits(table, where)
    env = table.get("env", [])
    if not isinstance(env, list) or not all(isinstance(v, str) for v in env):
        raise ConfigError(f"{where} env must be a list of variable names")
    approval = table.get("approval", False)
    if not isinstance(approval, bool):
        raise ConfigError(f"{where} approval must be true or false")
    git_writable = table.get("git_writable", False)
    if not isinstance(git_writable, bool):
        raise ConfigError(f"{where} git_writable must be true or false")
    network = _network(table, where, workspace)
    return SandboxPolicy(
        backend=table.get("backend", "bubblewrap"),
        limits=limits,
        network=network,
        env=tuple(env),
        approval=approval,
        git_writable=git_writable,
    )


def _limits(table: Mapping[str, Any], where: str) -> Limits:
    """The limit keys of a ``[sandbox]`` table (``memory_mb``, ``wall_time_s``...)."""
    limits: dict[str, Any] = {}
    for key, (attr, scale) in _LIMIT_KEYS.items():
        if key in table:
            value = table[key]
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ConfigError(f"{where} {key} must be a number")
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{where} {key} must be a positive number, not {value}")
            if attr in _WHOLE:
                if scale == 1 and value != int(value):
                    raise ConfigError(f"{where} {key} must be a whole number, not {value}")
                value = max(1, int(value * scale))
            limits[attr] = value
    return Limits(**limits)


def _network(table: Mapping[str, Any], where: str, workspace: Path | None) -> NetworkPolicy:
    """``[sandbox.network]``: the allow-list, TLS termination and credentials (from the
    table's ``${VARIABLE}``s and the secrets file)."""
    network = table.get("network", {})
    if not isinstance(network, dict):
        raise ConfigError(f"{where} network must be a table")
    network_keys = {"allow", "credentials", "terminate_tls", "upstream_ca"}
    unknown = sorted(set(network) - network_keys)
    if unknown:
        raise ConfigError(
            f"{where} network has unknown keys: {', '.join(unknown)}",
            hint="known keys: " + ", ".join(sorted(network_keys)),
        )
    allow = network.get("allow", [])
    if not isinstance(allow, list) or not all(isinstance(v, str) for v in allow):
        raise ConfigError(f"{where} network.allow must be a list of domains")
    terminate = network.get("terminate_tls", [])
    if not isinstance(terminate, list) or not all(isinstance(v, str) for v in terminate):
        raise ConfigError(f"{where} network.terminate_tls must be a list of domains")
    upstream_ca = network.get("upstream_ca")
    if upstream_ca is not None and not isinstance(upstream_ca, str):
        raise ConfigError(f"{where} network.upstream_ca must be a path")
    credentials: dict[str, dict[str, str]] = {}
    for domain, headers in dict(network.get("credentials", {})).items():
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise ConfigError(f"{where} network.credentials.{domain} must be a table of strings")
        credentials[domain] = {
            name: expand_variables(value, f"{where} network.credentials.{domain}.{name}")
            for name, value in headers.items()
        }
    secrets_file = table.get("secrets_file", os.environ.get(SECRETS_VARIABLE))
    if secrets_file is not None:
        if not isinstance(secrets_file, str) or not secrets_file:
            raise ConfigError(f"{where} secrets_file must be a path")
        from_file = load_secrets_file(
            secrets_file, workspace=workspace or Path.cwd(), mounted=SYSTEM_DIRS
        )
        for domain, headers in from_file.items():
            mine = credentials.setdefault(domain, {})
            twice = sorted({n.lower() for n in mine} & {n.lower() for n in headers})
            if twice:
                raise ConfigError(
                    f"the credentials for {domain!r} set {', '.join(twice)} both in "
                    f"{where} and in the secrets file",
                    hint="keep each header in one place",
                )
            mine.update(headers)
    for domain, headers in dict(network.get("credentials", {})).items():
        for name, value in headers.items():
            # The table lives in lodger.toml, inside the workspace every sandboxed command
            # reads: a secret written there literally would be in the sandbox after all.
            if looks_like_credential(name) and not _VARIABLE.search(value):
                raise ConfigError(
                    f"{where} network.credentials.{domain}.{name} is written out in the "
                    "file, which lies in the workspace where sandboxed commands can read it",
                    hint=f'write {name} = "... ${{NAME}}" and export NAME, or put the '
                    "header in the secrets file (secrets_file)",
                )
    return NetworkPolicy(
        allow=tuple(allow),
        credentials=credentials,
        terminate_tls=tuple(terminate),
        upstream_ca=Path(os.path.expanduser(upstream_ca)) if upstream_ca else None,
    )

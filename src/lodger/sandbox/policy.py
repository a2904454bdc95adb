"""What a sandboxed process may do: which backend confines it, its limits, which host
environment variables it sees and where its network traffic may go.

    [sandbox]                       # in lodger.toml; every key is optional
    backend = "bubblewrap"          # "bubblewrap" (default), "runsc" (gVisor) or "none"
    approval = false                # ask before each command even though it is confined
    env = ["CI"]                    # host variables passed in by name (never credentials)
    wall_time_s = 60                # limits; see ``Limits``
    cpu_time_s = 60
    memory_mb = 1024
    max_processes = 256
    output_mb = 16

    [sandbox.network]
    allow = ["pypi.org", "*.pythonhosted.org"]   # default: no network at all
    [sandbox.network.credentials."api.example.com"]
    Authorization = "Bearer ${EXAMPLE_TOKEN}"    # injected by the egress proxy, outside

``backend = "none"`` runs commands on the host, unconfined: an explicit choice that the
shell tool records in every T1 (``actor:sandbox:none``), never a fallback.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lodger.errors import ConfigError

__all__ = [
    "BACKENDS",
    "Backend",
    "Limits",
    "NetworkPolicy",
    "SandboxPolicy",
    "looks_like_credential",
    "policy_from_config",
]

Backend = Literal["bubblewrap", "runsc", "none"]
BACKENDS: tuple[Backend, ...] = ("bubblewrap", "runsc", "none")

_CREDENTIAL = re.compile(
    r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|SESSION|COOKIE|PRIVATE)", re.I
)


def looks_like_credential(name: str) -> bool:
    """``GITHUB_TOKEN``, ``AWS_SECRET_ACCESS_KEY``...: names never passed into a sandbox."""
    return bool(_CREDENTIAL.search(name))


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one sandboxed command may use; ``None`` means no limit of that kind.

    ``wall_time_s`` and ``output_bytes`` are enforced by lodger (it kills the sandbox);
    ``memory_bytes`` and ``max_processes`` by a cgroup where one can be created (else
    memory by ``RLIMIT_AS``). ``cpu_time_s`` is a budget for the whole process tree,
    counted by the cgroup (lodger kills the tree when it is spent; ``RLIMIT_CPU`` per
    process where no cgroup counts CPU time); ``cpu_rate`` caps how many CPUs the tree
    may keep busy at once (the cgroup cpu controller; 0.5 = half of one CPU).
    """

    wall_time_s: float = 60.0
    cpu_time_s: float | None = 60.0
    memory_bytes: int | None = 1024 * 1024 * 1024
    max_processes: int | None = 256
    output_bytes: int = 16 * 1024 * 1024
    cpu_rate: float | None = None

    def __post_init__(self) -> None:
        for name in (
            "wall_time_s",
            "cpu_time_s",
            "memory_bytes",
            "max_processes",
            "output_bytes",
            "cpu_rate",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"sandbox limit {name} must be positive, not {value}")

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
        return " ".join(parts)


@dataclass(frozen=True, kw_only=True)
class NetworkPolicy:
    """No network unless ``allow`` names domains (``example.com``, ``*.example.com``).

    Allowed traffic leaves only through lodger's egress proxy, which runs outside the
    sandbox; ``credentials`` maps a domain to headers the proxy adds to plain-HTTP
    requests for it, so the secret never enters the sandbox.
    """

    allow: tuple[str, ...] = ()
    credentials: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.allow)

    def allows(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(
            fnmatch.fnmatchcase(host, pattern.lower()) and _is_domain(host)
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
        return "proxy: " + ", ".join(self.allow)


def _is_domain(host: str) -> bool:
    # An allow-list names domains; a literal IP or 'localhost' never matches a pattern.
    return bool(re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+)*", host)) and not re.fullmatch(
        r"[0-9.]+", host
    )


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
        """The named host variables that are set."""
        return {name: os.environ[name] for name in self.env if name in os.environ}

    def describe(self) -> str:
        return f"{self.backend}; {self.limits.describe()}; net {self.network.describe()}"


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand(value: str, where: str) -> str:
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
}


def policy_from_config(table: Mapping[str, Any], *, where: str = "[sandbox]") -> SandboxPolicy:
    """A policy from the ``[sandbox]`` table of ``lodger.toml`` (see the module doc)."""
    known = {"backend", "approval", "env", "network", *_LIMIT_KEYS}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(
            f"{where} has unknown keys: {', '.join(unknown)}",
            hint="known keys: " + ", ".join(sorted(known)),
        )
    limits: dict[str, Any] = {}
    for key, (attr, scale) in _LIMIT_KEYS.items():
        if key in table:
            value = table[key]
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ConfigError(f"{where} {key} must be a number")
            limits[attr] = int(value * scale) if scale != 1.0 else value
    env = table.get("env", [])
    if not isinstance(env, list) or not all(isinstance(v, str) for v in env):
        raise ConfigError(f"{where} env must be a list of variable names")
    approval = table.get("approval", False)
    if not isinstance(approval, bool):
        raise ConfigError(f"{where} approval must be true or false")
    network = table.get("network", {})
    if not isinstance(network, dict):
        raise ConfigError(f"{where} network must be a table")
    allow = network.get("allow", [])
    if not isinstance(allow, list) or not all(isinstance(v, str) for v in allow):
        raise ConfigError(f"{where} network.allow must be a list of domains")
    credentials: dict[str, dict[str, str]] = {}
    for domain, headers in dict(network.get("credentials", {})).items():
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise ConfigError(f"{where} network.credentials.{domain} must be a table of strings")
        credentials[domain] = {
            name: _expand(value, f"{where} network.credentials.{domain}.{name}")
            for name, value in headers.items()
        }
    return SandboxPolicy(
        backend=table.get("backend", "bubblewrap"),
        limits=Limits(**limits),
        network=NetworkPolicy(allow=tuple(allow), credentials=credentials),
        env=tuple(env),
        approval=approval,
    )

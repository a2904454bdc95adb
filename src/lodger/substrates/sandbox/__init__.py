"""Process sandboxes: where the commands that tools start run (DESIGN section 8).

>>> policy = SandboxPolicy()                    # bubblewrap, no network, default limits
>>> box = sandbox_for(policy)
>>> result = await box.run(["make", "test"], workspace=root, env={...}, limits=policy.limits)
>>> result.exit_code, result.limit, result.output

Backends: ``BubblewrapSandbox`` (namespaces; the default), ``RunscSandbox`` (gVisor, a
user-space kernel: stronger isolation, slower start) and ``HostSandbox`` (unconfined,
only by explicit policy). All implement ``Sandbox`` and run the same escape tests.
"""

from __future__ import annotations

import typing as _typing

from lodger._core import lazy as _lazy

if _typing.TYPE_CHECKING:
    from lodger.substrates.sandbox.bubblewrap import BubblewrapSandbox
    from lodger.substrates.sandbox.egress import EgressProxy
    from lodger.substrates.sandbox.host import HostSandbox
    from lodger.substrates.sandbox.interface import Connection, LimitName, Sandbox, SandboxResult
    from lodger.substrates.sandbox.policy import (
        Limits,
        NetworkPolicy,
        SandboxPolicy,
        policy_from_config,
    )
    from lodger.substrates.sandbox.runsc import RunscSandbox

__all__ = [
    "BubblewrapSandbox",
    "Connection",
    "EgressProxy",
    "HostSandbox",
    "LimitName",
    "Limits",
    "NetworkPolicy",
    "RunscSandbox",
    "Sandbox",
    "SandboxPolicy",
    "SandboxResult",
    "policy_from_config",
    "sandbox_for",
]


#: where each name lives, imported on first use: a process that only reads a policy (every
#: tool list does) loads no backend, no process runner, no egress proxy
_EXPORTS: dict[str, str] = {
    "BubblewrapSandbox": "lodger.substrates.sandbox.bubblewrap",
    "Connection": "lodger.substrates.sandbox.interface",
    "EgressProxy": "lodger.substrates.sandbox.egress",
    "HostSandbox": "lodger.substrates.sandbox.host",
    "LimitName": "lodger.substrates.sandbox.interface",
    "Limits": "lodger.substrates.sandbox.policy",
    "NetworkPolicy": "lodger.substrates.sandbox.policy",
    "RunscSandbox": "lodger.substrates.sandbox.runsc",
    "Sandbox": "lodger.substrates.sandbox.interface",
    "SandboxPolicy": "lodger.substrates.sandbox.policy",
    "SandboxResult": "lodger.substrates.sandbox.interface",
    "policy_from_config": "lodger.substrates.sandbox.policy",
}


def __getattr__(name: str) -> _typing.Any:
    return _lazy.resolve(__name__, _EXPORTS, globals(), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def sandbox_for(policy: SandboxPolicy) -> Sandbox:
    """The backend ``policy`` names."""
    if policy.backend == "bubblewrap":
        from lodger.substrates.sandbox.bubblewrap import BubblewrapSandbox

        return BubblewrapSandbox()
    if policy.backend == "runsc":
        from lodger.substrates.sandbox.runsc import RunscSandbox

        return RunscSandbox()
    from lodger.substrates.sandbox.host import HostSandbox

    return HostSandbox()

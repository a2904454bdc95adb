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

from lodger.sandbox.bubblewrap import BubblewrapSandbox
from lodger.sandbox.egress import EgressProxy
from lodger.sandbox.host import HostSandbox
from lodger.sandbox.interface import Connection, LimitName, Sandbox, SandboxResult
from lodger.sandbox.policy import Limits, NetworkPolicy, SandboxPolicy, policy_from_config
from lodger.sandbox.runsc import RunscSandbox

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


def sandbox_for(policy: SandboxPolicy) -> Sandbox:
    """The backend ``policy`` names."""
    if policy.backend == "bubblewrap":
        return BubblewrapSandbox()
    if policy.backend == "runsc":
        return RunscSandbox()
    return HostSandbox()

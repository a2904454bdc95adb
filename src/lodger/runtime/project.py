"""A project: a workspace and its ``lodger.toml``, loaded and checked once.

Every door a session comes through (the library, each CLI command, the host, a worker,
a subagent's child) starts from a ``Project`` and composes it the same way
(``lodger.runtime.composition``), so a rule written in the file holds whichever door it is.

    model = "openai:gpt-4.1"        # the default model
    [permissions]                   # deny, then ask, then allow (first match wins)
    deny = ["shell(rm *)"]
    [sandbox]                       # lodger.substrates.sandbox.policy
    memory_mb = 512
    [mcp.servers.git]               # lodger.runtime.config
    command = "mcp-server-git"
    [limits]
    max_steps = 30
    request_limit = 40              # usage limits per turn (lodger.engine.budgets)
    [budgets]                       # money: a reached budget parks the turn
    session_usd = 2.0
    [model_settings]                # lodger.engine.modelsettings
    temperature = 0.2

A project is *trusted* or not. A trusted one applies the whole file: the user said so
(``lodger trust`` recorded this exact content, ``lodger.runtime.trust``; or ``--trust``,
``--trust-projects``). An untrusted one (a new or changed file, or a workspace restored
from storage on a worker or a host, whose files a sandboxed command may have written)
applies only what narrows: its deny and ask rules, a stricter sandbox (lower limits,
approval), a lower step limit, lower usage limits and money budgets, a lower
``max_tokens`` (its other model settings and ``output_mode`` are ignored: ``extra`` reaches
the provider's request body as is). It starts no MCP server, adds no allow rule, opens no
network, passes no variable, names no model and sets no price; ``ignored`` says what was
left out, so the caller can say so in one line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lodger.engine.budgets import Budgets, UsageLimits
from lodger.engine.compaction import CompactionPolicy
from lodger.engine.modelsettings import settings_from_mapping
from lodger.engine.permissions import Rule
from lodger.providers.base import ModelSettings, OutputMode
from lodger.runtime.config import CONFIG_FILE, ProjectConfig, parse_config_file, servers_of
from lodger.runtime.trust import TrustStore
from lodger.substrates.sandbox.policy import SandboxPolicy, policy_from_config
from lodger.tools.mcp import McpServerConfig

__all__ = ["Project"]

#: sandbox keys an untrusted file may set: each can only make a command more confined
_NARROWING_SANDBOX_KEYS = frozenset(
    {
        "approval",
        "wall_time_s",
        "cpu_time_s",
        "memory_mb",
        "max_processes",
        "output_mb",
        "cpu_rate",
        "disk_mb",
    }
)
_CONFINED_BACKENDS = frozenset({"bubblewrap", "runsc"})


@dataclass(frozen=True, kw_only=True)
class Project:
    """A workspace and what its ``lodger.toml`` says, checked once.

    ``Project.load(workspace)`` reads ``<workspace>/lodger.toml`` (a missing file is the
    empty project); ``Project.none()`` is a session without a workspace.
    """

    workspace: Path | None = None
    trusted: bool = True
    #: the file's default model spec (None: none, or the project is untrusted)
    model: str | None = None
    #: permission rules in the order they are tried (deny, ask, allow)
    rules: tuple[Rule, ...] = ()
    #: the ``[sandbox]`` policy (None: the file has none; the tools' default applies)
    sandbox: SandboxPolicy | None = None
    mcp: tuple[McpServerConfig, ...] = ()
    max_steps: int | None = None
    #: ``[model_settings]`` (untrusted: only ``max_tokens``, a cap on every run's)
    model_settings: ModelSettings | None = None
    output_mode: OutputMode | None = None
    #: ``[limits]`` usage limits per turn (an untrusted project's only lower the run's)
    usage: UsageLimits = field(default_factory=UsageLimits)
    #: ``[budgets]``: money budgets and the price table (defaults plus the file's prices)
    budgets: Budgets = field(default_factory=Budgets)
    #: ``[compaction]`` (untrusted: without its own summary model)
    compaction: CompactionPolicy | None = None
    #: what an untrusted file asked for and was not given, one phrase each
    ignored: tuple[str, ...] = ()

    @classmethod
    def none(cls) -> Project:
        return cls()

    @classmethod
    def load(
        cls, workspace: str | Path, *, trusted: bool | None = None, trust: TrustStore | None = None
    ) -> Project:
        """The project of ``workspace``; a ``ConfigError`` names the first bad key.

        ``trusted``: apply the whole file (True), only what narrows (False), or ask the
        user's trust records (None: ``lodger trust`` recorded this exact content)."""
        root = Path(workspace).resolve()
        path = root / CONFIG_FILE
        if not path.is_file():
            return cls(workspace=root, trusted=trusted is not False)
        if trusted is None:
            trusted = (trust or TrustStore.default()).trusts(path)
        data, config = parse_config_file(path)
        table = data.get("sandbox")
        if not trusted:
            return _untrusted(root, path, config, table)
        return cls(
            workspace=root,
            model=config.model,
            rules=tuple(config.permissions.rules()),
            sandbox=None
            if table is None
            else policy_from_config(table, where=f"[sandbox] of {path}", workspace=root),
            mcp=tuple(servers_of(config, path)),
            max_steps=config.limits.max_steps,
            model_settings=_settings(config, path),
            output_mode=config.output_mode,
            usage=config.limits.usage(),
            budgets=config.budgets.budgets(),
            compaction=config.compaction.policy() if config.compaction is not None else None,
        )


def _settings(config: ProjectConfig, path: Path) -> ModelSettings | None:
    if config.model_settings is None:
        return None
    return settings_from_mapping(config.model_settings, where=f"[model_settings] of {path}")


def _untrusted(
    root: Path, path: Path, config: ProjectConfig, table: dict[str, Any] | None
) -> Project:
    """What an untrusted file may do: narrow, never widen."""
    ignored: list[str] = []
    servers_of(config, path)  # checked like a trusted file's (an unknown key is an error)
    if config.model:
        ignored.append("its model")
    if config.permissions.allow:
        ignored.append(f"{len(config.permissions.allow)} allow rule(s)")
    if config.mcp.servers:
        ignored.append(f"{len(config.mcp.servers)} MCP server(s)")
    settings = _settings(config, path)  # checked like a trusted file's
    if settings is not None:
        wider = sorted(set(settings.record() or {}) - {"max_tokens"})
        if wider:
            ignored.append("[model_settings] " + ", ".join(wider))
        settings = ModelSettings(max_tokens=settings.max_tokens)
    if config.output_mode is not None:
        ignored.append("its output_mode")
    if config.budgets.prices:  # a price of 0 would lift every budget
        ignored.append(f"{len(config.budgets.prices)} price(s) in [budgets.prices]")
    compaction = config.compaction.policy() if config.compaction is not None else None
    if compaction is not None and compaction.model is not None:
        ignored.append("its [compaction] model")  # another provider spends the user's money
        compaction = dataclasses.replace(compaction, model=None)
    narrowed = {"permissions": {"deny": config.permissions.deny, "ask": config.permissions.ask}}
    rules = tuple(ProjectConfig.model_validate(narrowed).permissions.rules())
    sandbox = None
    if table is not None:
        wider = sorted(set(table) - _NARROWING_SANDBOX_KEYS - {"backend"})
        backend = table.get("backend", "bubblewrap")
        if backend not in _CONFINED_BACKENDS:
            wider.append("backend")
        if wider:
            ignored.append("[sandbox] " + ", ".join(wider))
        kept = {k: v for k, v in table.items() if k in _NARROWING_SANDBOX_KEYS}
        if backend in _CONFINED_BACKENDS:
            kept["backend"] = backend
        policy = policy_from_config(kept, where=f"[sandbox] of {path}", workspace=root)
        sandbox = _no_looser(policy, ignored)
    return Project(
        workspace=root,
        trusted=False,
        rules=rules,
        sandbox=sandbox,
        max_steps=config.limits.max_steps,
        model_settings=settings,
        usage=config.limits.usage(),
        budgets=config.budgets.budgets(prices={}),
        compaction=compaction,
        ignored=tuple(ignored),
    )


def _no_looser(policy: SandboxPolicy, ignored: list[str]) -> SandboxPolicy:
    """``policy`` with every limit no looser than the default's."""
    default = SandboxPolicy().limits
    changes: dict[str, Any] = {}
    for name in (
        "wall_time_s",
        "cpu_time_s",
        "memory_bytes",
        "max_processes",
        "output_bytes",
        "disk_bytes",
    ):
        mine, theirs = getattr(policy.limits, name), getattr(default, name)
        if theirs is not None and (mine is None or mine > theirs):
            changes[name] = theirs
            ignored.append(f"a looser {name}")
    if not changes:
        return policy
    return dataclasses.replace(policy, limits=dataclasses.replace(policy.limits, **changes))

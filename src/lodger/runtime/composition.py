"""The one composition: a project plus explicit overrides becomes what a run binds.

Every door (``lodger run``, ``resume``, the host, ``lodger worker``, a library program
that wants its project's rules) calls :func:`compose`; none of them binds tools, sandbox
policy, MCP servers or permission rules by hand, so a rule in ``lodger.toml`` holds on
all of them alike.

>>> binding = compose(Project.load("."), Overrides(model="openai:gpt-4.1", approve_all=True))
>>> await Sessions(Storage.local(".lodger")).run("fix the test", binding=binding)

Precedence, from strongest: the overrides (flags, arguments), then the session's own
record (the model it last ran with), then the project file, then the entry point's
fallback (a worker's ``--model``). An untrusted project (``Project.load(...,
trusted=False)``) only narrows: see :mod:`lodger.runtime.project`. Model settings merge
field by field: the overrides' (``--temperature``, a host turn's ``model_settings``) over
the project's ``[model_settings]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

from lodger.engine.budgets import Budgets, UsageLimits
from lodger.engine.compaction import CompactionPolicy
from lodger.engine.permissions import Approver, PermissionPolicy
from lodger.engine.prices import DEFAULT_PRICES
from lodger.errors import ConfigError
from lodger.events import Event
from lodger.providers import make_model
from lodger.providers.base import Model, ModelSettings, OutputMode, TextSink
from lodger.runtime.builtin import workspace_tools
from lodger.runtime.config import CONFIG_FILE
from lodger.runtime.project import Project
from lodger.runtime.sessions import Binding
from lodger.runtime.subagents.policy import SubagentPolicy
from lodger.substrates.codemode import Language
from lodger.substrates.sandbox.policy import SandboxPolicy
from lodger.tools._mcp_credentials import CredentialStore
from lodger.tools.mcp import McpServerConfig
from lodger.tools.spec import Elicitor, Tool

__all__ = [
    "DEFAULT_MAX_STEPS",
    "MODEL_ENVVAR",
    "Overrides",
    "bound_tools",
    "compose",
    "model_spec_for",
]

DEFAULT_MAX_STEPS = 50
MODEL_ENVVAR = "LODGER_MODEL"


@dataclass(frozen=True, kw_only=True)
class Overrides:
    """What an entry point sets on top of the project: its flags and its callbacks."""

    #: the model asked for (a ``Model``, or a spec such as ``openai:gpt-4.1``)
    model: Model | str | None = None
    #: the model the session last ran with (from its log or the control plane's index)
    recorded_model: str | None = None
    #: used when nothing else names a model (a worker's ``--model``, a host's first)
    fallback_model: str | None = None
    #: tools bound besides the workspace's built-in ones (``--tools FILE.py``)
    tools: Sequence[Tool] = ()
    #: bind the built-in workspace tools (file tools, shell, run_python)
    builtin_tools: bool = True
    #: MCP servers besides the project's; one of the same name replaces the project's
    mcp: Sequence[McpServerConfig] = ()
    #: where OAuth MCP servers without a store of their own keep their logins (a
    #: worker's sealed control-plane store); None: the keyring or the user's config dir
    mcp_logins: CredentialStore | None = None
    #: the sandbox policy instead of the project's ``[sandbox]``
    sandbox: SandboxPolicy | None = None
    approve_all: bool = False
    approver: Approver | None = None
    #: answers MCP servers' questions (``lodger run``: the terminal; the host: its inbox)
    elicitor: Elicitor | None = None
    max_steps: int | None = None
    #: usage limits per turn; a field set here wins over the project's ``[limits]``
    usage: UsageLimits | None = None
    #: money budgets; an amount set here wins over the project's ``[budgets]``, and
    #: the project's prices are added to these budgets' price table
    budgets: Budgets | None = None
    code_mode: Language | None = None
    subagents: SubagentPolicy | None = None
    #: model settings over the project's ``[model_settings]``, field by field
    model_settings: ModelSettings | None = None
    output_mode: OutputMode | None = None
    #: the compaction policy instead of the project's ``[compaction]``
    compaction: CompactionPolicy | None = None
    #: the permission mode a new turn starts in (``lodger run --mode``)
    permission_mode: str | None = None
    on_event: Callable[[Event], None] | None = None
    on_text: TextSink | None = None


def model_spec_for(project: Project, overrides: Overrides) -> str | None:
    """The model spec a run would use (None when a ``Model`` object is given or none is
    named anywhere)."""
    if isinstance(overrides.model, str) and overrides.model:
        return overrides.model
    if overrides.model is not None:
        return None
    return overrides.recorded_model or project.model or overrides.fallback_model or None


def compose(project: Project, overrides: Overrides | None = None) -> Binding:
    """What one run binds: model, tools, MCP servers, workspace, permissions, limits."""
    overrides = overrides or Overrides()
    model = _model(project, overrides)
    tools, servers = bound_tools(project, overrides)
    return Binding(
        model=model,
        tools=tools,
        mcp=servers,
        workspace=project.workspace,
        permissions=PermissionPolicy(list(project.rules), approve_all=overrides.approve_all),
        approver=overrides.approver,
        elicitor=overrides.elicitor,
        max_steps=_max_steps(project, overrides),
        usage=_usage(project, overrides),
        budgets=_budgets(project, overrides),
        on_event=overrides.on_event,
        on_text=overrides.on_text,
        code_mode=overrides.code_mode,
        subagents=overrides.subagents,
        model_settings=_model_settings(project, overrides),
        output_mode=overrides.output_mode or project.output_mode,
        compaction=overrides.compaction or project.compaction,
        permission_mode=overrides.permission_mode,
    )


def bound_tools(
    project: Project, overrides: Overrides | None = None
) -> tuple[list[Tool], tuple[McpServerConfig, ...]]:
    """The tools a run of ``project`` binds and the MCP servers it starts (whose tools
    join them once connected): what ``compose`` binds, and ``lodger tools list`` shows."""
    overrides = overrides or Overrides()
    tools: list[Tool] = []
    if overrides.builtin_tools and project.workspace is not None:
        tools.extend(workspace_tools(sandbox=overrides.sandbox or project.sandbox))
    tools.extend(overrides.tools)
    servers = {config.name: config for config in project.mcp}
    servers.update((config.name, config) for config in overrides.mcp)
    return tools, tuple(_with_logins(c, overrides.mcp_logins) for c in servers.values())


def _with_logins(config: McpServerConfig, store: CredentialStore | None) -> McpServerConfig:
    if store is None or config.auth is None or config.auth.store is not None:
        return config
    return replace(config, auth=replace(config.auth, store=store))


def _model(project: Project, overrides: Overrides) -> Model:
    if overrides.model is not None and not isinstance(overrides.model, str):
        return overrides.model
    spec = model_spec_for(project, overrides)
    if not spec:
        raise ConfigError(
            "no model given",
            hint=f'pass --model SPEC, set {MODEL_ENVVAR}, or set model = "..." in '
            f"{CONFIG_FILE}; `lodger demo` runs offline",
        )
    return make_model(spec)


def _usage(project: Project, overrides: Overrides) -> UsageLimits:
    given = overrides.usage
    if given is None:
        return project.usage
    if not project.trusted:
        return given.lowered(project.usage)  # an untrusted file may only lower them
    chosen = {f.name: getattr(given, f.name) for f in fields(given)}
    kept = {k: v for k, v in chosen.items() if v is not None}
    return replace(project.usage, **kept)


def _budgets(project: Project, overrides: Overrides) -> Budgets:
    given = overrides.budgets
    if given is None:
        return project.budgets
    # the project's own prices on top of the given table (an untrusted file has none)
    own = {k: v for k, v in project.budgets.prices.prices.items() if DEFAULT_PRICES.get(k) != v}
    priced = replace(given, prices=given.prices.with_prices(own))
    if not project.trusted:
        return priced.lowered(project.budgets)
    amounts = ("session_usd", "tree_usd", "daily_usd")
    kept = {n: getattr(project.budgets, n) for n in amounts if getattr(given, n) is None}
    return replace(priced, **kept)


def _max_steps(project: Project, overrides: Overrides) -> int:
    chosen = overrides.max_steps if overrides.max_steps is not None else project.max_steps
    steps = chosen if chosen is not None else DEFAULT_MAX_STEPS
    if not project.trusted and project.max_steps is not None:
        steps = min(steps, project.max_steps)  # an untrusted file may only lower it
    return steps


def _model_settings(project: Project, overrides: Overrides) -> ModelSettings | None:
    """The project's settings with the overrides' over them; an untrusted project's
    ``max_tokens`` caps whatever the overrides ask for (it may only lower it)."""
    base = project.model_settings or ModelSettings()
    settings = base.merged(overrides.model_settings)
    cap = project.model_settings.max_tokens if project.model_settings is not None else None
    if not project.trusted and cap is not None and settings.max_tokens is not None:
        settings = dataclasses.replace(settings, max_tokens=min(settings.max_tokens, cap))
    return settings if settings.record() is not None else None

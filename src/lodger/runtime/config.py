"""The project configuration, ``lodger.toml`` in the workspace, and ``--mcp`` servers.

    model = "openai:gpt-4.1"                 # the default for --model
    # or a fallback chain, tried in order (the spec "openai:gpt-4.1|anthropic:...")
    # model = ["openai:gpt-4.1", "anthropic:claude-sonnet-4-5"]
    output_mode = "tool"                     # how structured output travels (optional)

    [model_settings]                         # sent with every request; lodger run's
    temperature = 0.2                        # flags and a host turn's body override them
    max_tokens = 4000
    extra = { service_tier = "flex" }        # provider-specific, into the request body

    [permissions]                          # first match wins: deny, then ask, then allow
    allow = ["read_file", "shell(git status*)", "shell(pytest*)"]
    ask = ["write_file", "edit_file"]
    deny = ["shell(rm *)"]

A permission entry is a tool name pattern (``mcp:*`` matches a group), optionally with an
argument pattern in parentheses that one of the call's string arguments must match.
Every key is checked (a pydantic model): an unknown key anywhere is an error naming it.

    [mcp.servers.git]                      # stdio: a command the runtime starts
    command = "mcp-server-git"
    args = ["--repository", "."]
    env = { GIT_AUTHOR_NAME = "lodger" }   # added to a minimal environment (PATH, HOME, ...)
    approval = ["git_commit", "git_reset"] # true (every tool asks), false, or tool patterns
    timeout_s = 30                         # per call; default 60
    deferred = true                        # the default: found through tool_search

    [mcp.servers.docs]                     # streamable HTTP
    url = "http://127.0.0.1:8000/mcp"
    headers = { Authorization = "Bearer ${DOCS_TOKEN}" }

    [mcp.servers.linear]                   # streamable HTTP with an OAuth 2.1 login
    url = "https://mcp.linear.app/mcp"
    oauth = true                           # or { client_id = "...", client_secret =
                                           #      "${LINEAR_SECRET}", redirect_port = 8765 }

``${NAME}`` in ``env`` and ``headers`` values is read from the environment, so secrets
stay out of the file. On the command line, ``--mcp 'NAME=COMMAND ARGS...'`` (split like a
shell would) or ``--mcp NAME=http://...`` adds a server with the defaults, replacing a
file entry of the same name. Stdio servers start in the workspace unless ``cwd`` is set.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from lodger.engine.budgets import Budgets, UsageLimits
from lodger.engine.compaction import DEFAULT_SECTIONS, CompactionPolicy
from lodger.engine.prices import ModelPrice, PriceTable
from lodger.errors import ConfigError
from lodger.substrates.sandbox.policy import SandboxPolicy, expand_variables, policy_from_config
from lodger.tools._mcp_oauth import McpOAuth
from lodger.tools.mcp import McpServerConfig, tools_from_definitions
from lodger.tools.policy import Decision, Rule
from lodger.tools.spec import Tool

__all__ = [
    "CONFIG_FILE",
    "BudgetsConfig",
    "CompactionConfig",
    "LimitsConfig",
    "PermissionsConfig",
    "PriceConfig",
    "ProjectConfig",
    "load_catalog",
    "load_mcp_servers",
    "load_project_config",
    "load_sandbox_policy",
    "parse_config_file",
    "parse_mcp_option",
    "read_config_file",
    "servers_of",
]

CONFIG_FILE = "lodger.toml"

_KEYS: dict[str, type | tuple[type, ...]] = {
    "command": str,
    "args": list,
    "env": dict,
    "cwd": str,
    "url": str,
    "headers": dict,
    "deferred": bool,
    "approval": (bool, list),
    "timeout_s": (int, float),
    "connect_timeout_s": (int, float),
    "max_message_bytes": int,
    "elicitation": str,
    "elicitation_timeout_s": (int, float),
    "sampling": str,
    "max_samplings": int,
    "sampling_max_tokens": int,
    "roots": bool,
    "oauth": (bool, dict),
}


def _strings(value: Any, where: str, *, expand: bool = False) -> dict[str, str] | list[str]:
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} must be a list of strings")
        return list(value)
    if not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"{where} must be a table of strings")
    return {k: expand_variables(v, f"{where}.{k}") if expand else v for k, v in value.items()}


def server_from_table(
    name: str, table: Mapping[str, Any], *, where: str, base: Path | None = None
) -> McpServerConfig:
    """One ``[mcp.servers.NAME]`` table as a server config; unknown keys are errors."""
    for key, value in table.items():
        expected = _KEYS.get(key)
        if expected is None:
            raise ConfigError(
                f"unknown key {key!r} in {where}",
                hint="known keys: " + ", ".join(sorted(_KEYS)),
            )
        if not isinstance(value, expected) or (
            isinstance(value, bool) and expected in ((int, float), int)
        ):
            raise ConfigError(f"{where}.{key} has the wrong type ({type(value).__name__})")
    options: dict[str, Any] = {k: v for k, v in table.items() if k in _KEYS}
    for key in ("args", "env", "headers"):
        if key in options:
            value = _strings(options[key], f"{where}.{key}", expand=key != "args")
            options[key] = tuple(value) if key == "args" else value
    if isinstance(options.get("approval"), list):
        options["approval"] = tuple(_strings(options["approval"], f"{where}.approval"))
    if "cwd" in options and base is not None:
        options["cwd"] = str((base / options["cwd"]).resolve())
    elif "command" in options and base is not None:
        options["cwd"] = str(base)
    for key in ("timeout_s", "connect_timeout_s", "elicitation_timeout_s"):
        if key in options:
            options[key] = float(options[key])
    oauth = options.pop("oauth", False)
    if oauth is not False:
        options["auth"] = oauth_from_table({} if oauth is True else oauth, where=f"{where}.oauth")
    return McpServerConfig(name=name, **options)


_OAUTH_KEYS: dict[str, type | tuple[type, ...]] = {
    "client_id": str,
    "client_secret": str,
    "scopes": list,
    "redirect_port": int,
    "allowed_origins": list,
    "client_name": str,
}
_VARIABLE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$")


def oauth_from_table(table: Mapping[str, Any], *, where: str) -> McpOAuth:
    """``oauth = true`` or ``oauth = { ... }`` of a server table: the client's secret must
    be a ``${VARIABLE}`` (read from the environment), never a value in the file."""
    for key, value in table.items():
        expected = _OAUTH_KEYS.get(key)
        if expected is None:
            raise ConfigError(
                f"unknown key {key!r} in {where}", hint="known keys: " + ", ".join(_OAUTH_KEYS)
            )
        if not isinstance(value, expected) or isinstance(value, bool):
            raise ConfigError(f"{where}.{key} has the wrong type ({type(value).__name__})")
    options: dict[str, Any] = dict(table)
    secret = options.get("client_secret")
    if secret is not None:
        if not _VARIABLE.match(secret):
            raise ConfigError(
                f"{where}.client_secret is written in the file; lodger reads a client "
                "secret only from the environment",
                hint='write client_secret = "${NAME_OF_A_VARIABLE}" and set that variable',
            )
        options["client_secret"] = expand_variables(secret, f"{where}.client_secret")
    for key in ("scopes", "allowed_origins"):
        if key in options:
            options[key] = tuple(_strings(options[key], f"{where}.{key}"))
    return McpOAuth(**options)


def _read_text(path: Path, what: str) -> str:
    """A configuration file's text; a file that is unreadable or not UTF-8 is a ConfigError."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
            hint="save it as UTF-8",
        ) from None


def _too_deep(what: str, path: Path) -> ConfigError:
    # The TOML and JSON parsers recurse once per nested array or table.
    return ConfigError(
        f"{what} {path} is nested too deeply to read",
        hint="configuration nests a few levels deep; check the file for runaway brackets",
    )


_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


class PermissionsConfig(BaseModel):
    """``[permissions]``: tool patterns (``name`` or ``name(argument pattern)``)."""

    model_config = _STRICT
    allow: list[str] = []
    ask: list[str] = []
    deny: list[str] = []

    def rules(self) -> list[Rule]:
        """Deny first, then ask, then allow: a deny always wins over a broader allow."""
        order: tuple[tuple[Decision, list[str]], ...] = (
            ("deny", self.deny),
            ("ask", self.ask),
            ("allow", self.allow),
        )
        return [Rule.parse(text, decision) for decision, texts in order for text in texts]


class McpConfig(BaseModel):
    model_config = _STRICT
    #: each server's table is checked by ``server_from_table`` (its own key list)
    servers: dict[str, dict[str, Any]] = {}


class LimitsConfig(BaseModel):
    """``[limits]``: bounds on one turn (the usage limits: ``lodger.engine.budgets``)."""

    model_config = _STRICT
    max_steps: int | None = None
    request_limit: int | None = None
    input_tokens_limit: int | None = None
    output_tokens_limit: int | None = None
    total_tokens_limit: int | None = None
    tool_calls_limit: int | None = None

    def usage(self) -> UsageLimits:
        return UsageLimits(
            request_limit=self.request_limit,
            input_tokens_limit=self.input_tokens_limit,
            output_tokens_limit=self.output_tokens_limit,
            total_tokens_limit=self.total_tokens_limit,
            tool_calls_limit=self.tool_calls_limit,
        )


class CompactionConfig(BaseModel):
    """``[compaction]``: when and how the context is compacted (``lodger.engine.compaction``)."""

    model_config = _STRICT
    model: str | None = None
    threshold_tokens: int | None = None
    budget_tokens: int | None = None
    required_sections: list[str] | None = None
    max_attempts: int = 2
    max_per_turn: int = 20
    instructions: str = ""

    def policy(self) -> CompactionPolicy:
        """The policy (a ``ConfigError`` names what is out of range)."""
        sections = DEFAULT_SECTIONS if self.required_sections is None else self.required_sections
        return CompactionPolicy(
            model=self.model or None,
            threshold_tokens=self.threshold_tokens,
            budget_tokens=self.budget_tokens,
            required_sections=tuple(sections),
            max_attempts=self.max_attempts,
            max_per_turn=self.max_per_turn,
            instructions=self.instructions,
        )


class PriceConfig(BaseModel):
    """``[budgets.prices."SPEC"]``: USD per million tokens."""

    model_config = _STRICT
    input: float
    cached_input: float | None = None
    output: float
    cache_write: float | None = None

    def price(self) -> ModelPrice:
        cached = self.input if self.cached_input is None else self.cached_input
        return ModelPrice.of(self.input, cached, self.output, self.cache_write)


class BudgetsConfig(BaseModel):
    """``[budgets]``: money budgets in USD, and prices added to the default table."""

    model_config = _STRICT
    session_usd: float | None = None
    tree_usd: float | None = None
    daily_usd: float | None = None
    prices: dict[str, PriceConfig] = {}

    def budgets(self, prices: Mapping[str, ModelPrice] | None = None) -> Budgets:
        """The budgets, priced with the defaults plus ``prices`` (None: this table's)."""
        own = {spec: p.price() for spec, p in self.prices.items()} if prices is None else prices
        return Budgets(
            session_usd=self.session_usd,
            tree_usd=self.tree_usd,
            daily_usd=self.daily_usd,
            prices=PriceTable.defaults().with_prices(own),
        )


class ProjectConfig(BaseModel):
    """A whole ``lodger.toml``."""

    model_config = _STRICT
    #: a spec; a list of specs in the file is a fallback chain, read as one spec ``a|b``
    model: str | None = None
    permissions: PermissionsConfig = PermissionsConfig()
    mcp: McpConfig = McpConfig()
    limits: LimitsConfig = LimitsConfig()
    #: ``[model_settings]``: temperature, max_tokens, ... (checked by
    #: ``lodger.engine.modelsettings.settings_from_mapping``)
    model_settings: dict[str, Any] | None = None
    #: how the output schema travels: ``native``, ``tool`` or ``prompted``
    output_mode: Literal["native", "tool", "prompted"] | None = None
    budgets: BudgetsConfig = BudgetsConfig()
    compaction: CompactionConfig | None = None
    # checked key by key by ``load_sandbox_policy`` (``lodger.substrates.sandbox.policy``)
    sandbox: dict[str, Any] | None = None

    @field_validator("model", mode="before")
    @classmethod
    def _chain(cls, value: Any) -> Any:
        """A list of specs is a fallback chain: one spec, the entries joined by ``|``."""
        if not isinstance(value, list):
            return value
        if not value or not all(isinstance(spec, str) and spec.strip() for spec in value):
            raise ValueError("a fallback list needs one or more model specs, none of them empty")
        if any("|" in spec for spec in value):
            raise ValueError("an entry of the fallback list holds '|': write one model per entry")
        return "|".join(spec.strip() for spec in value)


def load_project_config(path: Path) -> ProjectConfig:
    """``lodger.toml`` checked key by key; a missing file is the empty configuration."""
    if not path.is_file():
        return ProjectConfig()
    return _project_config(path)


def _project_config(path: Path) -> ProjectConfig:
    return parse_config_file(path)[1]


def _toml(path: Path) -> dict[str, Any]:
    text = _read_text(path, "configuration file")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise _too_deep("configuration file", path) from None


def parse_config_file(path: Path) -> tuple[dict[str, Any], ProjectConfig]:
    """A ``lodger.toml`` read once: its raw tables and the checked configuration (the
    ``[sandbox]`` and ``[mcp.servers.*]`` tables are checked by their own readers)."""
    data = _toml(path)
    try:
        config = ProjectConfig.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        if error["type"] == "extra_forbidden":
            raise ConfigError(
                f"unknown key {where!r} in {path}",
                hint="known keys: model, output_mode, [model_settings], [permissions] "
                "allow/ask/deny, [sandbox], "
                "[mcp.servers.NAME], [limits] max_steps/request_limit/input_tokens_limit/"
                "output_tokens_limit/total_tokens_limit/tool_calls_limit, [budgets] "
                'session_usd/tree_usd/daily_usd, [budgets.prices."SPEC"] '
                "input/cached_input/output/cache_write, [compaction] model/threshold_tokens/"
                "budget_tokens/required_sections/max_attempts/max_per_turn/instructions",
            ) from None
        raise ConfigError(f"{where} in {path}: {error['msg']}") from None
    steps = config.limits.max_steps
    if steps is not None and steps < 1:
        raise ConfigError(f"limits.max_steps in {path} must be at least 1, not {steps}")
    try:  # the same checks as the library's (whole numbers and amounts >= 0, prices)
        config.limits.usage()
        config.budgets.budgets()
        if config.compaction is not None:
            config.compaction.policy()
    except ConfigError as exc:
        raise ConfigError(
            f"[limits], [budgets] or [compaction] in {path}: {exc.message}",
            hint=exc.hint,
            code=exc.code,
        ) from None
    return data, config


def read_config_file(path: Path) -> list[McpServerConfig]:
    """The MCP servers of a ``lodger.toml``; stdio servers start in its directory."""
    return servers_of(_project_config(path), path)


def servers_of(config: ProjectConfig, path: Path) -> list[McpServerConfig]:
    """The ``[mcp.servers.*]`` of a checked ``lodger.toml`` at ``path``."""
    servers = config.mcp.servers
    out = []
    for name, table in servers.items():
        where = f"[mcp.servers.{name}] of {path}"
        if not isinstance(table, dict):
            raise ConfigError(f"{where} must be a table")
        out.append(server_from_table(name, table, where=where, base=path.parent.resolve()))
    return out


def load_sandbox_policy(workspace: Path) -> SandboxPolicy | None:
    """The ``[sandbox]`` table of ``<workspace>/lodger.toml``
    (``lodger.substrates.sandbox.policy``); None when there is no file or no table."""
    path = workspace / CONFIG_FILE
    if not path.is_file():
        return None
    table = _toml(path).get("sandbox")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"[sandbox] in {path} must be a table")
    return policy_from_config(table, where=f"[sandbox] of {path}", workspace=workspace)


def parse_mcp_option(spec: str, *, base: Path | None = None) -> McpServerConfig:
    """``NAME=COMMAND ARGS...`` (stdio) or ``NAME=http(s)://...`` (streamable HTTP)."""
    name, sep, value = spec.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise ConfigError(
            f"--mcp {spec!r} is not NAME=COMMAND or NAME=URL",
            hint="e.g. --mcp 'git=mcp-server-git --repository .' or "
            "--mcp docs=http://127.0.0.1:8000/mcp",
        )
    name, value = name.strip(), value.strip()
    if value.startswith(("http://", "https://")):
        return McpServerConfig(name=name, url=value)
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise ConfigError(f"--mcp {spec!r}: {exc}") from None
    cwd = str(base) if base is not None else None
    return McpServerConfig(name=name, command=words[0], args=tuple(words[1:]), cwd=cwd)


def load_mcp_servers(
    workspace: Path, options: Sequence[str] = (), *, config_file: Path | None = None
) -> list[McpServerConfig]:
    """The workspace's ``lodger.toml`` servers (if the file exists), then ``--mcp`` ones;
    a ``--mcp`` server replaces a file entry of the same name."""
    path = config_file or workspace / CONFIG_FILE
    servers = {c.name: c for c in read_config_file(path)} if path.is_file() else {}
    for spec in options:
        config = parse_mcp_option(spec, base=workspace.resolve())
        servers[config.name] = config
    return list(servers.values())


def load_catalog(path: Path) -> list[Tool]:
    """Tools from a JSON list in MCP ``tools/list`` form (``name``, ``description``,
    ``inputSchema``, optional ``group``): deferred, searchable, never callable."""
    text = _read_text(path, "catalog")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"catalog {path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise _too_deep("catalog", path) from None
    if not isinstance(data, list):
        raise ConfigError(f"catalog {path} must be a JSON list of tool definitions")
    for n, entry in enumerate(data):
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and isinstance(entry.get("description", ""), str)
            and isinstance(entry.get("inputSchema", {}), dict)
            and isinstance(entry.get("group", ""), str)
        ):
            raise ConfigError(
                f"entry {n} of catalog {path} is not a tool definition",
                hint='each entry is {"name": ..., "description": ..., "inputSchema": {...}}',
            )
    return tools_from_definitions(data)

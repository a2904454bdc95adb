"""``lodger tools list`` and ``lodger tools search``: what a run would bind, and what
``tool_search`` would find, for operators and for evaluating catalogs offline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.table import Table
from rich.text import Text

from lodger.cli._common import echo_json, json_option, make_console, state_option
from lodger.cli._toolsfile import load_tools_file
from lodger.errors import UsageError
from lodger.runtime.composition import Overrides, bound_tools
from lodger.runtime.config import CONFIG_FILE, load_catalog, parse_mcp_option
from lodger.runtime.project import Project
from lodger.substrates.sandbox.policy import SandboxPolicy
from lodger.tools.mcp import McpServers
from lodger.tools.registry import ToolRegistry
from lodger.tools.search import ToolSearch, attach_tool_search
from lodger.tools.spec import Tool

__all__ = ["COMMANDS", "mcp_option", "tools"]

F = TypeVar("F", bound=Callable[..., Any])


def mcp_option(fn: F) -> F:
    """``--mcp NAME=COMMAND...`` / ``--mcp NAME=URL`` (repeatable)."""
    option = click.option(
        "--mcp",
        "mcp_specs",
        multiple=True,
        metavar="NAME=CMD|URL",
        help=f"Connect an MCP server: 'NAME=COMMAND ARGS...' (stdio) or NAME=http://... "
        f"(streamable HTTP); repeatable; adds to [mcp.servers] of {CONFIG_FILE}.",
    )
    return option(fn)


def _bound(
    workspace: Path, specs: Sequence[str], catalogs: Sequence[Path], files: Sequence[str] = ()
) -> tuple[ToolRegistry, ToolSearch | None]:
    base = workspace.resolve()
    # what a run in this workspace binds: the one composition, without a model
    builtin, configs = bound_tools(
        Project.load(workspace),
        Overrides(
            tools=[tool for path in files for tool in load_tools_file(path)],
            mcp=[parse_mcp_option(spec, base=base) for spec in specs],
        ),
    )

    async def listed() -> list[Tool]:
        if not configs:
            return []
        async with McpServers(configs) as servers:
            return servers.tools()

    bound: list[Tool] = [*builtin, *asyncio.run(listed())]
    for catalog in catalogs:
        bound.extend(load_catalog(catalog))
    registry = ToolRegistry(bound)
    return registry, attach_tool_search(registry)


def _common(fn: F) -> F:
    fn = click.option(
        "--tools",
        "tools_files",
        multiple=True,
        metavar="FILE.py",
        help="Add the @tool functions of a Python file, as `lodger run --tools` binds them "
        "(the file is imported: its top-level code runs); repeatable.",
    )(fn)
    fn = click.option(
        "--catalog",
        "catalogs",
        multiple=True,
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        metavar="FILE.json",
        help="Add tool definitions in MCP tools/list form (name, description, inputSchema, "
        "group), searchable without their servers; repeatable.",
    )(fn)
    fn = click.option(
        "--workspace",
        type=click.Path(file_okay=False, exists=True, path_type=Path),
        default=".",
        show_default=True,
        help=f"Directory whose {CONFIG_FILE} configures MCP servers.",
    )(fn)
    # --state like every command, so scripts and LODGER_STATE work; these read no log.
    return state_option(json_option(mcp_option(fn)))


@click.group()
def tools() -> None:
    """Inspect the tools a run binds and what tool_search finds among them.

    \b
    Example:
      lodger tools list --mcp 'time=mcp-server-time'
      lodger tools search "create a github issue" --catalog tests/data/mcp_catalog.json
    """


@tools.command("list")
@_common
def list_tools(
    mcp_specs: tuple[str, ...],
    workspace: Path,
    catalogs: tuple[Path, ...],
    tools_files: tuple[str, ...],
    as_json: bool,
    state: str,
) -> None:
    """List bound tools: tier (direct or deferred), group and schema size in bytes.

    Direct tools' schemas are sent on every step; deferred tools only as names in the
    inventory until tool_search loads them. MCP servers come from lodger.toml in the
    workspace and --mcp; they are started to list their tools, then stopped. --tools
    adds a file's @tool functions, as `lodger run --tools` does.

    \b
    Example:
      lodger tools list --mcp 'time=mcp-server-time'
      lodger tools list --tools tools.py
      lodger tools list --catalog tests/data/mcp_catalog.json --json
    """
    registry, search = _bound(workspace, mcp_specs, catalogs, tools_files)
    rows = [
        {
            "name": t.name,
            "tier": "deferred" if t.deferred else "direct",
            "group": t.group,
            "schema_bytes": t.schema_size(),
            "description": " ".join(t.description.split()),
        }
        for t in registry
    ]
    inventory = search.inventory() if search is not None else ""
    summary = {
        tier: {
            "count": sum(1 for r in rows if r["tier"] == tier),
            "schema_bytes": sum(int(r["schema_bytes"]) for r in rows if r["tier"] == tier),
        }
        for tier in ("direct", "deferred")
    }
    summary["deferred"]["inventory_bytes"] = len(inventory.encode())
    policy = Project.load(workspace).sandbox or SandboxPolicy()
    sandboxed = [t.name for t in registry if t.group == "shell"]
    sandbox = {
        "backend": policy.backend,
        "approval": policy.approval or not policy.confined,
        "limits": policy.limits.describe(),
        "network": policy.network.describe(),
        "env": list(policy.env),
        "git_writable": policy.git_writable or not policy.confined,
        "tools": sandboxed,
    }
    if as_json:
        echo_json({"tools": rows, "summary": summary, "sandbox": sandbox})
        return
    table = Table(box=None, header_style="bold")
    for column in ("name", "tier", "group", "schema bytes"):
        table.add_column(column, justify="right" if column == "schema bytes" else "left")
    for r in rows:
        table.add_row(str(r["name"]), str(r["tier"]), str(r["group"]), str(r["schema_bytes"]))
    console = make_console()
    console.print(table)
    direct, deferred = summary["direct"], summary["deferred"]
    console.print(
        f"{len(rows)} tools: {direct['count']} direct ({direct['schema_bytes']} bytes of "
        f"schema on every step), {deferred['count']} deferred ({deferred['schema_bytes']} "
        f"bytes of schema, {deferred['inventory_bytes']} bytes of inventory)"
    )
    console.print(
        f"sandbox for {', '.join(sandboxed)}: {policy.describe()}"
        + ("; asks for approval" if sandbox["approval"] else ""),
        soft_wrap=True,
    )


@tools.command("search")
@click.argument("query")
@click.option("--limit", default=10, show_default=True, help="Show the N best matches.")
@_common
def search_tools(
    query: str,
    limit: int,
    mcp_specs: tuple[str, ...],
    workspace: Path,
    catalogs: tuple[Path, ...],
    tools_files: tuple[str, ...],
    as_json: bool,
    state: str,
) -> None:
    """Rank the deferred tools for QUERY as tool_search does, with scores.

    "activates" marks what one tool_search call would load (at most 5 tools and 24,000
    bytes of schema, the best match always). QUERY may be select:NAME1,NAME2.

    \b
    Example:
      lodger tools search "take a screenshot of the page" --catalog tests/data/mcp_catalog.json
      lodger tools search "select:time__convert_time" --mcp 'time=mcp-server-time' --json
    """
    if limit < 1:
        raise UsageError("--limit must be at least 1")
    _, search = _bound(workspace, mcp_specs, catalogs, tools_files)
    if search is None:
        raise UsageError(
            "no deferred tools are bound, so there is nothing to search",
            hint=f"pass --mcp or --catalog, or configure [mcp.servers] in {CONFIG_FILE}",
        )
    activated, _, _ = search.choose(query)
    loads = {t.name for t in activated}
    hits: list[tuple[Tool, float | None]]
    if query.strip().startswith("select:"):
        hits = [(t, None) for t in activated]
    else:
        hits = [(h.tool, h.score) for h in search.index().search(query, limit=limit)]
    rows = [
        {
            "rank": rank,
            "name": t.name,
            "group": t.group,
            "score": None if score is None else round(score, 4),
            "activates": t.name in loads,
            "schema_bytes": t.schema_size(),
            "description": " ".join(t.description.split()),
        }
        for rank, (t, score) in enumerate(hits, start=1)
    ]
    if as_json:
        from lodger.tools.ranking import tokenize

        echo_json({"query": query, "terms": tokenize(query), "results": rows})
        return
    console = make_console()
    if not rows:
        console.print(f"no deferred tool matches {query!r}")
        return
    # Two lines a tool (the ranked name, then its description) read at any width.
    for r in rows:
        score = "" if r["score"] is None else f"{r['score']:.3f}"
        line = Text(f"{r['rank']:>2}  {score:>7}  ")
        line.append(str(r["name"]), style="bold")
        line.append(f"  [{r['group']}]")
        if r["activates"]:
            line.append("  loads", style="green")
        console.print(line, soft_wrap=True)
        description = str(r["description"])
        room = max(console.width - 13, 20)
        if len(description) > room:
            description = description[: room - 3] + "..."
        console.print(Text(" " * 13 + description, style="dim"), soft_wrap=True)


COMMANDS = (tools,)

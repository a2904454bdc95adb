"""MkDocs hooks: the reference pages generated at build time, never written twice.

- ``reference/cli.md``: every ``lodger`` command's ``--help``, walked from the click group.
- ``reference/http.md``: every operation of ``docs/openapi.json`` (no JavaScript, no CDN).
- ``reference/events.md``: every event kind of ``lodger.events``: its fields and docstring.
- ``reference/tools.md``: every built-in tool, from the tools themselves: name, options,
  description and a table of its parameters from its JSON schema.
- ``benchmarks/results.md``: the recorded runs of ``bench/results/*.jsonl``.

mkdocs.yml names this file under ``hooks:``; ``mkdocs build --strict`` runs it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import typing
from pathlib import Path
from typing import Any

import click
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


# ---------------------------------------------------------------- CLI


def _commands(group: click.Group, ctx: click.Context) -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        found.append((name, command))
    return found


def _cli_section(command: click.Command, path: list[str], parent: click.Context | None) -> str:
    ctx = click.Context(command, info_name=path[-1], parent=parent, terminal_width=88)
    ctx.max_content_width = 88
    text = command.get_help(ctx)
    level = "#" * min(len(path) + 1, 4)
    out = [f"{level} `{' '.join(path)}`", "", "```text", text, "```", ""]
    if isinstance(command, click.Group):
        for name, sub in _commands(command, ctx):
            out.append(_cli_section(sub, [*path, name], ctx))
    return "\n".join(out)


def render_cli() -> str:
    from lodger.cli import main

    head = [
        "# CLI reference",
        "",
        "Generated at build time from `lodger --help` and each command's `--help`",
        "(the click group in `lodger.cli`).",
        "For a guided tour see [the CLI guide](../guides/cli.md).",
        "",
    ]
    return "\n".join(head) + _cli_section(main, ["lodger"], None)


# ---------------------------------------------------------------- HTTP


def _schema_text(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#schema-{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_schema_text(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_schema_text(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    return f"`{schema.get('type', 'any')}`"


def _md(text: str) -> str:
    return text.replace("``", "`").strip()


def _operation(method: str, path: str, op: dict[str, Any]) -> list[str]:
    out = [f"### {method.upper()} `{path}`", ""]
    if op.get("summary"):
        out += [f"*{op['summary']}*", ""]
    if op.get("description"):
        out += [_md(op["description"]), ""]
    params = op.get("parameters", [])
    if params:
        out += ["| parameter | in | required | type |", "|---|---|---|---|"]
        for p in params:
            required = "yes" if p.get("required") else "no"
            out.append(f"| `{p['name']}` | {p['in']} | {required} | {_schema_text(p['schema'])} |")
        out.append("")
    for media, body in op.get("requestBody", {}).get("content", {}).items():
        out += [f"Request body (`{media}`): {_schema_text(body.get('schema', {}))}", ""]
    out += ["| status | meaning | body |", "|---|---|---|"]
    for status, response in op.get("responses", {}).items():
        bodies = [
            f"{_schema_text(c.get('schema', {}))} (`{media}`)"
            for media, c in response.get("content", {}).items()
        ]
        meaning = _md(response.get("description", "")).replace("\n", " ")
        out.append(f"| {status} | {meaning} | {', '.join(bodies) or '-'} |")
    return [*out, ""]


def _schema_section(name: str, schema: dict[str, Any]) -> list[str]:
    out = [f"### {name} {{#schema-{name.lower()}}}", ""]
    if schema.get("description"):
        out += [_md(schema["description"]), ""]
    props = schema.get("properties", {})
    if props:
        required = set(schema.get("required", []))
        out += ["| field | type | required | description |", "|---|---|---|---|"]
        for field, spec in props.items():
            desc = _md(spec.get("description", "")).replace("\n", " ")
            need = "yes" if field in required else "no"
            out.append(f"| `{field}` | {_schema_text(spec)} | {need} | {desc} |")
    elif "enum" in schema:
        out.append(f"One of {_schema_text(schema)}.")
    return [*out, ""]


def render_http(document: dict[str, Any]) -> str:
    info = document["info"]
    out = [
        "# HTTP API reference",
        "",
        f"Generated at build time from `docs/openapi.json` ({info['title']}, version",
        f"{info['version']}; OpenAPI {document['openapi']}). {_md(info.get('description', ''))}",
        "The document itself is served with the site: [openapi.json](../openapi.json).",
        "For how the host runs turns, see [the HTTP host guide](../guides/host.md).",
        "",
        "## Operations",
        "",
    ]
    for path, item in document["paths"].items():
        for method, op in item.items():
            out += _operation(method, path, op)
    out += ["## Schemas", ""]
    for name, schema in sorted(document.get("components", {}).get("schemas", {}).items()):
        out += _schema_section(name, schema)
    return "\n".join(out)


# ---------------------------------------------------------------- events


def _type_text(annotation: Any) -> str:
    text = repr(annotation) if not isinstance(annotation, type) else annotation.__name__
    return text.replace("typing.", "").replace("lodger.events.", "").replace("|", "\\|")


def render_events() -> str:
    from pydantic import BaseModel

    import lodger.events as events

    body_types = typing.get_args(typing.get_args(events.Body)[0])
    out = [
        "# Event kinds",
        "",
        "Generated at build time from the event models in `lodger.events`.",
        f"The schema version is **{events.SCHEMA_VERSION}**. Every event has an envelope",
        "(session, offset, turn, run, step, call, digest) and a `body` whose `kind` is one of",
        "the kinds below. Models are frozen and closed: an unknown kind or field fails decoding.",
        "",
        "## Schema changelog",
        "",
        "```text",
        "\n".join(f"{v}  {line}" for v, line in sorted(events.SCHEMA_CHANGELOG.items())),
        "```",
        "",
    ]
    out += ["## The envelope", "", "`lodger.events.Event`", ""]
    out += _fields(events.Event)
    for model in body_types:
        kind = model.model_fields["kind"].default
        out += [f"## `{kind}`", "", f"`lodger.events.{model.__name__}`", ""]
        if model.__doc__ and model.__doc__ is not BaseModel.__doc__:
            out += [_md(" ".join(model.__doc__.split())), ""]
        out += _fields(model)
    return "\n".join(out)


def _fields(model: Any) -> list[str]:
    out = ["| field | type | default |", "|---|---|---|"]
    for name, field in model.model_fields.items():
        if name == "kind":
            continue
        if field.is_required():
            default = "required"
        elif field.default_factory is not None:
            default = f"`{field.default_factory()!r}`"
        else:
            default = f"`{field.get_default()!r}`"
        kind = "one of the bodies below" if name == "body" else f"`{_type_text(field.annotation)}`"
        out.append(f"| `{name}` | {kind} | {default} |")
    return [*out, ""]


# ---------------------------------------------------------------- built-in tools


def builtin_tools() -> list[tuple[str, Any]]:
    """Every tool lodger itself defines, each with where it comes from, built as a run
    builds it (``tool_search`` needs a deferred tool beside it; ``exec`` and ``delegate``
    an agent)."""
    import tempfile

    from lodger import Agent, ScriptedModel, tool
    from lodger.runtime.builtin import workspace_tools
    from lodger.runtime.subagents import SubagentPolicy
    from lodger.tools.todo import todo_tools

    @tool(deferred=True)
    def _page_example() -> None:
        """Only here so that tool_search is bound."""

    found: list[tuple[str, Any]] = []
    found += [("`lodger run`, `workspace_tools()`", t) for t in workspace_tools()]
    bound_by = {
        ("javascript", "tool_search"): "any deferred tool (`@tool(deferred=True)`, MCP tools)",
        ("javascript", "exec"): '`--code-mode`, `Agent(code_mode="javascript")`',
        ("python", "exec"): '`--code-mode python`, `Agent(code_mode="python")`',
        ("python", "delegate"): "`--subagents`, `Agent(subagents=SubagentPolicy())`",
    }
    with tempfile.TemporaryDirectory() as state:
        for language in ("javascript", "python"):
            agent = Agent(
                model=ScriptedModel([{"text": "-"}]),
                tools=[*workspace_tools(), _page_example],
                storage=state,
                code_mode=language,
                subagents=SubagentPolicy() if language == "python" else None,
            )
            agent.close_sync()
            for (lang, name), origin in bound_by.items():
                if lang == language:
                    found.append((origin, agent.registry.get(name)))
    found += [("`lodger.tools.todo.todo_tools()`", t) for t in todo_tools()]
    return found


def _param_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_param_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_param_type(schema.get('items', {}))}"
    if kind == "object" and "properties" in schema:
        return "object: " + ", ".join(schema["properties"])
    return str(kind)


_LIMITS = ("minimum", "exclusiveMinimum", "maximum", "minLength")


def _param_rows(schema: dict[str, Any], prefix: str = "") -> list[str]:
    rows: list[str] = []
    required = set(schema.get("required", []))
    for name, spec in schema.get("properties", {}).items():
        default = f"`{json.dumps(spec['default'])}`" if "default" in spec else ""
        need = "yes" if name in required else "no"
        limits = [f"{key} {spec[key]}" for key in _LIMITS if key in spec]
        desc = " ".join(str(spec.get("description", "")).split()).replace("|", "\\|")
        if limits:
            desc = f"{desc} ({', '.join(limits)})" if desc else ", ".join(limits)
        rows.append(f"| `{prefix}{name}` | {_param_type(spec)} | {need} | {default} | {desc} |")
    return rows


def _tool_section(origin: str, t: Any) -> list[str]:
    title = f"`{t.name}`"
    if t.name == "exec":
        title += " (Python)" if "Python cell" in t.description else " (JavaScript)"
    flags = [f"group `{t.group}`", f"recovery `{t.recovery}`"]
    flags += [name for name in ("nestable", "deferred", "approval") if getattr(t, name)]
    out = [f"## {title}", "", f"Bound by {origin}; {', '.join(flags)}.", ""]
    out += ["```text", t.description.strip(), "```", ""]
    schema = t.parameters
    if not schema.get("properties"):
        return [*out, "No parameters.", ""]
    out += ["| parameter | type | required | default | description |", "|---|---|---|---|---|"]
    out += _param_rows(schema)
    for name, spec in schema.get("properties", {}).items():
        item = spec.get("items", {}) if spec.get("type") == "array" else spec
        if item.get("type") == "object" and "properties" in item:
            out += _param_rows(item, prefix=f"{name}.")
    for name, spec in schema.get("$defs", {}).items():
        out += _param_rows(spec, prefix=f"{name}.")
    return [*out, ""]


def render_tools() -> str:
    out = [
        "# Built-in tools",
        "",
        "Generated at build time from the tools themselves (their descriptions and the",
        "JSON schemas the model is sent), so the argument names here are the ones a model,",
        "a `ScriptedModel` script or a `FunctionModel` must use. The workspace tools are",
        "what `lodger run` binds on `--workspace`; the others are bound by the option named",
        "with each. `exec`'s description lists the tools a cell may call, here the",
        "workspace tools. How they behave: [tools](../guides/tools.md),",
        "[code mode](../guides/code-mode.md), [sandboxes](../guides/sandboxes.md),",
        "[subagents](../guides/subagents.md).",
        "",
        "A nested parameter is shown as `parent.field` (an object's field, or the field of",
        "each item of an array).",
        "",
    ]
    for origin, t in builtin_tools():
        out += _tool_section(origin, t)
    return "\n".join(out)


# ---------------------------------------------------------------- benchmarks


def render_benchmarks() -> str:
    spec = importlib.util.spec_from_file_location("_bench_results", ROOT / "bench" / "results.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.render_markdown(module.load_results()))


# ---------------------------------------------------------------- the hook


def pages() -> dict[str, str]:
    document = json.loads((ROOT / "docs" / "openapi.json").read_text(encoding="utf-8"))
    return {
        "reference/cli.md": render_cli(),
        "reference/http.md": render_http(document),
        "reference/events.md": render_events(),
        "reference/tools.md": render_tools(),
        "benchmarks/results.md": render_benchmarks(),
    }


def on_files(files: Files, config: Any) -> Files:
    for uri, content in pages().items():
        files.append(File.generated(config, uri, content=content))
    return files

"""The generated reference pages cover everything they render from (scripts/docs_hooks.py)."""

from __future__ import annotations

import importlib.util
import json
import typing
from pathlib import Path
from types import ModuleType

import click
import pytest

import lodger.events as events
from lodger.cli import main

ROOT = Path(__file__).resolve().parents[2]


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load(ROOT / "scripts" / "docs_hooks.py", "_docs_hooks")
results = load(ROOT / "bench" / "results.py", "_bench_results")


def test_the_cli_page_has_every_command_and_subcommand() -> None:
    page = hooks.render_cli()
    ctx = click.Context(main)
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert f"## `lodger {name}`" in page
        if isinstance(command, click.Group):
            for sub in command.list_commands(click.Context(command)):
                assert f"### `lodger {name} {sub}`" in page
    assert "--state DIR" in page  # the options themselves, from --help


def test_the_http_page_has_every_operation_and_schema() -> None:
    document = json.loads((ROOT / "docs" / "openapi.json").read_text())
    page = hooks.render_http(document)
    for path, item in document["paths"].items():
        for method in item:
            assert f"### {method.upper()} `{path}`" in page
    for name in document["components"]["schemas"]:
        assert f"{{#schema-{name.lower()}}}" in page


def test_the_events_page_has_every_kind_and_field() -> None:
    page = hooks.render_events()
    for model in typing.get_args(typing.get_args(events.Body)[0]):
        assert f"## `{model.model_fields['kind'].default}`" in page
        for field in model.model_fields:
            if field != "kind":
                assert f"| `{field}` |" in page


def test_the_tools_page_has_every_builtin_tool_and_parameter() -> None:
    page = hooks.render_tools()
    tools = [t for _, t in hooks.builtin_tools()]
    names = {t.name for t in tools}
    # every tool a run binds on a workspace, and the ones options and agents add
    assert {"read_file", "write_file", "edit_file", "list_files", "grep", "shell"} <= names
    assert {"run_python", "tool_search", "exec", "delegate", "todo_write"} <= names
    for t in tools:
        assert f"## `{t.name}`" in page
        for name, spec in t.parameters.get("properties", {}).items():
            assert f"| `{name}` |" in page, (t.name, name)
            nested = spec.get("items", {}) if spec.get("type") == "array" else spec
            for field in nested.get("properties", {}):
                assert f"| `{name}.{field}` |" in page, (t.name, name, field)
    assert "| `command` | string | yes |" in page  # shell's argument, as the schema says
    assert "| `timeout_s` | number | no | `60` |" in page


def test_benchmark_results_each_show_date_machine_and_command() -> None:
    runs = results.load_results()
    assert runs
    page = results.render_markdown(runs)
    for records in runs.values():
        for record in records:
            assert f"- command: `{record['command']}`" in page
            assert f"- machine: {record['machine']}" in page


def test_a_results_line_without_its_command_is_refused(tmp_path: Path) -> None:
    line = {"bench": "x", "date": "2026-01-01", "machine": "m", "source": "s", "figures": {}}
    (tmp_path / "x.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=r"x\.jsonl:1: missing command"):
        results.load_results(tmp_path)

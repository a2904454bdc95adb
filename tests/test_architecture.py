"""The package's shape: no import cycle, the engine imports no particular tool, and every
error code is enumerated in one place."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import lodger
from lodger.errors import ERROR_CODES

SRC = Path(lodger.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """lodger modules imported when the module runs (``if TYPE_CHECKING:`` blocks skipped)."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in modules else node.module)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    visit([child])

    visit(tree.body)
    return {m for m in found if m in modules}


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    modules = set(paths)
    return {
        name: _runtime_imports(ast.parse(path.read_text(encoding="utf-8")), modules) - {name}
        for name, path in paths.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            dfs(node)
    # a package importing its own submodules is how re-exports work, not a cycle
    return [c for c in found if not all(b.startswith(c[0] + ".") for b in c[1:-1])]


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_detector_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_engine_imports_no_particular_tool_and_recovery_stays_pure() -> None:
    graph = _graph()
    for name, imports in graph.items():
        if name.startswith("lodger.engine"):
            assert not {
                i
                for i in imports
                if i.startswith("lodger.tools.")
                and i
                not in {
                    "lodger.tools.spec",
                    "lodger.tools.registry",
                    "lodger.tools.workspace",
                }
            }, name
        if name.startswith("lodger.recovery"):
            assert not {i for i in imports if i.startswith(("lodger.engine", "lodger.storage"))}


def test_every_error_code_is_enumerated() -> None:
    used: set[str] = set()
    for path in SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        used.update(re.findall(r'\bcode\s*=\s*"([a-z_]+)"', text))
        used.update(re.findall(r'\bcode, hint = "([a-z_]+)"', text))
    assert used, "the scan found no codes"
    assert used - ERROR_CODES == set()


def test_every_cli_command_is_registered_where_it_is_defined() -> None:
    """The command line imports a command's module only when the command runs, from a
    table of names: every module's COMMANDS must be in it, under the module that defines
    them, or the command would be missing from ``lodger``."""
    import importlib

    from lodger.cli import _COMMANDS

    defined: dict[str, str] = {}
    for path in sorted((SRC / "cli").glob("_*.py")):
        name = f"lodger.cli.{path.stem}"
        module = importlib.import_module(name)
        for command in getattr(module, "COMMANDS", ()):
            defined[command.name] = name
    assert defined, "the scan found no commands"
    assert defined == _COMMANDS


def test_importing_lodger_and_its_command_line_stays_cheap() -> None:
    """``import lodger`` and ``import lodger.cli`` load neither the agent nor the host:
    ``lodger log show`` and ``lodger --version`` start without them."""
    code = (
        "import sys, lodger, lodger.cli; "
        "print(sorted(m for m in ('lodger.agent', 'lodger.host', 'lodger.control', "
        "'lodger.engine.loop', 'fastapi') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(SRC.parent)},
    )
    assert done.stdout.strip() == "[]", done.stdout
    import lodger

    assert lodger.Agent.__name__ == "Agent"  # the names still resolve, on first use
    assert set(lodger.__all__) == set(lodger._EXPORTS)

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


def _imports(source: str, modules: set[str]) -> set[str]:
    """The ``modules`` a module's source imports anywhere: at the top, in a function
    body, in an ``except`` handler, and in ``if TYPE_CHECKING:`` blocks. An import a
    type checker follows, or one a function makes when it runs, is a dependency all the
    same: moving it out of sight does not untie the knot."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in modules:  # `import a.b.c` of a module a.b
                    name = name.rpartition(".")[0]
                if name:
                    found.add(name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return found & modules


def _graph_of(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the modules (of ``sources``) it imports."""
    modules = set(sources)
    return {name: _imports(text, modules) - {name} for name, text in sources.items()}


def _graph() -> dict[str, set[str]]:
    return _graph_of({_module_name(p): p.read_text(encoding="utf-8") for p in SRC.rglob("*.py")})


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


def _package_of(module: str) -> str:
    """The top-level part of lodger a module belongs to: ``lodger.engine.loop`` ->
    ``lodger.engine``; a single module (``lodger.runtime.agent``) is its own."""
    return ".".join(module.split(".")[:2])


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for module, imports in graph.items():
        mine = _package_of(module)
        packages.setdefault(mine, set()).update(_package_of(i) for i in imports)
    return {name: imports - {name} for name, imports in packages.items()}


def _knots(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected parts of ``graph`` with more than one node: sets of nodes
    each of which reaches every other."""

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {node: reach(node) for node in graph}
    knots = {
        frozenset(n for n in reached[node] if node in reached.get(n, ()))
        for node in graph
        if node in reached[node]
    }
    return sorted(knots, key=sorted)


#: Package knots still allowed, each to be untied by moving packages (DESIGN.md section
#: 11): the agent, the sessions service, the worker and the subagents go into one
#: ``runtime`` package and the control-plane store under ``storage``. TEMPORARY: the list
#: must only shrink, and the test fails on a knot that changed or is gone, so an entry is
#: removed (or narrowed) by the change that unties it. Nothing is ever added here.
KNOWN_KNOTS: list[frozenset[str]] = []


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_detector_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_a_cycle_of_type_checking_and_local_imports_is_found() -> None:
    """The graph counts imports that only a type checker follows and imports made in a
    function body or an ``except`` handler: a cycle made of them alone is a cycle."""
    sources = {
        "p.a": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import B\n"),
        "p.b": "import typing\nif typing.TYPE_CHECKING:\n    import p.a\n",
        "p.c": "def f():\n    from p.d import D\n",
        "p.d": "try:\n    pass\nexcept ImportError:\n    from p import c\n",
        "p": "",
    }
    graph = _graph_of(sources)
    assert graph == {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.d"}, "p.d": {"p.c"}, "p": set()}
    assert _cycles(graph) == [["p.a", "p.b", "p.a"], ["p.c", "p.d", "p.c"]]


def test_the_knot_finder_collapses_modules_to_packages() -> None:
    graph = {
        "lodger.engine.loop": {"lodger.tools.spec"},
        "lodger.tools.config": {"lodger.engine.permissions"},
        "lodger.engine.permissions": set(),
        "lodger.tools.spec": set(),
        "lodger.agent": {"lodger.engine.loop"},
    }
    packages = _package_graph(graph)
    assert packages == {
        "lodger.engine": {"lodger.tools"},
        "lodger.tools": {"lodger.engine"},
        "lodger.agent": {"lodger.engine"},
    }
    assert _knots(packages) == [frozenset({"lodger.engine", "lodger.tools"})]
    assert _knots({"a": {"b"}, "b": set()}) == []


def test_no_knot_between_packages() -> None:
    """Collapsed to its top-level packages (and single modules), lodger's imports form no
    cycle: a knot between packages means a protocol is missing, or a type lives in the
    wrong package. ``KNOWN_KNOTS`` lists the ones still waiting for a move."""
    knots = _knots(_package_graph(_graph()))
    new = [sorted(k) for k in knots if k not in KNOWN_KNOTS]
    assert new == [], "a new (or changed) knot between packages"
    stale = [sorted(k) for k in KNOWN_KNOTS if k not in knots]
    assert stale == [], "untied or changed: remove (or narrow) it in KNOWN_KNOTS"


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
                    "lodger.tools.policy",
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
        "print(sorted(m for m in ('lodger.runtime.agent', 'lodger.host', 'lodger.storage.control', "
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

"""The core install needs only the core's dependencies, and every optional part names the
extra it needs, in one line, when its packages are missing.

The optional packages are made missing for real in a subprocess: a meta-path finder
refuses to import every module of an extra's distributions (and of what they bring along
that the core does not). ``scripts/check_core.sh`` proves the same with a built wheel in
a fresh venv.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from lodger import cli
from lodger._core.extras import EXTRAS, require
from lodger.errors import MissingExtraError, UsageError

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SRC = ROOT / "src"


def _name(requirement: str) -> str:
    """The normalized distribution name of a requirement (``psycopg[binary]>=3.2``)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group()).lower()


def _closure(names: set[str]) -> set[str]:
    """``names`` and every distribution they require (installed here), unconditionally."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo.extend(_name(r) for r in requires if "extra ==" not in r)
    return seen


@functools.cache
def _optional_modules() -> list[str]:
    """The top-level modules only the extras install: what a core install lacks."""
    core = _closure({_name(r) for r in PYPROJECT["project"]["dependencies"]})
    extras = {_name(r) for extra in EXTRAS.values() for r in extra}
    optional = _closure(extras) - core
    modules = {
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if any(_name(d) in optional for d in dists)
    }
    return sorted(modules)


# Run first in a subprocess: every module named in BLOCKED is missing from then on.
BLOCKER = """
import sys
BLOCKED = frozenset(__BLOCKED__)
class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Missing())
"""


def _run_without_extras(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    program = BLOCKER.replace("__BLOCKED__", repr(_optional_modules())) + code
    return subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        timeout=120,
    )


def test_the_blocked_modules_are_the_extras_and_none_of_the_core() -> None:
    modules = set(_optional_modules())
    assert {"fastapi", "uvicorn", "obstore", "openai", "anthropic", "mcp"} <= modules
    assert {"psycopg", "psycopg_pool", "py_mini_racer", "pydantic_monty", "httpx2"} <= modules
    assert not {"pydantic", "click", "rich", "jsonschema", "re2", "cryptography"} & modules


IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil
import lodger
from lodger.errors import MissingExtraError

ok, extra, broken = [], {}, {}
for info in pkgutil.walk_packages(lodger.__path__, "lodger."):
    name = info.name
    if name == "lodger.__main__" or name.endswith("_conformance"):  # the CLI; pytest suites
        continue
    if any(name.startswith(package + ".") for package in extra):
        continue
    try:
        importlib.import_module(name)
    except MissingExtraError as error:
        extra[name] = [error.extra, str(error)]
    except ImportError as error:
        broken[name] = repr(error)
    else:
        ok.append(name)
print(json.dumps({"ok": ok, "extra": extra, "broken": broken}))
"""


def test_every_core_module_imports_without_the_extras(tmp_path: Path) -> None:
    """What the core's modules import is in the core's dependency list: with every
    extra's package missing, each module imports, or raises MissingExtraError naming its
    extra; none fails with a bare ImportError."""
    done = _run_without_extras(IMPORT_EVERY_MODULE, tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["broken"] == {}
    assert {
        "lodger.runtime.agent",
        "lodger.cli._run",
        "lodger.storage.sqlite",
        "lodger.providers.scripted",
        "lodger.tools.files",
        "lodger.tools.mcp",  # the config types: the SDK is imported when a server starts
        "lodger.substrates.sandbox.bubblewrap",
        "lodger.substrates.codemode",
    } <= set(found["ok"])
    named = {name: extra for name, (extra, _) in found["extra"].items()}
    assert named == {
        "lodger.client": "client",
        "lodger.evals": "evals",
        "lodger.host": "host",
        "lodger.providers.anthropic": "anthropic",
        "lodger.providers.gemini": "gemini",
        "lodger.providers.openai_chat": "openai",
        "lodger.providers.openai_responses": "openai",
        "lodger.storage._object_lease": "s3",
        "lodger.storage._objectio": "s3",
        "lodger.storage._store_probe": "s3",
        "lodger.storage.control.postgres": "postgres",
        "lodger.storage.objectartifacts": "s3",
        "lodger.storage.objectstore": "s3",
        "lodger.substrates.codemode.javascript": "codemode",
        "lodger.substrates.codemode.python": "codemode",
        "lodger.testing.postgres": "postgres",
        "lodger.tools._mcp_bearer": "mcp",
        "lodger.tools._mcp_http": "mcp",
        "lodger.tools._mcp_stdio": "mcp",
        "lodger.tools._mcp_streams": "mcp",
    }
    for extra, message in found["extra"].values():
        assert message.endswith(f": pip install 'lodger[{extra}]'"), message
        assert "\n" not in message


CLI_WITHOUT_EXTRAS = """
import json, sys
from click.testing import CliRunner
from lodger.cli import main

out = []
for args in json.loads(sys.argv[1]):
    result = CliRunner().invoke(main, args)
    out.append([result.exit_code, result.stderr, repr(result.exception)])
print(json.dumps(out))
"""

COMMANDS_NEEDING_AN_EXTRA = [
    ("host", ["serve", "--state", "state"]),
    ("s3", ["sessions", "--store", "s3://bucket/prefix"]),
    ("s3", ["sessions", "--store", "file:///tmp/lodger-objects"]),
    ("postgres", ["worker", "--state", "state", "--control", "postgresql://u@127.0.0.1:1/db"]),
    ("codemode", ["run", "hi", "--model", "test", "--code-mode", "python", "--state", "state"]),
    ("openai", ["run", "hi", "--model", "openai:gpt-4.1", "--state", "state"]),
    ("anthropic", ["run", "hi", "--model", "anthropic:claude-x", "--state", "state"]),
    ("gemini", ["run", "hi", "--model", "gemini:gemini-x", "--state", "state"]),
    ("mcp", ["tools", "list", "--mcp", "time=mcp-server-time"]),
    ("evals", ["eval", "eval_cases.py", "--state", "state"]),
]


def test_a_command_needing_an_extra_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    argv = json.dumps([args for _, args in COMMANDS_NEEDING_AN_EXTRA])
    done = _run_without_extras(f"sys.argv[1:] = [{argv!r}]\n{CLI_WITHOUT_EXTRAS}", tmp_path)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    for (extra, args), (code, stderr, exception) in zip(
        COMMANDS_NEEDING_AN_EXTRA, results, strict=True
    ):
        assert code == cli.EXIT_USAGE, (args, stderr, exception)
        assert stderr.count("\n") == 1, (args, stderr)  # one line, no traceback
        assert stderr.startswith("error: ") and "needs " in stderr, (args, stderr)
        assert stderr.endswith(f": pip install 'lodger[{extra}]'\n"), (args, stderr)


def test_the_extras_are_the_ones_pyproject_declares() -> None:
    declared = PYPROJECT["project"]["optional-dependencies"]
    assert set(declared) == {*EXTRAS, "all", "dev"}
    for extra, packages in EXTRAS.items():
        assert sorted(_name(r) for r in declared[extra]) == sorted(packages), extra
    (everything,) = declared["all"]
    match = re.fullmatch(r"lodger\[([a-z0-9,]+)\]", everything)
    assert match, everything
    assert sorted(match.group(1).split(",")) == sorted(EXTRAS)
    assert "lodger[all]" in declared["dev"]
    core = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert not core & {name for packages in EXTRAS.values() for name in packages}


def test_require_turns_a_missing_module_into_one_line_naming_the_extra() -> None:
    with pytest.raises(MissingExtraError) as caught, require("codemode", "code mode in JS"):
        raise ModuleNotFoundError("No module named 'py_mini_racer'", name="py_mini_racer")
    error = caught.value
    assert str(error) == "code mode in JS needs mini-racer: pip install 'lodger[codemode]'"
    assert (error.extra, error.name, error.code) == ("codemode", "py_mini_racer", "missing_extra")
    # an ImportError (what falls back on a missing module still does) and a usage error
    assert isinstance(error, ImportError) and isinstance(error, UsageError)
    assert cli.exit_code_for_error(error) == cli.EXIT_USAGE
    sdk = r"needs opentelemetry-sdk: .*'lodger\[host\]'"
    with pytest.raises(MissingExtraError, match=sdk), require("host", "tracing"):
        raise ModuleNotFoundError("x", name="opentelemetry.sdk.trace")


def test_require_leaves_a_missing_module_of_lodger_itself_alone() -> None:
    """A module of lodger's own that is missing is a broken install, not an extra."""
    with pytest.raises(ModuleNotFoundError) as caught, require("s3", "the object store"):
        raise ModuleNotFoundError("No module named 'lodger.gone'", name="lodger.gone")
    assert not isinstance(caught.value, MissingExtraError)
    with pytest.raises(ValueError, match="unrelated"), require("s3", "the object store"):
        raise ValueError("unrelated")

"""Eval files: a Python file whose module-level ``EvalSuite`` objects are its suites."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from lodger.errors import ConfigError
from lodger.evals.suite import EvalSuite

__all__ = ["load_suites"]


def load_suites(path: str | Path) -> list[EvalSuite]:
    """Import the eval file ``path`` and return its suites, in definition order. The file
    may register model functions (``lodger.providers.register_function``) for its suites'
    ``function:NAME`` specs and judges."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"eval file {path} does not exist", hint="pass a .py file of suites")
    name = f"lodger_evals_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import eval file {path}", hint="pass a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # user code: one clear line
        sys.modules.pop(name, None)
        raise ConfigError(
            f"importing eval file {path} failed: {type(exc).__name__}: {exc}",
            hint="run the file with python to see the full error",
        ) from exc
    suites = [value for value in vars(module).values() if isinstance(value, EvalSuite)]
    if not suites:
        raise ConfigError(
            f"eval file {path} defines no EvalSuite",
            hint="define one at module level: suite = EvalSuite(name=..., dataset=..., "
            "binding=...)",
        )
    names = [s.name for s in suites]
    if len(set(names)) != len(names):
        raise ConfigError(
            f"eval file {path} defines two suites of the same name",
            hint="give each EvalSuite its own name",
        )
    return suites

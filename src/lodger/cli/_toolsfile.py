"""``--tools FILE.py``: the ``@tool`` functions of a user's Python file, for every command
that binds tools (``run``, ``resume``, ``tools list|search``, ``serve``, ``worker``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from lodger.errors import ConfigError
from lodger.tools.spec import Tool

__all__ = ["load_tools_file"]


#: whether this process ran a user's tools file: then it leaves with the interpreter's
#: own teardown, which flushes what that code left open (``cli._leave_without_teardown``)
user_code_loaded = False


def load_tools_file(path: str) -> list[Tool]:
    """Every ``Tool`` defined at module level in a Python file (``--tools FILE.py``)."""
    global user_code_loaded
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"tools file {path} does not exist", hint="pass a .py file")
    spec = importlib.util.spec_from_file_location(f"lodger_user_tools_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import tools file {path}", hint="pass a .py file")
    module = importlib.util.module_from_spec(spec)
    user_code_loaded = True
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # user code: report it as one clear line
        # A MemoryError from the compiler (a file nested too deeply) has no message.
        detail = str(exc) or "the file is too large or nested too deeply to compile"
        raise ConfigError(
            f"importing tools file {path} failed: {type(exc).__name__}: {detail}",
            hint="run the file with python to see the full error",
        ) from exc
    tools = [value for value in vars(module).values() if isinstance(value, Tool)]
    if not tools:
        raise ConfigError(
            f"tools file {path} defines no tools",
            hint="decorate functions with @lodger.tool at module level",
        )
    return tools

"""The optional parts of lodger and the packages (extras) each one needs.

``pip install lodger`` installs the core: the log, the engine, the tools, SQLite storage,
the command line and the scripted and test models. Everything else is an extra
(``pip install 'lodger[s3]'``), and every module that imports an extra's package does it
under ``require``, so that importing the part without its extra fails with one line
naming what to install::

    with require("s3", "the object store"):
        import obstore

    lodger.errors.MissingExtraError: the object store needs obstore: pip install 'lodger[s3]'

``EXTRAS`` lists the packages of each extra as ``pyproject.toml`` does (a test holds the
two together).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from lodger.errors import MissingExtraError

__all__ = ["EXTRAS", "Extra", "require"]

Extra = Literal[
    "anthropic",
    "client",
    "codemode",
    "evals",
    "gemini",
    "host",
    "mcp",
    "openai",
    "postgres",
    "s3",
    "semantic",
]

#: extra -> the distributions it installs (without versions; pyproject.toml pins them)
EXTRAS: dict[Extra, tuple[str, ...]] = {
    "anthropic": ("anthropic", "httpx2"),
    "client": ("httpx2",),
    "codemode": ("mini-racer", "pydantic-monty"),
    "evals": ("pydantic-evals",),
    "gemini": ("google-genai", "httpx2"),
    "host": ("fastapi", "uvicorn", "opentelemetry-api", "opentelemetry-sdk"),
    "mcp": ("mcp", "httpx2"),
    "openai": ("openai",),
    "postgres": ("psycopg", "psycopg-pool"),
    "s3": ("obstore",),
    "semantic": ("wordllama", "numpy"),
}

# an imported module -> the distribution that installs it, where the names differ
_DISTRIBUTIONS = {
    "py_mini_racer": "mini-racer",
    "pydantic_monty": "pydantic-monty",
    "psycopg_pool": "psycopg-pool",
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry": "opentelemetry-api",
    "mcp_types": "mcp",
    "google.genai": "google-genai",
    "pydantic_evals": "pydantic-evals",
}


def _distribution(module: str | None, extra: Extra) -> str:
    """The distribution whose absence made ``import module`` fail."""
    if module is None:
        return " and ".join(EXTRAS[extra])
    name = module
    while name:
        if name in _DISTRIBUTIONS:
            return _DISTRIBUTIONS[name]
        name = name.rpartition(".")[0]
    return module.partition(".")[0].replace("_", "-")


@contextmanager
def require(extra: Extra, what: str) -> Iterator[None]:
    """Turn a missing module, imported in the block, into ``MissingExtraError``: "``what``
    needs PACKAGE: pip install 'lodger[``extra``]'"."""
    try:
        yield
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] == "lodger":
            raise  # a module of lodger's own is missing: a broken install, not an extra
        package = _distribution(error.name, extra)
        raise MissingExtraError(
            f"{what} needs {package}: pip install 'lodger[{extra}]'",
            extra=extra,
            module=error.name,
        ) from None

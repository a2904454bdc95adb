"""Names a package exports but imports on first use (PEP 562 module ``__getattr__``).

A package lists where each of its lazy names lives and delegates to ``resolve``:

>>> def __getattr__(name: str) -> Any:
...     return resolve(__name__, _EXPORTS, globals(), name)
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["resolve"]


def resolve(package: str, exports: Mapping[str, str], namespace: dict[str, Any], name: str) -> Any:
    """The value ``name`` has in the module ``exports`` maps it to, kept in the package's
    ``namespace`` so it is looked up once; ``AttributeError`` for a name not exported."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    namespace[name] = value
    return value

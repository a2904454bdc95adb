"""A quick accept for the argument schemas most tools have, before the full validator.

Most tool schemas are a flat object: named properties that each carry only a type (and
annotations such as ``title``), a ``required`` list and ``additionalProperties``. For
such a schema, checking a call's arguments is a few dictionary lookups; the general
validator walks the schema and costs about 17 us a call. ``quick_check`` returns a check
for a schema of that shape, or None for any other schema.

The check only ever *accepts*: True means the full validator would find no problem;
False means "not sure", and the caller runs the full validator, which also writes the
messages. A test holds the two in agreement on generated schemas and arguments.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

__all__ = ["quick_check"]

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment"})
_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: type(v) is str,
    # a float is left to the full validator (1.0 is an integer in JSON Schema)
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
    "array": lambda v: type(v) is list,
    "object": lambda v: type(v) is dict,
}


@functools.lru_cache(maxsize=1024)
def quick_check(schema_json: str) -> Callable[[dict[str, Any]], bool] | None:
    """A check that accepts arguments the schema surely accepts, or None (another shape)."""
    try:
        schema = json.loads(schema_json)
    except ValueError:
        return None
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None
    if not set(schema) <= _ANNOTATIONS | {"type", "properties", "required", "additionalProperties"}:
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, dict) or not isinstance(extra, bool):
        return None
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return None
    if len(set(required)) != len(required):
        return None
    checks: dict[str, Callable[[Any], bool]] = {}
    for name, sub in properties.items():
        if not isinstance(sub, dict) or not set(sub) <= _ANNOTATIONS | {"type"}:
            return None
        kind = sub.get("type")
        if kind is None:
            checks[name] = _anything
        elif isinstance(kind, str) and kind in _TYPES:
            checks[name] = _TYPES[kind]
        else:
            return None
    needed = tuple(required)

    def check(arguments: dict[str, Any]) -> bool:
        for name in needed:
            if name not in arguments:
                return False
        for name, value in arguments.items():
            test = checks.get(name)
            if test is None:
                if not extra:
                    return False
            elif not test(value):
                return False
        return True

    return check


def _anything(value: Any) -> bool:
    return True

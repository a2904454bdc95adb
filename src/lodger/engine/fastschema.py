"""A quick accept for the argument schemas most tools have, before the full validator.

Most tool schemas are a flat object: named properties that each carry only a type (and
annotations such as ``title``, and numeric bounds on a number), a ``required`` list and
``additionalProperties``. For
such a schema, checking a call's arguments is a few dictionary lookups; the general
validator walks the schema and costs about 17 us a call. ``quick_check`` returns a check
for a schema of that shape, or None for any other schema.

The check only ever *accepts*: True means the full validator would find no problem;
False means "not sure", and the caller runs the full validator, which also writes the
messages. A test holds the two in agreement on generated schemas and arguments.

A schema it returns a check for is also valid under the draft 2020-12 metaschema (its
annotations have the types the metaschema gives them), so a caller whose quick check
accepts needs neither the metaschema check nor the validator library at all.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

__all__ = ["quick_check"]

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment"})
#: the annotations whose value the metaschema constrains, and how
_ANNOTATION_TYPES: dict[str, type] = {
    "title": str,
    "description": str,
    "$comment": str,
    "examples": list,
}
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
    if not _annotations_valid(schema):
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
        if not isinstance(sub, dict) or not set(sub) <= _ANNOTATIONS | {"type"} | _BOUNDS.keys():
            return None
        if not _annotations_valid(sub):
            return None
        kind = sub.get("type")
        test: Callable[[Any], bool]
        if kind is None:
            test = _anything
        elif isinstance(kind, str) and kind in _TYPES:
            test = _TYPES[kind]
        else:
            return None
        bounds = [(_BOUNDS[key], sub[key]) for key in _BOUNDS if key in sub]
        if bounds:
            # on a number only, and only numbers as bounds (the metaschema's rule)
            if kind not in ("integer", "number"):
                return None
            if not all(type(limit) in (int, float) for _, limit in bounds):
                return None
            test = _bounded(test, bounds)
        checks[name] = test
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


#: numeric bounds, as the comparison a value must pass
_BOUNDS: dict[str, Callable[[Any, Any], bool]] = {
    "minimum": lambda v, limit: v >= limit,
    "maximum": lambda v, limit: v <= limit,
    "exclusiveMinimum": lambda v, limit: v > limit,
    "exclusiveMaximum": lambda v, limit: v < limit,
}


def _bounded(
    test: Callable[[Any], bool], bounds: list[tuple[Callable[[Any, Any], bool], Any]]
) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        return test(value) and all(passes(value, limit) for passes, limit in bounds)

    return check


def _annotations_valid(schema: dict[str, Any]) -> bool:
    return all(
        isinstance(schema[key], kind) for key, kind in _ANNOTATION_TYPES.items() if key in schema
    )


def _anything(value: Any) -> bool:
    return True

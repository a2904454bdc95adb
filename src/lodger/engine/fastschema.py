"""A compiled accept-check for the argument schemas tools have, before the full validator.

Tool schemas (what pydantic writes for a function's parameters) use a small part of JSON
Schema: types, properties, ``required``, ``additionalProperties``, ``items`` and
``prefixItems``, ``enum`` and ``const`` of plain values, ``anyOf``/``allOf``, local
``$ref`` into the root's ``$defs`` (recursive models included), length, size and numeric
bounds, and annotations (``title``, ``description``, ``default``, ``format``, ...). For
such a schema ``quick_check`` compiles, once per distinct schema, a tree of small
closures that checks a call's arguments in one walk of them; the general validator
walks the schema instead and costs about 17 us on a flat call and far more on a nested
one. Any other keyword (``pattern``, ``oneOf``, ``not``, ``uniqueItems``, ``$id``, ...)
makes ``quick_check`` return None for the whole schema.

The check only ever *accepts*: True means the full validator would find no problem;
False means "not sure", and the caller runs the full validator, which also writes the
messages. It is strict where JSON Schema is loose (a whole float such as ``1.0`` given
for an integer, an ``enum`` member equal across types) and says "not sure" there. A test
holds the two in agreement on generated schemas and arguments.

A schema it returns a check for is also valid under the draft 2020-12 metaschema (every
keyword's value has the type and range the metaschema gives it), so a caller whose quick
check accepts needs neither the metaschema check nor the validator library at all.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sized
from typing import Any

__all__ = ["quick_check"]

Check = Callable[[Any], bool]

#: annotations: keywords that never refuse an instance, and the type the metaschema
#: gives their value (None: any JSON value)
_ANNOTATIONS: dict[str, type | None] = {
    "title": str,
    "description": str,
    "$comment": str,
    "examples": list,
    "default": None,
    # an annotation only: the full validator is made without a format checker
    "format": str,
    "deprecated": bool,
    "readOnly": bool,
    "writeOnly": bool,
}
_TYPES: dict[str, Check] = {
    "string": lambda v: type(v) is str,
    # a float is left to the full validator (1.0 is an integer in JSON Schema)
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
    "array": lambda v: type(v) is list,
    "object": lambda v: type(v) is dict,
}
#: numeric bounds, as the comparison a number must pass (other instances pass)
_BOUNDS: dict[str, Callable[[Any, Any], bool]] = {
    "minimum": lambda v, limit: v >= limit,
    "maximum": lambda v, limit: v <= limit,
    "exclusiveMinimum": lambda v, limit: v > limit,
    "exclusiveMaximum": lambda v, limit: v < limit,
}
#: size bounds: (the instance type they apply to, at least?)
_SIZES: dict[str, tuple[type[Sized], bool]] = {
    "minLength": (str, True),
    "maxLength": (str, False),
    "minItems": (list, True),
    "maxItems": (list, False),
    "minProperties": (dict, True),
    "maxProperties": (dict, False),
}
_OBJECT_KEYS = frozenset({"properties", "required", "additionalProperties"})
_ARRAY_KEYS = frozenset({"items", "prefixItems"})
_KNOWN = (
    _ANNOTATIONS.keys()
    | _BOUNDS.keys()
    | _SIZES.keys()
    | _OBJECT_KEYS
    | _ARRAY_KEYS
    | {"type", "enum", "const", "anyOf", "allOf", "$ref"}
)
_SCALARS = (str, int, float, bool, type(None))
#: a ``$defs`` name that is a plain URI fragment as it stands (pydantic's model names)
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class _Unsupported(Exception):
    """A schema outside the compiled subset (or an invalid one): no quick check."""


@functools.lru_cache(maxsize=1024)
def quick_check(schema_json: str) -> Callable[[dict[str, Any]], bool] | None:
    """A check that accepts arguments the schema surely accepts, or None (another shape)."""
    try:
        schema = json.loads(schema_json)
    except ValueError:
        return None
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None
    defs: dict[str, Check] = {}
    try:
        raw_defs = schema.get("$defs", {})
        if not isinstance(raw_defs, dict):
            raise _Unsupported
        compiler = _Compiler(raw_defs, defs)
        for name, sub in raw_defs.items():
            defs[name] = compiler.compile(sub)
        root = compiler.compile({k: v for k, v in schema.items() if k != "$defs"})
    except _Unsupported:
        return None

    def check(arguments: dict[str, Any]) -> bool:
        try:
            return root(arguments)
        except RecursionError:  # arguments nested past Python's stack: not sure
            return False

    return check


class _Compiler:
    """Compiles one schema's subschemas; ``defs`` is filled with the root's ``$defs``
    as they compile (a ``$ref`` looks its target up when it runs, so recursion works)."""

    def __init__(self, raw_defs: Mapping[str, Any], defs: dict[str, Check]) -> None:
        self.raw_defs = raw_defs
        self.defs = defs

    def compile(self, schema: Any) -> Check:
        if schema is True:
            return _anything
        if schema is False:
            return _nothing
        if not isinstance(schema, dict) or not schema.keys() <= _KNOWN:
            raise _Unsupported
        _check_annotations(schema)
        checks: list[Check] = []
        kind = schema.get("type")
        # an object's or array's own check also checks the type (one closure less)
        an_object = kind == "object" and bool(schema.keys() & _OBJECT_KEYS)
        an_array = kind == "array" and bool(schema.keys() & _ARRAY_KEYS)
        if "type" in schema and not (an_object or an_array):
            checks.append(_type_check(kind))
        if "enum" in schema:
            checks.append(_enum_check(schema["enum"]))
        if "const" in schema:
            checks.append(_enum_check([schema["const"]]))
        checks.extend(_bound_checks(schema))
        if schema.keys() & _OBJECT_KEYS:
            checks.append(self._object_check(schema, typed=an_object))
        if schema.keys() & _ARRAY_KEYS:
            checks.append(self._array_check(schema, typed=an_array))
        for key, every in (("anyOf", False), ("allOf", True)):
            if key in schema:
                checks.append(self._combined(schema[key], every=every))
        if "$ref" in schema:
            checks.append(self._ref(schema["$ref"]))
        return _all(checks)

    def _object_check(self, schema: dict[str, Any], *, typed: bool) -> Check:
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(properties, dict):
            raise _Unsupported
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise _Unsupported
        if len(set(required)) != len(required):
            raise _Unsupported
        named = {name: self.compile(sub) for name, sub in properties.items()}
        extra = self.compile(schema.get("additionalProperties", True))
        needed = tuple(required)

        def check(value: Any) -> bool:
            if type(value) is not dict:
                return not typed  # object keywords apply to objects only
            for name in needed:
                if name not in value:
                    return False
            for name, item in value.items():
                test = named.get(name, extra)
                if not test(item):
                    return False
            return True

        return check

    def _array_check(self, schema: dict[str, Any], *, typed: bool) -> Check:
        prefix_raw = schema.get("prefixItems", [])
        if not isinstance(prefix_raw, list) or ("prefixItems" in schema and not prefix_raw):
            raise _Unsupported
        prefix = [self.compile(sub) for sub in prefix_raw]
        rest = self.compile(schema.get("items", True))

        def check(value: Any) -> bool:
            if type(value) is not list:
                return not typed
            for i, item in enumerate(value):
                test = prefix[i] if i < len(prefix) else rest
                if not test(item):
                    return False
            return True

        return check

    def _combined(self, raw: Any, *, every: bool) -> Check:
        if not isinstance(raw, list) or not raw:
            raise _Unsupported
        branches = [self.compile(sub) for sub in raw]
        if every:
            return _all(branches)
        return lambda value: any(test(value) for test in branches)

    def _ref(self, ref: Any) -> Check:
        if ref == "#":
            raise _Unsupported  # the root (the call's arguments) is not in ``defs``
        if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
            raise _Unsupported
        name = ref.removeprefix("#/$defs/")
        if name not in self.raw_defs or not _PLAIN_NAME.fullmatch(name):
            raise _Unsupported  # unknown, or a pointer that needs unescaping
        defs = self.defs
        return lambda value: defs[name](value)


def _check_annotations(schema: dict[str, Any]) -> None:
    for key, kind in _ANNOTATIONS.items():
        if kind is not None and key in schema and type(schema[key]) is not kind:
            raise _Unsupported


def _type_check(kind: Any) -> Check:
    if isinstance(kind, str) and kind in _TYPES:
        return _TYPES[kind]
    if (
        isinstance(kind, list)
        and kind
        and all(isinstance(k, str) and k in _TYPES for k in kind)
        and len(set(kind)) == len(kind)
    ):
        tests = [_TYPES[k] for k in kind]
        return lambda value: any(test(value) for test in tests)
    raise _Unsupported


def _enum_check(members: Any) -> Check:
    """Accepts a member of the same type (JSON Schema also takes 1 for 1.0: not sure)."""
    if not isinstance(members, list) or not all(type(m) in _SCALARS for m in members):
        raise _Unsupported
    pairs = frozenset((type(m), m) for m in members)
    return lambda value: type(value) in _SCALARS and (type(value), value) in pairs


def _bound_checks(schema: dict[str, Any]) -> list[Check]:
    checks: list[Check] = []
    for key, passes in _BOUNDS.items():
        if key in schema:
            limit = schema[key]
            if type(limit) not in (int, float):
                raise _Unsupported
            checks.append(_bounded(passes, limit))
    for key, (kind, at_least) in _SIZES.items():
        if key in schema:
            size = schema[key]
            if type(size) is not int or size < 0:
                raise _Unsupported
            checks.append(_sized(kind, size, at_least=at_least))
    return checks


def _bounded(passes: Callable[[Any, Any], bool], limit: Any) -> Check:
    def check(value: Any) -> bool:
        if type(value) is not int and type(value) is not float:
            return True  # a bound applies to numbers only
        return passes(value, limit)

    return check


def _sized(kind: type[Sized], size: int, *, at_least: bool) -> Check:
    def check(value: Any) -> bool:
        if type(value) is not kind:
            return True
        return len(value) >= size if at_least else len(value) <= size

    return check


def _all(checks: list[Check]) -> Check:
    if not checks:
        return _anything
    if len(checks) == 1:
        return checks[0]
    return lambda value: all(test(value) for test in checks)


def _anything(value: Any) -> bool:
    return True


def _nothing(value: Any) -> bool:
    return False

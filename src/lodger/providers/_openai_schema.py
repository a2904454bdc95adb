"""Whether an output schema may go to OpenAI as a *strict* structured-output schema.

Strict mode (``"strict": true``) makes the API decode only answers that match the schema,
but it takes a subset of JSON Schema and refuses the whole request (400) for anything
outside it: every object lists all its properties in ``required`` and has
``additionalProperties: false``; the root is an object; only the keywords below appear.

``strict_schema`` returns a strict copy when one means the same as the schema given, and
None otherwise (the adapter then sends the schema with ``strict: false``, and the engine
still validates the answer). The copy may only

- add ``additionalProperties: false`` where the schema left it out (an answer valid for
  the copy is valid for the original; a key the schema does not name is never needed),
- drop annotations that do not change what validates (``default``, ``examples``,
  ``$schema``, ``$id``, ``$comment``, ``readOnly``, ``writeOnly``, ``deprecated``),
- turn ``oneOf`` into ``anyOf`` where the branches are objects told apart by a ``const``
  or one-value ``enum`` property of the same name (only one branch can match, so "one of"
  and "any of" accept the same answers).

It never makes an optional property required (the model would have to invent values the
user allowed it to leave out) and never drops a validation keyword OpenAI does not take
(``minLength``, ``uniqueItems``, ``allOf``, ``not``...): such a schema is sent non-strict.
"""

from __future__ import annotations

from typing import Any

__all__ = ["strict_schema"]

# Keywords strict mode accepts, by what they hold.
_PLAIN = frozenset(
    {
        "type",
        "enum",
        "const",
        "description",
        "title",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
        "required",
        "$ref",
    }
)
_ANNOTATIONS = frozenset(
    {
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "readOnly",
        "writeOnly",
        "deprecated",
        "discriminator",  # OpenAPI's hint for a oneOf, which validation does not read
    }
)
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions"})


class _NotStrict(Exception):
    """The schema has something strict mode refuses and no faithful strict form."""


def strict_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """A strict-mode copy of ``schema`` meaning the same, or None when there is none."""
    if schema.get("type") != "object":
        return None
    try:
        return _strict(schema, schema)
    except _NotStrict:
        return None


def _strict(node: Any, root: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(node, dict):
        raise _NotStrict  # a bare true/false schema
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _ANNOTATIONS:
            continue
        if key in _PLAIN:
            out[key] = value
        elif key in _SCHEMA_MAPS:
            if not isinstance(value, dict):
                raise _NotStrict
            out[key] = {name: _strict(sub, root) for name, sub in value.items()}
        elif key == "items":
            out[key] = _strict(value, root)  # a list (tuple form) is refused by _strict
        elif key == "anyOf" or key == "oneOf":
            if "anyOf" in node and "oneOf" in node:
                raise _NotStrict
            out["anyOf"] = _branches(value, root)
            if key == "oneOf" and not _disjoint(value, root):
                raise _NotStrict
        elif key == "additionalProperties":
            if value is not False:
                raise _NotStrict  # extra keys allowed, or typed: strict cannot say so
            out[key] = False
        else:
            raise _NotStrict
    if _is_object(node):
        if "properties" not in node and node.get("additionalProperties") is not False:
            raise _NotStrict  # a free-form map: "no keys at all" would change its meaning
        properties = out.setdefault("properties", {})
        if set(node.get("required", ())) != set(properties):
            raise _NotStrict  # an optional property
        out["required"] = list(properties)
        out["additionalProperties"] = False
    return out


def _is_object(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in node


def _branches(value: Any, root: dict[str, Any]) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise _NotStrict
    return [_strict(branch, root) for branch in value]


def _resolve(node: Any, root: dict[str, Any]) -> Any:
    """A local ``$ref`` (``#/$defs/Name``, as pydantic writes them) followed, else ``node``."""
    ref = node.get("$ref") if isinstance(node, dict) else None
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return node
    target: Any = root
    for step in ref[2:].split("/"):
        target = target.get(step) if isinstance(target, dict) else None
    return target


def _disjoint(value: list[Any], root: dict[str, Any]) -> bool:
    """Whether some property has a different single allowed value in every branch (a
    tagged union: only one branch can match, so oneOf and anyOf accept the same)."""
    branches = [_resolve(branch, root) for branch in value]
    if not all(isinstance(b, dict) and isinstance(b.get("properties"), dict) for b in branches):
        return False
    names = set.intersection(*(set(b["properties"]) for b in branches))
    for name in names:
        tags = [_tag(b["properties"][name]) for b in branches]
        if all(tag is not None for tag in tags) and len(set(map(repr, tags))) == len(tags):
            return True
    return False


def _tag(schema: Any) -> object | None:
    if not isinstance(schema, dict):
        return None
    enum = schema.get("enum")
    values: object = [schema["const"]] if "const" in schema else enum
    if isinstance(values, list) and len(values) == 1:
        only: object = values[0]
        return only
    return None

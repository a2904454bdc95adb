"""Compact signatures of nestable tools, derived from their JSON schemas.

The exec tool's description shows each tool a cell may call as one line: a TypeScript-like
signature for JavaScript cells and a typed Python stub for Monty cells, followed by the
first line of its description. Schemas that say more than a line can (``$ref``, nested
combinators) degrade to ``any`` / ``Any`` rather than to something wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from lodger.tools.spec import Tool

__all__ = ["python_signature", "tool_lines", "typescript_signature"]

_TS = {
    "string": "string",
    "integer": "number",
    "number": "number",
    "boolean": "boolean",
    "null": "null",
}
_PY = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}


def _ts(schema: Any, depth: int = 0) -> str:
    if not isinstance(schema, dict) or depth > 3:
        return "any"
    if "enum" in schema and isinstance(schema["enum"], list):
        return " | ".join(json.dumps(v) for v in schema["enum"]) or "never"
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return " | ".join(_ts(s, depth + 1) for s in schema[key])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_ts({**schema, "type": k}, depth + 1) for k in kind)
    if kind == "array":
        inner = _ts(schema.get("items"), depth + 1)
        return f"({inner})[]" if "|" in inner else f"{inner}[]"
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            return "Record<string, any>"
        required = set(schema.get("required") or ())
        fields = [
            f"{name}{'' if name in required else '?'}: {_ts(sub, depth + 1)}"
            for name, sub in props.items()
        ]
        return "{" + "; ".join(fields) + "}"
    return _TS.get(str(kind), "any")


def _py(schema: Any, depth: int = 0) -> str:
    if not isinstance(schema, dict) or depth > 3:
        return "Any"
    if "enum" in schema and isinstance(schema["enum"], list):
        return "Literal[" + ", ".join(repr(v) for v in schema["enum"]) + "]"
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return " | ".join(_py(s, depth + 1) for s in schema[key])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_py({**schema, "type": k}, depth + 1) for k in kind)
    if kind == "array":
        return f"list[{_py(schema.get('items'), depth + 1)}]"
    if kind == "object":
        return "dict[str, Any]"
    return _PY.get(str(kind), "Any")


def typescript_signature(t: Tool) -> str:
    """``tools.read_file(args: {path: string; limit?: number}): Promise<any>``"""
    return f"tools.{t.name}(args: {_ts(t.parameters)}): Promise<any>"


def python_signature(t: Tool) -> str:
    """``async def read_file(*, path: str, limit: int | None = ...) -> Any``"""
    props = t.parameters.get("properties") if isinstance(t.parameters, dict) else None
    required = set(t.parameters.get("required") or ()) if isinstance(t.parameters, dict) else set()
    params: list[str] = []
    if isinstance(props, dict):
        ordered = sorted(props.items(), key=lambda item: item[0] not in required)
        for name, sub in ordered:
            default = "" if name in required else " = ..."
            params.append(f"{name}: {_py(sub)}{default}")
    inner = ("*, " + ", ".join(params)) if params else ""
    return f"async def {t.name}({inner}) -> Any"


def tool_lines(tools: Iterable[Tool], *, language: str) -> list[str]:
    """One line per tool: its signature, then the first line of its description."""
    lines = []
    for t in tools:
        sig = typescript_signature(t) if language == "javascript" else python_signature(t)
        summary = (t.description.strip().splitlines() or [""])[0]
        comment = "//" if language == "javascript" else "#"
        lines.append(f"{sig}  {comment} {summary}" if summary else sig)
    return lines

"""The synchronous checks of a call: binding, visibility, argument decoding and schema.

Each failure is a ``Rejection``: a stable reason code and a message written for the
model, which the pipeline records as a ``call_rejected`` fact and returns as an error
result. Schemas are compiled once per distinct schema for the whole process.
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import TYPE_CHECKING, Any

from lodger.engine.fastschema import quick_check
from lodger.events import ProposedCall, RejectionReason, canonical_json
from lodger.tools.registry import ToolRegistry
from lodger.tools.spec import Tool

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

__all__ = [
    "INLINE_VALIDATION_LIMIT",
    "MAX_ARGUMENT_DEPTH",
    "Rejection",
    "check_binding",
    "check_call",
    "check_visibility",
    "decode_arguments",
    "invalid_arguments",
    "schema_problems",
    "schema_problems_from_loop",
]

MAX_ARGUMENT_DEPTH = 64
"""Deeper JSON than this is refused before it is parsed (no tool needs it, and Python's
parser would hit its recursion limit near 1,000)."""


class Rejection(Exception):
    """A call that cannot be dispatched, and the message the model sees."""

    def __init__(self, reason: RejectionReason, message: str) -> None:
        super().__init__(message)
        self.reason: RejectionReason = reason
        self.message = message


def check_call(
    registry: ToolRegistry,
    call: ProposedCall,
    *,
    visible: frozenset[str],
    activated_here: frozenset[str] | set[str] = frozenset(),
    schema: bool = True,
) -> tuple[Tool, dict[str, Any]]:
    """binding -> visibility -> arguments: the tool and the decoded, valid arguments
    (``schema=False``: decoded only; the caller checks them, ``schema_problems_from_loop``)."""
    t = check_binding(registry, call.name, shown=visible)
    check_visibility(call.name, visible=visible, activated_here=activated_here)
    arguments = decode_arguments(call.name, call.arguments)
    if schema:
        problems = schema_problems(t, arguments)
        if problems:
            raise invalid_arguments(call.name, problems)
    return t, arguments


def check_binding(registry: ToolRegistry, name: str, *, shown: frozenset[str] | None) -> Tool:
    """The tool bound as ``name`` in this run. ``shown``: the names the proposing step
    showed, for the model's message (None: no step proposes the call now, a re-run)."""
    t = registry.get(name)
    if t is None:
        if shown is None:
            raise Rejection("unbound", f"tool {name!r} is not bound in this run")
        names = ", ".join(sorted(shown)) or "none"
        raise Rejection("unbound", f"unknown tool {name!r}; the tools you can call are: {names}")
    return t


def check_visibility(
    name: str, *, visible: frozenset[str], activated_here: frozenset[str] | set[str]
) -> None:
    """That ``name`` was visible in the step that proposed the call."""
    if name not in visible:
        if name in activated_here:
            raise Rejection(
                "activated_this_step",
                f"tool {name!r} was activated by tool_search in this step; "
                "call it on the next step, when its schema is visible",
            )
        raise Rejection(
            "invisible",
            f"tool {name!r} is not visible in this step; "
            "use tool_search to find and activate it first",
        )


def invalid_arguments(name: str, problems: list[str]) -> Rejection:
    return Rejection("invalid_arguments", f"invalid arguments for {name}: " + "; ".join(problems))


def _depth_exceeds(text: str, limit: int) -> bool:
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def decode_arguments(name: str, text: str) -> dict[str, Any]:
    """The JSON object a model sent as ``name``'s arguments, or a ``Rejection``."""
    # Nesting is counted only when the text could be deep at all (cheap on normal calls).
    if text.count("[") + text.count("{") > MAX_ARGUMENT_DEPTH and _depth_exceeds(
        text, MAX_ARGUMENT_DEPTH
    ):
        raise Rejection(
            "invalid_arguments",
            f"arguments for {name} are nested more than {MAX_ARGUMENT_DEPTH} levels deep; "
            "send a flatter JSON object",
        )
    try:
        # one decoder for the process (``json.loads`` with an option builds one per call);
        # a leading BOM goes through ``json.loads`` for its own error message
        if text.startswith("\ufeff"):
            arguments = json.loads(text, parse_constant=_no_constants)
        else:
            arguments = _DECODER.decode(text or "{}")
    except json.JSONDecodeError as exc:
        raise Rejection(
            "invalid_arguments",
            f"arguments for {name} are not valid JSON ({exc.msg} at position "
            f"{exc.pos}); send a JSON object",
        ) from None
    except ValueError as exc:  # NaN / Infinity: not JSON, and not storable in the log
        raise Rejection("invalid_arguments", f"arguments for {name}: {exc}") from None
    except RecursionError:
        raise Rejection(
            "invalid_arguments", f"arguments for {name} are nested too deeply; flatten them"
        ) from None
    if not isinstance(arguments, dict):
        raise Rejection("invalid_arguments", f"arguments for {name} must be a JSON object")
    try:
        # What T1 stores must be encodable: the text itself is valid UTF-8 (the engine
        # made it so), so only a \u escape can decode to a lone surrogate.
        if "\\u" in text:
            canonical_json(arguments)
    except UnicodeEncodeError:
        raise Rejection(
            "invalid_arguments",
            f"arguments for {name} contain text that is not valid Unicode "
            "(a lone surrogate escape); send plain UTF-8 text",
        ) from None
    return arguments


def schema_problems(t: Tool, arguments: dict[str, Any]) -> list[str]:
    """Up to five schema violations, each with the path it happened at."""
    quick = quick_check(t.parameters_json)
    if quick is not None and quick(arguments):
        # a valid schema, surely valid arguments (see ``fastschema``): neither the
        # metaschema check nor the full walk would find anything (and jsonschema, 30 ms
        # of imports, stays unloaded)
        return []
    from jsonschema.exceptions import SchemaError

    try:
        validator = _compiled_validator(t.parameters_json)
    except SchemaError as exc:
        return [f"the tool's own schema is invalid ({exc.message}); report this"]
    except (ValueError, TypeError) as exc:
        return [f"the tool's own schema cannot be used ({exc}); report this"]
    problems = []
    try:
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))[:5]
    except Exception as exc:  # noqa: BLE001 - e.g. an unresolvable $ref: the tool's fault
        return [f"the tool's schema cannot be checked ({type(exc).__name__}); report this"]
    for error in errors:
        where = "/".join(str(p) for p in error.path)
        problems.append(f"{where}: {error.message}" if where else error.message)
    return problems


INLINE_VALIDATION_LIMIT = 1024
"""Arguments of at most this many characters of JSON are checked by the full validator
on the event loop once their schema is compiled. jsonschema walks a nested call at about
1.5 us per character (measured on a busy 2-core machine): at most about 1.5 ms here. On
a worker thread the same Python walk holds the GIL as long (the loop gets it back every
5 ms switch interval) and adds a round trip of about 100 us, so the thread only pays for
itself on large arguments, and for a schema's first check (jsonschema's import and the
schema's compilation), which go there."""


async def schema_problems_from_loop(
    t: Tool, arguments: dict[str, Any], *, size: int | None = None
) -> list[str]:
    """``schema_problems`` from the event loop, which is never held by the slow parts.

    The compiled quick check (``fastschema``) answers on the loop for the schemas tools
    have. When it cannot vouch for the arguments, the full validator runs here too if
    the schema's validator is already compiled and the arguments are small (``size``:
    the length of their JSON text; None: not known); otherwise jsonschema (its import,
    about 0.1 s the first time, and the schema's compilation) runs on a worker thread.
    """
    quick = quick_check(t.parameters_json)
    if quick is not None and quick(arguments):
        return []
    if size is not None and size <= INLINE_VALIDATION_LIMIT and t.parameters_json in _COMPILED:
        return schema_problems(t, arguments)
    return await asyncio.to_thread(schema_problems, t, arguments)


#: the schemas whose validator ``_compiled_validator`` holds (it is cheap to use then)
_COMPILED: set[str] = set()


@functools.lru_cache(maxsize=1024)
def _compiled_validator(schema_json: str) -> Draft202012Validator:
    """One checked validator per distinct schema, shared by every run of the process
    (checking and compiling a schema costs more than many validations)."""
    from jsonschema import Draft202012Validator

    schema = json.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema)
    if len(_COMPILED) < 1024:  # the cache's size: past it, one may be compiled again inline
        _COMPILED.add(schema_json)
    return validator


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value; send a number or null")


_DECODER = json.JSONDecoder(parse_constant=_no_constants)

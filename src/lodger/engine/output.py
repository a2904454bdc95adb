"""Structured output: the final answer validated against a type.

``Agent(output_type=Invoice)`` (a pydantic model, dataclass, TypedDict or any type
pydantic can validate) asks the model to answer with JSON matching the type's schema.
The answer is parsed and validated when the model stops calling tools. A valid answer
ends the turn with the validated value, and ``turn_ended.output`` records it as JSON; an
invalid one is an ``output_rejected`` fact whose message the model reads on its next step,
up to ``output_retries`` times, after which the turn fails.

A list of types (``output_type=[Invoice, Refusal]``) or a union (``Invoice | Refusal``)
takes an answer that validates as any of them; the value's type says which it was.

How the schema reaches the model is the run's output mode: ``prompted`` puts it in the
system prompt; ``native`` (the provider's structured output) and ``tool`` (a forced
output tool) send it beside the messages, and need an object schema: a type whose schema
is not an object (a list, a number, a union) is sent wrapped as ``{"result": ...}``, and
the answer is unwrapped before it is validated.
"""

from __future__ import annotations

import json
import re
from typing import Any, Union

from pydantic import TypeAdapter, ValidationError

from lodger.errors import UsageError
from lodger.events import canonical_json
from lodger.providers.base import OutputMode

__all__ = ["OutputInvalid", "OutputSpec"]

_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n(.*)\n```$", re.DOTALL)


class OutputInvalid(Exception):
    """The answer does not match the output type; ``message`` is written for the model."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class OutputSpec:
    """One output type: its JSON schema, the instructions for the model, and validation."""

    def __init__(self, output_type: Any) -> None:
        self.output_type = output_type
        if isinstance(output_type, list | tuple):
            if not output_type:
                raise UsageError(
                    "output_type is an empty list",
                    hint="name at least one type, or pass None for free text",
                    code="output_type",
                )
            output_type = output_type[0] if len(output_type) == 1 else Union[tuple(output_type)]  # noqa: UP007
        self._adapter: TypeAdapter[Any] = TypeAdapter(output_type)
        self._use_schema(self._adapter.json_schema())

    def _use_schema(self, schema: dict[str, Any]) -> None:
        self.schema: dict[str, Any] = schema
        #: whether native and tool modes send it wrapped (it is not an object schema)
        self.wrapped = not _is_object(schema)
        self.object_schema = _wrap(schema) if self.wrapped else schema

    def schema_for(self, mode: OutputMode) -> dict[str, Any]:
        """The schema a request in ``mode`` carries (an object one unless prompted)."""
        return self.schema if mode == "prompted" else self.object_schema

    def instructions(self, mode: OutputMode = "prompted") -> str:
        """What the system prompt says about the final answer in ``mode``: the whole
        schema when prompted, a short line when the schema travels on its own."""
        if mode == "tool":
            return (
                "When you give your final answer, call the final_result tool with the "
                "answer as its arguments."
            )
        if mode == "native":
            return "Give your final answer as JSON matching the response format you were given."
        return (
            "When you give your final answer (a message with no tool calls), answer with "
            "only a JSON value that matches this JSON schema, and nothing else:\n"
            + json.dumps(self.schema, ensure_ascii=False, sort_keys=True)
        )

    def validate(self, text: str, mode: OutputMode = "prompted") -> tuple[Any, Any]:
        """The validated value and its JSON form, or ``OutputInvalid``. In native and
        tool mode a wrapped type's answer is unwrapped first (an answer that is not
        wrapped is validated as it is: scripted models answer either way)."""
        stripped = text.strip()
        fenced = _FENCE.match(stripped)
        if fenced:
            stripped = fenced.group(1).strip()
        try:
            data = json.loads(stripped, parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            raise OutputInvalid(
                f"your final answer is not valid JSON ({exc.msg} at position {exc.pos}); "
                "answer again with only a JSON value matching the schema"
            ) from None
        except (ValueError, RecursionError) as exc:
            raise OutputInvalid(
                f"your final answer cannot be read as JSON ({exc}); answer again with only "
                "a JSON value matching the schema"
            ) from None
        if mode != "prompted" and self.wrapped and isinstance(data, dict) and "result" in data:
            if set(data) != {"result"}:
                raise OutputInvalid(
                    "your final answer must be an object with only the key 'result'; "
                    "answer again with the value under 'result'"
                )
            data = data["result"]
        try:
            value = self._adapter.validate_python(data)
        except ValidationError as exc:
            problems = []
            for error in exc.errors()[:5]:
                where = ".".join(str(p) for p in error["loc"]) or "the value"
                problems.append(f"{where}: {error['msg']}")
            raise OutputInvalid(
                "your final answer does not match the required output: "
                + "; ".join(problems)
                + ". Answer again with only a JSON value matching the schema"
            ) from None
        dumped = self._adapter.dump_python(value, mode="json")
        canonical_json(dumped)  # storable (finite numbers, valid text) or raises
        return value, dumped


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _is_object(schema: dict[str, Any]) -> bool:
    """Whether ``schema`` describes a JSON object (directly or through one ``$ref``)."""
    if schema.get("type") == "object":
        return True
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and len(schema) <= 2:
        target = schema.get("$defs", {}).get(ref.removeprefix("#/$defs/"), {})
        return isinstance(target, dict) and target.get("type") == "object"
    return False


def _wrap(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as the ``result`` property of an object; its ``$defs`` move to the
    wrapper so the references inside still resolve from the root."""
    inner = {k: v for k, v in schema.items() if k != "$defs"}
    wrapped: dict[str, Any] = {
        "type": "object",
        "properties": {"result": inner},
        "required": ["result"],
        "additionalProperties": False,
    }
    if "$defs" in schema:
        wrapped["$defs"] = schema["$defs"]
    return wrapped

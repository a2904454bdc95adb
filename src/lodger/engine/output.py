"""Structured output: the final answer validated against a type.

``Agent(output_type=Invoice)`` (a pydantic model, dataclass, TypedDict or any type
pydantic can validate) asks the model to answer with JSON matching the type's schema.
The answer is parsed and validated when the model stops calling tools. A valid answer
ends the turn with the validated value, and ``turn_ended.output`` records it as JSON; an
invalid one is an ``output_rejected`` fact whose message the model reads on its next step,
up to ``output_retries`` times, after which the turn fails.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import TypeAdapter, ValidationError

from lodger.events import canonical_json

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
        self._adapter: TypeAdapter[Any] = TypeAdapter(output_type)
        self.schema: dict[str, Any] = self._adapter.json_schema()

    def instructions(self) -> str:
        return (
            "When you give your final answer (a message with no tool calls), answer with "
            "only a JSON value that matches this JSON schema, and nothing else:\n"
            + json.dumps(self.schema, ensure_ascii=False, sort_keys=True)
        )

    def validate(self, text: str) -> tuple[Any, Any]:
        """The validated value and its JSON form, or ``OutputInvalid``."""
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

"""Model settings as every entry point gives them: checked, read from tables, recorded.

``ModelSettings`` (``lodger.providers.base``) is what a request asks of the model beyond
its messages. An agent has settings, a run may override them field by field
(``ModelSettings.merged``), and each step records the settings it asked with in
``step_started.settings`` (``ModelSettings.record()``). ``settings_from_mapping`` reads
the same shape back: from a ``lodger.toml`` ``[model.settings]`` table, a host request
body, ``--model-setting`` flags, or a recorded step (what a resume asks with).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from lodger.errors import ConfigError, UsageError
from lodger.providers.base import ModelSettings

__all__ = ["REASONING_EFFORTS", "SETTING_NAMES", "check_settings", "settings_from_mapping"]

REASONING_EFFORTS = ("minimal", "low", "medium", "high")

#: the keys a settings table may hold
SETTING_NAMES = (
    "temperature",
    "top_p",
    "max_tokens",
    "stop",
    "seed",
    "parallel_tool_calls",
    "reasoning_effort",
    "extra",
)


def check_settings(settings: ModelSettings, *, where: str = "model_settings") -> ModelSettings:
    """``settings`` when every field is in range, else a ``UsageError`` naming the field."""
    problem = _problem(settings)
    if problem is not None:
        name, message = problem
        raise UsageError(
            f"{where}.{name} {message}",
            hint="see ModelSettings in the library guide for each setting's range",
            code="model_settings",
        )
    return settings


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _problem(s: ModelSettings) -> tuple[str, str] | None:
    if s.temperature is not None and not (_number(s.temperature) and 0 <= s.temperature <= 2):
        return "temperature", f"must be a number from 0 to 2, not {s.temperature!r}"
    if s.top_p is not None and not (_number(s.top_p) and 0 < s.top_p <= 1):
        return "top_p", f"must be a number above 0 and at most 1, not {s.top_p!r}"
    for name in ("max_tokens", "seed"):
        value = getattr(s, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            return name, f"must be a whole number, not {value!r}"
    if s.max_tokens is not None and s.max_tokens < 1:
        return "max_tokens", f"must be at least 1, not {s.max_tokens}"
    if not isinstance(s.stop, tuple) or not all(isinstance(x, str) and x for x in s.stop):
        return "stop", f"must be non-empty strings, not {s.stop!r}"
    if s.parallel_tool_calls is not None and not isinstance(s.parallel_tool_calls, bool):
        return "parallel_tool_calls", f"must be true or false, not {s.parallel_tool_calls!r}"
    if s.reasoning_effort is not None and s.reasoning_effort not in REASONING_EFFORTS:
        return "reasoning_effort", (
            f"must be one of {', '.join(REASONING_EFFORTS)}, not {s.reasoning_effort!r}"
        )
    if not isinstance(s.extra, dict) or not all(isinstance(k, str) for k in s.extra):
        return "extra", "must be a table with string keys"
    try:
        json.dumps(s.extra, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return "extra", f"must hold JSON values only ({exc})"
    return None


def settings_from_mapping(
    data: Mapping[str, Any], *, where: str, error: type[UsageError] = ConfigError
) -> ModelSettings:
    """The settings a table names (``temperature = 0.2``, ``stop = ["END"]``,
    ``extra = {...}``); an unknown key or a value out of range is ``error`` (a
    ``ConfigError`` for files, a ``UsageError`` for flags and request bodies)."""
    if not isinstance(data, Mapping):
        raise error(f"{where} must be a table of settings", hint=_known(), code="model_settings")
    fields: dict[str, Any] = {}
    for key, value in data.items():
        if key not in SETTING_NAMES:
            raise error(f"unknown model setting {key!r} in {where}", hint=_known())
        if key == "stop":
            if isinstance(value, str):
                value = (value,)
            elif isinstance(value, list | tuple):
                value = tuple(value)
            else:
                raise error(f"{where}.stop must be a string or a list of strings")
        if key == "extra":
            if not isinstance(value, Mapping):
                raise error(f"{where}.extra must be a table")
            value = dict(value)
        fields[key] = value
    settings = ModelSettings(**fields)
    problem = _problem(settings)
    if problem is not None:
        raise error(f"{where}.{problem[0]} {problem[1]}", hint=_known(), code="model_settings")
    return settings


def _known() -> str:
    return "known settings: " + ", ".join(SETTING_NAMES)

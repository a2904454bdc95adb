"""The model settings flags of ``lodger run`` and ``lodger resume``.

``--temperature``, ``--top-p``, ``--max-tokens``, ``--seed``, ``--reasoning-effort`` and
the generic ``--model-setting KEY=VALUE`` (repeatable; VALUE is read as JSON, else as a
string; ``extra.NAME=VALUE`` goes into the provider's request body) become one
``ModelSettings`` over the project's ``[model_settings]``; ``--output-mode`` picks how
structured output travels. The command receives them as ``model_settings`` and
``output_mode``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from lodger.engine.modelsettings import REASONING_EFFORTS, SETTING_NAMES, settings_from_mapping
from lodger.errors import UsageError
from lodger.providers.base import ModelSettings

__all__ = ["model_options", "settings_from_flags"]

F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS = (
    click.option("--temperature", type=float, default=None, help="Sampling temperature (0-2)."),
    click.option("--top-p", type=float, default=None, help="Nucleus sampling (0-1]."),
    click.option(
        "--max-tokens",
        type=click.IntRange(min=1),
        default=None,
        help="Most tokens the model may write per step.",
    ),
    click.option("--seed", type=int, default=None, help="Sampling seed, where supported."),
    click.option(
        "--reasoning-effort",
        type=click.Choice(REASONING_EFFORTS),
        default=None,
        help="How hard a reasoning model thinks.",
    ),
    click.option(
        "--model-setting",
        "model_setting_pairs",
        multiple=True,
        metavar="KEY=VALUE",
        help='Any model setting (stop=["END"], parallel_tool_calls=false) or extra.NAME=VALUE '
        "for the provider's request body; VALUE is JSON, else text (repeatable).",
    ),
    click.option(
        "--output-mode",
        type=click.Choice(["native", "tool", "prompted"]),
        default=None,
        help="How structured output travels (default: the model's own).",
    ),
)


def settings_from_flags(
    *,
    temperature: float | None = None,
    top_p: float | None = None,
    max_tokens: int | None = None,
    seed: int | None = None,
    reasoning_effort: str | None = None,
    pairs: Sequence[str] = (),
) -> ModelSettings | None:
    """The settings the flags name (None when they name none); a bad pair or value is a
    ``UsageError`` naming it."""
    table: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(
                f"--model-setting {pair!r} is not KEY=VALUE",
                hint="e.g. --model-setting temperature=0.2 or --model-setting extra.user=me",
            )
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        if key.startswith("extra.") and len(key) > len("extra."):
            extra[key.removeprefix("extra.")] = value
        elif key in SETTING_NAMES:
            table[key] = value
        else:
            raise UsageError(
                f"unknown model setting {key!r} in --model-setting",
                hint="known settings: " + ", ".join(SETTING_NAMES) + "; extra.NAME for others",
            )
    named = {
        "temperature": temperature,
        "top_p": top_p,
        "max_tokens": max_tokens,
        "seed": seed,
        "reasoning_effort": reasoning_effort,
    }
    table.update({k: v for k, v in named.items() if v is not None})
    if extra:
        table["extra"] = {**table.get("extra", {}), **extra}
    if not table:
        return None
    return settings_from_mapping(table, where="the model flags", error=UsageError)


def model_options(command: F) -> F:
    """The model settings flags, handed to ``command`` as ``model_settings`` (a
    ``ModelSettings`` or None) and ``output_mode``."""

    @functools.wraps(command)
    def with_settings(
        *args: Any,
        temperature: float | None,
        top_p: float | None,
        max_tokens: int | None,
        seed: int | None,
        reasoning_effort: str | None,
        model_setting_pairs: tuple[str, ...],
        **kwargs: Any,
    ) -> Any:
        kwargs["model_settings"] = settings_from_flags(
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            seed=seed,
            reasoning_effort=reasoning_effort,
            pairs=model_setting_pairs,
        )
        return command(*args, **kwargs)

    wrapped: Any = with_settings
    for option in reversed(_OPTIONS):
        wrapped = option(wrapped)
    return wrapped  # type: ignore[no-any-return]

"""Scripted models: deterministic, offline, and resumable.

``ScriptedModel`` plays a JSON script, a list of steps::

    [
      {"text": "Let me look."},
      {"calls": [{"name": "read_file", "args": {"path": "README.md"}}]},
      {"text": "Done.", "calls": []}
    ]

Each step may have ``text``, ``reasoning`` and ``calls``; a call has ``name`` and either
``args`` (a JSON object) or ``arguments`` (raw text, to script a malformed call). The
model picks its step from the history it is given: the number of model outputs the
request already holds. A resumed run therefore continues the script where the
interrupted run stopped, and call ids (``call-<step>-<n>``) come out the same every time.

``FunctionModel`` wraps a Python function ``(request) -> ModelResponse`` for tests.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from lodger.errors import ConfigError, ProviderError
from lodger.events import ProposedCall
from lodger.providers.base import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    TextSink,
)

__all__ = ["FunctionModel", "ScriptedModel", "load_script"]


def _step_error(index: int, why: str) -> ConfigError:
    return ConfigError(
        f"script step {index} is invalid: {why}",
        hint='each step is {"text": ..., "calls": [{"name": ..., "args": {...}}]}',
        code="script",
    )


def load_script(path: str | Path) -> list[dict[str, Any]]:
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"script {path} does not exist", code="script") from None
    except OSError as exc:
        raise ConfigError(f"cannot read script {path}: {exc.strerror}", code="script") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"script {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
            hint="save the script as UTF-8",
            code="script",
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"script {path} is not valid JSON: {exc}", code="script") from None
    except RecursionError:  # the decoder recurses once per nested array or object
        raise ConfigError(
            f"script {path} is nested too deeply to read",
            hint="a script is a list of steps; nest arguments a few levels deep at most",
            code="script",
        ) from None
    if not isinstance(data, list):
        raise ConfigError(f"script {path} must be a JSON list of steps", code="script")
    return data


def _response(index: int, step: Any) -> ModelResponse:
    if not isinstance(step, dict):
        raise _step_error(index, "a step must be an object")
    unknown = set(step) - {"text", "reasoning", "calls"}
    if unknown:
        raise _step_error(index, f"unknown keys {sorted(unknown)}")
    calls: list[ProposedCall] = []
    for n, call in enumerate(step.get("calls", []), start=1):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise _step_error(index, "every call needs a name")
        if "arguments" in call:
            arguments = str(call["arguments"])
        else:
            arguments = json.dumps(call.get("args", {}), ensure_ascii=False)
        calls.append(
            ProposedCall(call_id=f"call-{index}-{n}", name=call["name"], arguments=arguments)
        )
    return ModelResponse(
        text=str(step.get("text", "")),
        reasoning=str(step.get("reasoning", "")),
        calls=tuple(calls),
        finish_reason="tool_calls" if calls else "stop",
    )


def outputs_so_far(request: ModelRequest) -> int:
    return sum(1 for m in request.messages if isinstance(m, AssistantMessage))


class _OutputCounter:
    """``outputs_so_far`` without rescanning a long history every step.

    A run's requests grow by appending, and the projection reuses the message objects,
    so when the previous request's last message is still in place only the new tail is
    counted. Anything else (a new session, a resumed run, elided results) counts anew.
    """

    def __init__(self) -> None:
        self._length = 0
        self._last: object = None
        self._count = 0

    def count(self, request: ModelRequest) -> int:
        messages = request.messages
        start = 0
        if 0 < self._length <= len(messages) and messages[self._length - 1] is self._last:
            start = self._length
        else:
            self._count = 0
        self._count += sum(1 for m in messages[start:] if isinstance(m, AssistantMessage))
        self._length = len(messages)
        self._last = messages[-1] if messages else None
        return self._count


class ScriptedModel:
    """Plays ``steps``; ``ScriptedModel.from_file("script.json")`` reads a JSON script."""

    def __init__(self, steps: Sequence[Any], *, name: str = "inline") -> None:
        self.steps = list(steps)
        self._name = name
        self._outputs = _OutputCounter()
        for index, step in enumerate(self.steps):
            _response(index, step)  # fail early on a bad script

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        return cls(load_script(path), name=str(path))

    @property
    def spec(self) -> str:
        return f"script:{self._name}"

    async def aclose(self) -> None:
        """Nothing to release."""

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        index = self._outputs.count(request)
        if index >= len(self.steps):
            raise ProviderError(
                f"the script has {len(self.steps)} steps and step {index} was requested",
                retryable=False,
                hint="add a final step with only text so the turn can end",
                code="script_exhausted",
            )
        response = _response(index, self.steps[index])
        if on_text is not None and response.text:
            on_text(response.text)
        return response


ModelFunction = Callable[[ModelRequest], ModelResponse | Awaitable[ModelResponse]]


class FunctionModel:
    """A model that is a Python function of the request (sync or async)."""

    def __init__(self, fn: ModelFunction, *, name: str = "function") -> None:
        self._fn = fn
        self._name = name

    @property
    def spec(self) -> str:
        return f"function:{self._name}"

    async def aclose(self) -> None:
        """Nothing to release."""

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        result = self._fn(request)
        if inspect.isawaitable(result):
            result = await result
        assert isinstance(result, ModelResponse)
        if on_text is not None and result.text:
            on_text(result.text)
        return result

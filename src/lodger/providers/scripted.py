"""Scripted models: deterministic, offline, and resumable.

``ScriptedModel`` plays a JSON script, a list of steps::

    [
      {"text": "Let me look."},
      {"calls": [{"name": "read_file", "args": {"path": "README.md"}}]},
      {"text": "Done.", "calls": []}
    ]

Each step may have ``text``, ``reasoning`` and ``calls``; a call has ``name`` and either
``args`` (a JSON object) or ``arguments`` (raw text, to script a malformed call). The
model picks its step from the history it is given: the number of model outputs since the
turn's input (the last user message the turn started with). Every turn therefore plays
the script from its first step, a resumed run continues the script where the
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
    UserMessage,
)

__all__ = [
    "FunctionModel",
    "ScriptedModel",
    "function_model",
    "load_script",
    "register_function",
    "tool_call",
]


def tool_call(name: str, /, **args: Any) -> ProposedCall:
    """A call for a ``FunctionModel`` to return: ``tool_call("add", a=1, b=2)``.

    The arguments are encoded as JSON; the runtime gives the call a session-unique id.
    """
    return ProposedCall(call_id="", name=name, arguments=json.dumps(args, ensure_ascii=False))


def _step_error(index: int, why: str) -> ConfigError:
    return ConfigError(
        f"script step {index} is invalid: {why}",
        hint='each step is {"text": ..., "calls": [{"name": ..., "args": {...}}]}',
        code="script",
    )


def load_script(path: str | Path) -> list[Any] | dict[str, Any]:
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        hint = (
            "a ScriptedModel built in code is recorded as script:inline, which names no "
            "file: pass --model script:FILE.json (or build it with ScriptedModel.from_file)"
            if str(path) == "inline"
            else "a script is a JSON file of steps: pass its path"
        )
        raise ConfigError(f"script {path} does not exist", hint=hint, code="script") from None
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
    if (
        isinstance(data, dict)
        and set(data) == {"turns"}
        and isinstance(data["turns"], list)
        and all(isinstance(t, list) for t in data["turns"])
    ):
        return data
    if not isinstance(data, list):
        raise ConfigError(
            f'script {path} must be a JSON list of steps or {{"turns": [[steps], ...]}}',
            code="script",
        )
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
    """Model outputs in ``request`` since the current turn's input."""
    count = 0
    for m in reversed(request.messages):
        if isinstance(m, UserMessage) and m.source == "input":
            break
        if isinstance(m, AssistantMessage):
            count += 1
    return count


class _OutputCounter:
    """``outputs_so_far`` without rescanning a long history every step.

    A run's requests grow by appending, and the projection reuses the message objects,
    so when the previous request's last message is still in place only the new tail is
    counted (a new turn's input resets the count). Anything else (a new session, a
    resumed run, elided results) counts anew.
    """

    def __init__(self) -> None:
        self._length = 0
        self._last: object = None
        self._count = 0

    def count(self, request: ModelRequest) -> int:
        messages = request.messages
        if 0 < self._length <= len(messages) and messages[self._length - 1] is self._last:
            for m in messages[self._length :]:
                if isinstance(m, UserMessage) and m.source == "input":
                    self._count = 0
                elif isinstance(m, AssistantMessage):
                    self._count += 1
        else:
            self._count = outputs_so_far(request)
        self._length = len(messages)
        self._last = messages[-1] if messages else None
        return self._count


class ScriptedModel:
    """Plays ``steps`` in every turn, or ``turns`` (one list of steps per turn) when a
    session's turns need different scripts; ``ScriptedModel.from_file("script.json")``
    reads a JSON script (a list of steps, or ``{"turns": [[...], [...]]}``)."""

    #: takes images and documents (it reads none of them)
    media_kinds: frozenset[str] = frozenset({"image", "document"})

    def __init__(
        self,
        steps: Sequence[Any] | None = None,
        *,
        turns: Sequence[Sequence[Any]] | None = None,
        name: str = "inline",
    ) -> None:
        if (steps is None) == (turns is None):
            raise ConfigError(
                "a script has steps or turns, not both and not neither",
                hint='ScriptedModel([{"text": "hi"}]) or ScriptedModel(turns=[[...], [...]])',
                code="script",
            )
        self.turns = [list(t) for t in turns] if turns is not None else None
        self.steps = list(steps) if steps is not None else []
        self._name = name
        self._outputs = _OutputCounter()
        for script in self.turns if self.turns is not None else [self.steps]:
            for index, step in enumerate(script):
                _response(index, step)  # fail early on a bad script

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        data = load_script(path)
        if isinstance(data, dict):
            return cls(turns=data["turns"], name=str(path))
        return cls(data, name=str(path))

    @property
    def spec(self) -> str:
        return f"script:{self._name}"

    async def aclose(self) -> None:
        """Nothing to release."""

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        index = self._outputs.count(request)
        steps = self.steps
        where = ""
        if self.turns is not None:
            turn = sum(
                1 for m in request.messages if isinstance(m, UserMessage) and m.source == "input"
            )
            if not 1 <= turn <= len(self.turns):
                raise ProviderError(
                    f"the script has {len(self.turns)} turns and turn {turn} was requested",
                    retryable=False,
                    hint="add a list of steps for every turn the session will run",
                    code="script_exhausted",
                )
            steps, where = self.turns[turn - 1], f" of turn {turn}"
        if index >= len(steps):
            raise ProviderError(
                f"the script{where} has {len(steps)} steps and step {index} was requested",
                retryable=False,
                hint="add a final step with only text so the turn can end",
                code="script_exhausted",
            )
        response = _response(index, steps[index])
        if on_text is not None and response.text:
            on_text(response.text)
        return response


ModelFunction = Callable[
    [ModelRequest], ModelResponse | str | Awaitable[ModelResponse] | Awaitable[str]
]


class FunctionModel:
    """A model that is a Python function of the request (sync or async).

    The function returns a ``ModelResponse`` (``ModelResponse(calls=(tool_call("add",
    a=1, b=2),))``) or a plain ``str``, the final answer.
    """

    #: the function is given every part, images and documents alike
    media_kinds: frozenset[str] = frozenset({"image", "document"})

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
        result: Any = self._fn(request)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, str):
            result = ModelResponse(text=result)
        if not isinstance(result, ModelResponse):
            raise ProviderError(
                f"the model function returned {type(result).__name__}, not a ModelResponse or str",
                retryable=False,
                code="function_model",
            )
        if on_text is not None and result.text:
            on_text(result.text)
        return result


#: the functions ``function:NAME`` specs name, registered by the program that runs them
_FUNCTIONS: dict[str, ModelFunction] = {}


def register_function(name: str, fn: ModelFunction) -> None:
    """Make ``function:NAME`` a spec ``make_model`` (the CLI, a replay, an eval's judge)
    turns into ``FunctionModel(fn, name=name)``. Only this process's code registers a
    function: a spec read from a log or a file never imports anything."""
    if not name or ":" in name or "|" in name:
        raise ConfigError(
            f"function model name {name!r} is not usable in a spec",
            hint="use a plain name such as 'candidate' (no ':' or '|')",
            code="config",
        )
    _FUNCTIONS[name] = fn


def function_model(name: str) -> FunctionModel:
    """The ``FunctionModel`` of a registered function (``function:NAME``)."""
    fn = _FUNCTIONS.get(name)
    if fn is None:
        known = ", ".join(sorted(_FUNCTIONS)) or "none"
        raise ConfigError(
            f"no model function is registered as {name!r} (registered: {known})",
            hint="register it first: lodger.providers.register_function(name, fn)",
            code="config",
        )
    return FunctionModel(fn, name=name)

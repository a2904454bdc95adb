"""The event bodies of a call's hot path, built without pydantic when their values are
exactly what the model would accept.

A step appends four events whose bodies the runtime fills itself (``step_started``,
``model_output``, ``tool_dispatched``, ``tool_responded``). Validating them through
pydantic cost about a tenth of the per-call CPU. Each builder here checks its values
with exact type tests (``type(x) is str``, not ``isinstance``: a subclass goes the
validated way) and, when every one passes, makes the body with every field set; when any
value is anything else (a NaN argument, a tuple, a provider's state, a str subclass, a
wrong type from a tool) it calls the model's own constructor, so what is
accepted, what is refused and the error raised are the model's. A test holds each
builder equal to the model's constructor on valid and hostile values alike.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from lodger.events import (
    ArtifactRef,
    FileExpectation,
    ModelOutput,
    ProposedCall,
    ResultStatus,
    StepStarted,
    ToolDispatched,
    ToolRef,
    ToolResponded,
    Usage,
    _construct,
)

__all__ = [
    "model_output",
    "proposed_call",
    "step_started",
    "tool_dispatched",
    "tool_responded",
]

_RESULT_STATUSES: frozenset[object] = frozenset(typing.get_args(ResultStatus))
#: argument values taken as they are: exact JSON scalars (a float is taken when finite:
#: NaN and the infinities go the validated way, the model's and the encoder's to refuse)
_SCALARS = (str, int, bool, type(None))


def _all_exactly(items: object, cls: type) -> bool:
    if type(items) is not tuple:
        return False
    for item in items:  # noqa: SIM110 (a loop, not all() over a generator: most hold 0-2)
        if type(item) is not cls:
            return False
    return True


def proposed_call(*, call_id: str, name: str, arguments: str) -> ProposedCall:
    if type(call_id) is str and type(name) is str and type(arguments) is str:
        return _construct(ProposedCall, {"call_id": call_id, "name": name, "arguments": arguments})
    return ProposedCall(call_id=call_id, name=name, arguments=arguments)


def step_started(
    *,
    index: int,
    model: str,
    tools: tuple[ToolRef, ...],
    settings: dict[str, Any] | None = None,
) -> StepStarted:
    if (
        type(index) is int
        and type(model) is str
        and _all_exactly(tools, ToolRef)
        and settings is None
    ):
        return _construct(
            StepStarted,
            {
                "kind": "step_started",
                "index": index,
                "model": model,
                "tools": tools,
                "settings": None,
            },
        )
    return StepStarted(index=index, model=model, tools=tools, settings=settings)


def model_output(
    *,
    text: str,
    reasoning: str,
    calls: tuple[ProposedCall, ...],
    usage: Usage | None,
    finish_reason: str | None,
    provider_state: dict[str, Any] | None,
) -> ModelOutput:
    if (
        type(text) is str
        and type(reasoning) is str
        and _all_exactly(calls, ProposedCall)
        and (usage is None or type(usage) is Usage)
        and (finish_reason is None or type(finish_reason) is str)
        and provider_state is None
    ):
        return _construct(
            ModelOutput,
            {
                "kind": "model_output",
                "text": text,
                "reasoning": reasoning,
                "calls": calls,
                "usage": usage,
                "finish_reason": finish_reason,
                "provider_state": None,
            },
        )
    return ModelOutput(
        text=text,
        reasoning=reasoning,
        calls=calls,
        usage=usage,
        finish_reason=finish_reason,
        provider_state=provider_state,
    )


def _json_copy(arguments: object) -> dict[str, Any] | None:
    """A deep copy of ``arguments`` if it is a dict of str keys holding exact JSON values
    (str, int, bool, None, finite floats, lists and str-keyed dicts of them, nested at
    most ``_MAX_COPY_DEPTH`` deep), else None: the model's own validation decides. The
    copy: the tool gets the original and may change it, the event must not."""
    if type(arguments) is not dict:
        return None
    try:
        return _copy_object(arguments, _MAX_COPY_DEPTH)
    except _NotPlainJson:
        return None


#: deeper arguments than decoding accepts (``checks.MAX_ARGUMENT_DEPTH``) go the
#: validated way (a hook's rewrite may hand any value)
_MAX_COPY_DEPTH = 64


class _NotPlainJson(Exception):
    pass


def _copy_object(value: dict[Any, Any], depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        if type(key) is not str:
            raise _NotPlainJson
        kind = type(item)
        if kind in _SCALARS:
            out[key] = item
        else:
            out[key] = _copy_value(item, kind, depth)
    return out


def _copy_value(value: Any, kind: type, depth: int) -> Any:
    if kind is float:
        if value - value != 0.0:  # NaN and the infinities: the model's to take or refuse
            raise _NotPlainJson
        return value
    if depth <= 1:
        raise _NotPlainJson
    if kind is dict:
        return _copy_object(value, depth - 1)
    if kind is list:
        return [
            item if type(item) in _SCALARS else _copy_value(item, type(item), depth - 1)
            for item in value
        ]
    raise _NotPlainJson


def tool_dispatched(
    *,
    operation_id: str,
    tool: str,
    arguments: Mapping[str, Any],
    attempt: int,
    retry_of: str | None,
    recovery: str,
    resources: tuple[str, ...],
    expectations: tuple[FileExpectation, ...],
) -> ToolDispatched:
    flat = _json_copy(arguments)
    if (
        flat is not None
        and type(operation_id) is str
        and type(tool) is str
        and type(attempt) is int
        and (retry_of is None or type(retry_of) is str)
        and type(recovery) is str
        and _all_exactly(resources, str)
        and _all_exactly(expectations, FileExpectation)
    ):
        return _construct(
            ToolDispatched,
            {
                "kind": "tool_dispatched",
                "operation_id": operation_id,
                "tool": tool,
                "arguments": flat,
                "attempt": attempt,
                "retry_of": retry_of,
                "recovery": recovery,
                "resources": resources,
                "expectations": expectations,
            },
        )
    return ToolDispatched(
        operation_id=operation_id,
        tool=tool,
        arguments=arguments,  # the model decides what it takes
        attempt=attempt,
        retry_of=retry_of,
        recovery=recovery,
        resources=resources,
        expectations=expectations,
    )


def tool_responded(
    *,
    operation_id: str,
    status: ResultStatus,
    content: str,
    truncated: bool,
    artifacts: tuple[ArtifactRef, ...],
) -> ToolResponded:
    if (
        type(operation_id) is str
        and type(status) is str
        and status in _RESULT_STATUSES
        and type(content) is str
        and type(truncated) is bool
        and _all_exactly(artifacts, ArtifactRef)
    ):
        return _construct(
            ToolResponded,
            {
                "kind": "tool_responded",
                "operation_id": operation_id,
                "status": status,
                "content": content,
                "truncated": truncated,
                "artifacts": artifacts,
            },
        )
    return ToolResponded(
        operation_id=operation_id,
        status=status,
        content=content,
        truncated=truncated,
        artifacts=artifacts,
    )

"""OpenTelemetry spans derived from committed facts (a journal observer).

Nothing in the engine is instrumented: ``SpanBuilder.observe`` sees every fact a hosted
run commits, in commit order, and opens and closes spans at the facts' own times:

    turn  (turn_started .. turn_ended)             gen_ai.operation.name = invoke_agent
    └── run   (run_started .. run_ended)           gen_ai.request.model
        └── step  (step_started .. next step/run end)  chat; gen_ai.usage.input/output_tokens
            └── call  (T1 .. T2)                   execute_tool; gen_ai.tool.name, .call.id
                └── nested call (a code cell's)    the same, under the cell's call span

Each span carries ``lodger.outcome`` (the turn's, run's or call's status; ``rejected`` for
a call refused before dispatch). Arguments and results are never attributes.

Off by default. ``tracer_from_env()`` turns it on when the standard variable
``OTEL_TRACES_EXPORTER`` names an exporter (``console``, or ``otlp`` when the OTLP
exporter package is installed), with ``OTEL_SERVICE_NAME`` and ``OTEL_SDK_DISABLED``
honoured. Tests pass their own tracer (the SDK's ``InMemorySpanExporter``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from lodger.errors import ConfigError
from lodger.events import (
    CallRejected,
    Event,
    ModelOutput,
    RunEnded,
    RunStarted,
    StepStarted,
    ToolDispatched,
    ToolResponded,
    TurnEnded,
    TurnStarted,
)

__all__ = ["SpanBuilder", "tracer_from_env"]


def _ns(event: Event) -> int:
    return event.ts * 1000


class SpanBuilder:
    """Turns a stream of committed facts into spans (see the module docstring)."""

    def __init__(self, tracer: Tracer, provider: Any = None) -> None:
        self.tracer = tracer
        self.provider = provider
        self._turns: dict[str, Span] = {}
        self._runs: dict[str, Span] = {}
        self._steps: dict[str, Span] = {}
        self._step_of_run: dict[str, str] = {}
        self._calls: dict[str, Span] = {}  # by call id (a cell's nested calls hang here)
        self._ops: dict[str, Span] = {}  # by operation id

    def _start(self, name: str, event: Event, parent: Span | None, **attrs: Any) -> Span:
        context = trace.set_span_in_context(parent) if parent is not None else None
        attributes = {"lodger.session.id": event.session_id}
        attributes.update({k: v for k, v in attrs.items() if v is not None})
        return self.tracer.start_span(
            name, context=context, start_time=_ns(event), attributes=attributes
        )

    def observe(self, event: Event) -> None:
        body = event.body
        if isinstance(body, TurnStarted):
            self._turn_started(event)
        elif isinstance(body, RunStarted):
            self._run_started(event, body)
        elif isinstance(body, StepStarted):
            self._step_started(event, body)
        elif isinstance(body, ModelOutput):
            self._model_output(event, body)
        elif isinstance(body, ToolDispatched):
            self._tool_dispatched(event, body)
        elif isinstance(body, ToolResponded):
            self._tool_responded(event, body)
        elif isinstance(body, CallRejected):
            self._call_rejected(event, body)
        elif isinstance(body, RunEnded):
            self._run_ended(event, body)
        elif isinstance(body, TurnEnded):
            self._turn_ended(event, body)

    def _turn_started(self, event: Event) -> None:
        if not event.turn_id:
            return
        self._turns[event.turn_id] = self._start(
            "invoke_agent turn",
            event,
            None,
            **{"gen_ai.operation.name": "invoke_agent", "lodger.turn.id": event.turn_id},
        )

    def _run_started(self, event: Event, body: RunStarted) -> None:
        if not event.run_id:
            return
        self._runs[event.run_id] = self._start(
            "invoke_agent run",
            event,
            self._turns.get(event.turn_id or ""),
            **{
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.request.model": body.model,
                "lodger.run.id": event.run_id,
                "lodger.run.parent": body.parent_run_id,
            },
        )

    def _step_started(self, event: Event, body: StepStarted) -> None:
        if not event.step_id:
            return
        self._end_step(event.run_id, event)
        self._steps[event.step_id] = self._start(
            f"chat {body.model}",
            event,
            self._runs.get(event.run_id or ""),
            **{
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": body.model,
                "lodger.step.index": body.index,
            },
        )
        if event.run_id:
            self._step_of_run[event.run_id] = event.step_id

    def _model_output(self, event: Event, body: ModelOutput) -> None:
        step = self._steps.get(event.step_id or "")
        if step is not None and body.usage is not None:
            step.set_attribute("gen_ai.usage.input_tokens", body.usage.input_tokens)
            step.set_attribute("gen_ai.usage.output_tokens", body.usage.output_tokens)
        if step is not None and body.finish_reason:
            step.set_attribute("gen_ai.response.finish_reasons", [body.finish_reason])

    def _tool_dispatched(self, event: Event, body: ToolDispatched) -> None:
        parent = (
            self._calls.get(event.parent_call_id)
            if event.parent_call_id
            else self._steps.get(event.step_id or "")
        ) or self._runs.get(event.run_id or "")
        span = self._start(
            f"execute_tool {body.tool}",
            event,
            parent,
            **{
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": body.tool,
                "gen_ai.tool.call.id": event.call_id,
                "lodger.operation.id": body.operation_id,
                "lodger.attempt": body.attempt,
                "lodger.origin": event.origin,
            },
        )
        self._ops[body.operation_id] = span
        if event.call_id:
            self._calls[event.call_id] = span

    def _tool_responded(self, event: Event, body: ToolResponded) -> None:
        ended = self._ops.pop(body.operation_id, None)
        if ended is not None:
            ended.set_attribute("lodger.outcome", body.status)
            if body.status != "ok":
                ended.set_status(Status(StatusCode.ERROR, body.status))
            ended.end(end_time=_ns(event))
        if event.call_id:
            self._calls.pop(event.call_id, None)

    def _call_rejected(self, event: Event, body: CallRejected) -> None:
        parent = self._steps.get(event.step_id or "") or self._runs.get(event.run_id or "")
        span = self._start(
            f"execute_tool {body.tool}",
            event,
            parent,
            **{
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": body.tool,
                "gen_ai.tool.call.id": event.call_id,
                "lodger.outcome": "rejected",
                "lodger.rejection": body.reason,
            },
        )
        span.set_status(Status(StatusCode.ERROR, body.reason))
        span.end(end_time=_ns(event))

    def _run_ended(self, event: Event, body: RunEnded) -> None:
        if not event.run_id:
            return
        self._end_step(event.run_id, event)
        run = self._runs.pop(event.run_id, None)
        if run is not None:
            run.set_attribute("lodger.outcome", body.status)
            if body.status not in ("completed", "parked"):
                run.set_status(Status(StatusCode.ERROR, body.status))
            run.end(end_time=_ns(event))

    def _turn_ended(self, event: Event, body: TurnEnded) -> None:
        if not event.turn_id:
            return
        turn = self._turns.pop(event.turn_id, None)
        if turn is not None:
            turn.set_attribute("lodger.outcome", body.status)
            if body.status != "completed":
                turn.set_status(Status(StatusCode.ERROR, body.status))
            turn.end(end_time=_ns(event))

    def _end_step(self, run_id: str | None, event: Event) -> None:
        step_id = self._step_of_run.pop(run_id or "", None)
        step = self._steps.pop(step_id) if step_id in self._steps else None
        if step is not None:
            step.end(end_time=_ns(event))

    def shutdown(self) -> None:
        shutdown = getattr(self.provider, "shutdown", None)
        if callable(shutdown):
            shutdown()


def tracer_from_env(environ: Mapping[str, str] | None = None) -> SpanBuilder | None:
    """A ``SpanBuilder`` exporting where the standard OTel variables say; None when
    tracing is off (the default: ``OTEL_TRACES_EXPORTER`` unset or ``none``)."""
    env = os.environ if environ is None else environ
    exporter_name = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not exporter_name or exporter_name == "none":
        return None
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    exporter: SpanExporter
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif exporter_name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise ConfigError(
                "OTEL_TRACES_EXPORTER=otlp needs the OTLP exporter package",
                hint="pip install opentelemetry-exporter-otlp-proto-http, or use console",
            ) from exc
        exporter = OTLPSpanExporter()
    else:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={exporter_name!r} is not supported here",
            hint="use console, otlp or none",
        )
    provider = TracerProvider(
        resource=Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or "lodger"})
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return SpanBuilder(provider.get_tracer("lodger.host"), provider)

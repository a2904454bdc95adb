"""OpenTelemetry spans derived from committed facts (turn, run, step, call, nested call,
with the GenAI semantic-convention attributes), off unless the OTel variables say so;
and the host's Prometheus metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from lodger import Agent, TestModel
from lodger.engine.settings import Hooks
from lodger.errors import ConfigError
from lodger.host.telemetry import SpanBuilder, tracer_from_env
from lodger.storage import Storage

from ._support import running_host, write_script

CELL = "const r = await tools.echo({text: 'nested'}); return r;"


async def test_spans_follow_the_facts_with_genai_attributes(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = SpanBuilder(provider.get_tracer("test"), provider)
    model = write_script(
        tmp_path / "s.json",
        [
            {
                "calls": [
                    {"name": "echo", "args": {"text": "toplevel-arg"}},
                    {"name": "nope", "args": {}},
                ]
            },
            {"calls": [{"name": "exec", "args": {"code": CELL}}]},
            {"text": "done"},
        ],
    )
    async with (
        running_host(
            tmp_path / "state", models=(model,), observers=(spans.observe,), code_mode="javascript"
        ) as host,
        host.client() as c,
    ):
        sid = await c.create_session()
        sent = await c.send(sid, "go", key="1")
        done = await c.wait_message(sid, sent["message"]["id"])
        assert done["status"] == "done", done
        facts = await c.events(sid)
    dispatched = {
        f.data["body"]["tool"]: f.data["call_id"]
        for f in facts
        if f.kind == "tool_dispatched" and f.data["origin"] != "code_mode"
    }
    finished = {s.name: s for s in exporter.get_finished_spans()}
    by_op: dict[str, list[object]] = {}
    for span in exporter.get_finished_spans():
        by_op.setdefault(str(span.attributes.get("gen_ai.operation.name")), []).append(span)
    turn, run = finished["invoke_agent turn"], finished["invoke_agent run"]
    assert run.parent is not None and run.parent.span_id == turn.context.span_id
    assert run.attributes["gen_ai.request.model"] == f"script:{tmp_path / 's.json'}"
    assert turn.attributes["lodger.outcome"] == "completed"
    steps = [
        s for s in exporter.get_finished_spans() if s.attributes["gen_ai.operation.name"] == "chat"
    ]
    assert len(steps) == 3
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in steps)
    tools = [
        s
        for s in exporter.get_finished_spans()
        if s.attributes["gen_ai.operation.name"] == "execute_tool"
    ]
    by_name = {
        (s.attributes["gen_ai.tool.name"], s.attributes["lodger.outcome"]): s
        for s in tools
        if s.attributes.get("lodger.origin") != "code_mode"
    }
    assert set(by_name) == {("echo", "ok"), ("nope", "rejected"), ("exec", "ok")}
    cell = by_name[("exec", "ok")]
    nested = [s for s in tools if s.attributes.get("lodger.origin") == "code_mode"]
    assert len(nested) == 1 and nested[0].attributes["gen_ai.tool.name"] == "echo"
    assert nested[0].parent is not None and nested[0].parent.span_id == cell.context.span_id
    assert nested[0].start_time >= cell.start_time and nested[0].end_time <= cell.end_time
    top = by_name[("echo", "ok")]
    assert top.attributes["gen_ai.tool.call.id"] == dispatched["echo"]
    assert top.parent is not None and top.parent.span_id == steps[0].context.span_id
    for span in exporter.get_finished_spans():  # no arguments or results as attributes
        assert "toplevel-arg" not in str(dict(span.attributes)) and "nested" not in str(
            dict(span.attributes)
        )


async def test_step_spans_carry_token_usage() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = SpanBuilder(provider.get_tracer("test"), provider)
    async with Agent(
        model=TestModel(), storage=Storage.memory(), hooks=Hooks(on_event=spans.observe)
    ) as agent:
        result = await agent.run("hello there")
    (step,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    usage = result.usage.requests[0]
    assert step.attributes["gen_ai.usage.input_tokens"] == usage.input_tokens > 0
    assert step.attributes["gen_ai.usage.output_tokens"] == usage.output_tokens > 0
    assert step.attributes["gen_ai.request.model"] == agent.model.spec


def test_tracing_is_off_unless_the_otel_variables_turn_it_on() -> None:
    assert tracer_from_env({}) is None
    assert tracer_from_env({"OTEL_TRACES_EXPORTER": "none"}) is None
    assert tracer_from_env({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}) is None
    on = tracer_from_env({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "svc"})
    assert on is not None
    on.shutdown()
    with pytest.raises(ConfigError):
        tracer_from_env({"OTEL_TRACES_EXPORTER": "zipkin"})


async def test_metrics_count_requests_streams_and_commits(tmp_path: Path) -> None:
    model = write_script(
        tmp_path / "s.json", [{"calls": [{"name": "echo", "args": {"text": "x"}}]}, {"text": "ok"}]
    )
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        sent = await c.send(sid, "go", key="1")
        await c.wait_message(sid, sent["message"]["id"])
        async for _ in c.stream(sid, follow=False):
            pass
        text = await c.metrics()
    assert 'lodger_host_requests_total{method="POST",route="/v1/sessions",status="201"} 1' in text
    assert "lodger_host_active_streams 0" in text and "lodger_host_streams_total 1" in text
    assert "lodger_host_turns_total 1" in text
    count = next(
        line for line in text.splitlines() if line.startswith("lodger_host_commit_seconds_count")
    )
    assert int(count.split()[1]) == 2  # the echo call's T1 and T2
    assert sid not in text and host.token not in text

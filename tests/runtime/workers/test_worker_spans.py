"""A worker exports OpenTelemetry spans of the turns it runs (``OTEL_TRACES_EXPORTER``),
built from the facts it commits, like ``lodger serve``: a real ``lodger worker`` process
with the SDK's console exporter, stopped with SIGTERM so it flushes."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from ._workers import Workers, wait_for

pytestmark = pytest.mark.slow


def _spans(stdout: str) -> list[dict[str, Any]]:
    """The console exporter prints each span as an indented JSON object."""
    decoder = json.JSONDecoder()
    spans, at = [], 0
    while (start := stdout.find("{", at)) != -1:
        value, at = decoder.raw_decode(stdout, start)
        if isinstance(value, dict) and "context" in value:
            spans.append(value)
    return spans


def test_a_worker_exports_spans_of_its_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = [{"calls": [{"name": "note", "args": {"tag": "t1"}}]}, {"text": "noted"}]
    (tmp_path / "gate-t1").write_text("")  # the tool need not wait
    script = tmp_path / "script.json"
    script.write_text(json.dumps(steps))
    dsn = str(tmp_path / "control.sqlite3")
    workers = Workers(tmp_path, f"file://{tmp_path / 'objects'}", dsn, script)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "lodger-worker-test")
    try:
        proc = workers.start(capture=True)  # its spans go to stdout
        assert workers.send("traced", "note it").returncode == 0
        wait_for("the turn ended", lambda: any(
            e["body"]["kind"] == "turn_ended" for e in workers.events("traced")
        ) if workers.has_session("traced") else False)  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        workers.stop_all()
    spans = {s["name"]: s for s in _spans(out)}
    events = workers.events("traced")
    (call,) = [e for e in events if e["body"]["kind"] == "tool_dispatched"]
    tool = spans["execute_tool note"]
    assert tool["attributes"]["gen_ai.tool.call.id"] == call["call_id"]
    assert tool["attributes"]["lodger.outcome"] == "ok"
    turn, run = spans["invoke_agent turn"], spans["invoke_agent run"]
    assert turn["attributes"]["lodger.outcome"] == "completed"
    assert run["parent_id"] == turn["context"]["span_id"]
    assert {s["context"]["trace_id"] for s in spans.values()} == {turn["context"]["trace_id"]}
    assert turn["resource"]["attributes"]["service.name"] == "lodger-worker-test"
    assert "t1" not in json.dumps(list(spans.values()))  # arguments are never attributes

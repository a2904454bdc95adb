"""`lodger run --model gemini:...` end to end against a local server speaking Gemini's
streamGenerateContent: the CLI, the agent loop, the google-genai adapter and a real tool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from wire_server import Fail, Stream, WireServer, sse

from lodger.cli import main


def frame(parts: list[dict[str, Any]], finish: str) -> tuple[str | None, str]:
    content = {"role": "model", "parts": parts}
    return sse({"candidates": [{"content": content, "finishReason": finish, "index": 0}]})


def test_run_reads_a_file_through_gemini(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("hello from the workspace\n")
    read = {"functionCall": {"name": "read_file", "args": {"path": "notes.txt"}}}
    with WireServer() as server:
        monkeypatch.setenv("LODGER_GEMINI_BASE_URL", server.base_url)
        server.push(
            Fail(503, {"error": {"code": 503, "message": "overloaded"}}),  # retried
            Stream([frame([{"text": "Reading."}, read | {"thoughtSignature": "c2ln"}], "STOP")]),
            Stream([frame([{"text": "The note says hello."}], "STOP")]),
        )
        result = CliRunner().invoke(
            main,
            [
                "run",
                "what do my notes say?",
                "--model",
                "gemini:gemini-test",
                "--workspace",
                str(ws),
                "--state",
                str(tmp_path / "state"),
                "--session",
                "e2e",
            ],
        )
        requests = [r.body for r in server.requests]
    assert result.exit_code == 0, result.output
    assert "The note says hello." in result.output
    assert len(requests) == 3
    contents = requests[2]["contents"]
    model = next(c for c in contents if c["role"] == "model")
    assert model["parts"][1]["functionCall"] == {"name": "read_file", "args": {"path": "notes.txt"}}
    assert model["parts"][1]["thoughtSignature"] == "c2ln"  # replayed from the log
    response = contents[-1]["parts"][0]["functionResponse"]
    assert response["name"] == "read_file"
    assert "hello from the workspace" in response["response"]["output"]

    shown = CliRunner().invoke(
        main, ["log", "show", "e2e", "--state", str(tmp_path / "state"), "--json"]
    )
    kinds = [e["body"]["kind"] for e in json.loads(shown.output)["events"]]
    assert "provider_retried" in kinds
    assert kinds[-1] == "turn_ended"

"""`lodger run` end to end against a local server that speaks Chat Completions: the CLI,
the agent loop, the real OpenAI SDK adapter and the built-in tools, over a real socket."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from wire_server import Fail, Stream, WireServer, sse

from lodger.cli import main


def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[str | None, str]:
    return sse(
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "gpt-test",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def test_run_reads_a_file_through_a_real_adapter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("hello from the workspace\n")
    call = {"index": 0, "id": "call_abc", "type": "function", "function": {"name": "read_file"}}
    with WireServer() as server:
        server.push(
            Fail(500, {"error": {"message": "try again"}}),  # transient: retried
            Stream(
                [
                    chunk({"role": "assistant", "content": "Reading."}),
                    chunk(
                        {
                            "tool_calls": [
                                call | {"function": {"name": "read_file", "arguments": '{"pa'}}
                            ]
                        }
                    ),
                    chunk(
                        {
                            "tool_calls": [
                                {"index": 0, "function": {"arguments": 'th": "notes.txt"}'}}
                            ]
                        }
                    ),
                    chunk({}, finish="tool_calls"),
                    sse("[DONE]"),
                ]
            ),
            Stream(
                [
                    chunk({"role": "assistant", "content": "The note says "}),
                    chunk({"content": "hello."}),
                    chunk({}, finish="stop"),
                    sse("[DONE]"),
                ]
            ),
        )
        result = CliRunner().invoke(
            main,
            [
                "run",
                "what do my notes say?",
                "--model",
                f"openai-compatible:{server.base_url}/v1#gpt-test",
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
    assert "<- read_file ok" in result.output
    assert len(requests) == 3  # the 500, its retry, and the next step
    follow_up = requests[2]["messages"]
    assistant = next(m for m in follow_up if m["role"] == "assistant")
    assert assistant["tool_calls"][0]["id"] == "call_abc"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"path": "notes.txt"}
    tool = next(m for m in follow_up if m["role"] == "tool")
    assert tool["tool_call_id"] == "call_abc"
    assert "hello from the workspace" in tool["content"]
    names = [t["function"]["name"] for t in requests[1]["tools"]]
    assert names[:3] == ["read_file", "write_file", "edit_file"]

    shown = CliRunner().invoke(
        main, ["log", "show", "e2e", "--state", str(tmp_path / "state"), "--json"]
    )
    kinds = [e["body"]["kind"] for e in json.loads(shown.output)["events"]]
    assert "provider_retried" in kinds
    assert kinds[-1] == "turn_ended"

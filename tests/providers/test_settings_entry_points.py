"""Model settings through the composition: ``lodger.toml`` ``[model_settings]``, the
``lodger run`` flags, and an untrusted project that may only lower ``max_tokens``, over a
real socket to a server speaking Chat Completions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from wire_server import Stream, WireServer, sse

from lodger.cli import main


def answer(text: str) -> Stream:
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

    return Stream([chunk({"role": "assistant", "content": text}), chunk({}, "stop"), sse("[DONE]")])


def run_cli(server: WireServer, tmp_path: Path, ws: Path, *flags: str) -> Any:
    return CliRunner().invoke(
        main,
        [
            "run",
            "hi",
            "--model",
            f"openai-compatible:{server.base_url}/v1#gpt-test",
            "--workspace",
            str(ws),
            "--state",
            str(tmp_path / "state"),
            "--session",
            "s",
            *flags,
        ],
    )


def recorded_settings(tmp_path: Path) -> list[Any]:
    shown = CliRunner().invoke(
        main, ["log", "show", "s", "--state", str(tmp_path / "state"), "--json"]
    )
    events = json.loads(shown.output)["events"]
    return [e["body"]["settings"] for e in events if e["body"]["kind"] == "step_started"]


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("LODGER_MODEL", raising=False)
    path = tmp_path / "ws"
    path.mkdir()
    return path


def test_run_flags_go_over_the_projects_settings_into_the_request(tmp_path: Path, ws: Path) -> None:
    (ws / "lodger.toml").write_text("[model_settings]\ntemperature = 0.2\nmax_tokens = 500\n")
    with WireServer() as server:
        server.push(answer("hello"))
        result = run_cli(
            server, tmp_path, ws, "--trust", "--max-tokens", "77", "--model-setting", "seed=5"
        )
        body = server.requests[0].body
    assert result.exit_code == 0, result.output
    assert body["max_tokens"] == 77
    assert recorded_settings(tmp_path) == [{"temperature": 0.2, "max_tokens": 77, "seed": 5}]


def test_an_untrusted_project_may_only_lower_max_tokens(tmp_path: Path, ws: Path) -> None:
    (ws / "lodger.toml").write_text(
        '[model_settings]\ntemperature = 1.0\nmax_tokens = 50\nextra = { user = "x" }\n'
    )
    with WireServer() as server:
        server.push(answer("hello"))
        result = run_cli(server, tmp_path, ws, "--max-tokens", "400")
        body = server.requests[0].body
    assert result.exit_code == 0, result.output
    assert body["max_tokens"] == 50 and "temperature" not in body and "user" not in body
    assert recorded_settings(tmp_path) == [{"max_tokens": 50}]
    assert "[model_settings] extra, temperature" in result.output


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--model-setting", "temp=1"), "unknown model setting 'temp'"),
        (("--model-setting", "novalue"), "is not KEY=VALUE"),
        (("--temperature", "9"), "temperature must be a number from 0 to 2"),
    ],
)
def test_bad_model_flags_are_a_usage_error_before_any_request(
    tmp_path: Path, ws: Path, flags: tuple[str, ...], message: str
) -> None:
    with WireServer() as server:
        result = run_cli(server, tmp_path, ws, *flags)
        assert server.requests == []
    assert result.exit_code != 0
    assert message in result.output


def test_a_bad_settings_table_in_the_project_names_the_file(tmp_path: Path, ws: Path) -> None:
    (ws / "lodger.toml").write_text("[model_settings]\ntop_p = 2\n")
    with WireServer() as server:
        result = run_cli(server, tmp_path, ws, "--trust")
    assert result.exit_code != 0
    assert "[model_settings] of" in result.output and "top_p" in result.output

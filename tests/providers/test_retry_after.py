"""Provider retries honour ``Retry-After`` (seconds and HTTP-date), add jitter, print one
short line per retry, and say when they gave up: parsed from real HTTP responses of a
loopback server through the official SDKs, and end to end through the ``lodger`` CLI."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from wire_server import Fail, Stream, WireServer, sse

from lodger.cli import main
from lodger.engine.retries import MAX_BACKOFF, retry_delay
from lodger.errors import ProviderError, RateLimitedError
from lodger.providers._errors import parse_retry_after, retry_after_from_headers
from lodger.providers.anthropic import AnthropicModel
from lodger.providers.base import ModelRequest, UserMessage
from lodger.providers.openai_chat import OpenAIChatModel

HELLO = ModelRequest(system="", messages=(UserMessage(text="hi"),))
NOW = 1_800_000_000.0


def test_retry_after_in_seconds_and_as_an_http_date() -> None:
    assert parse_retry_after("7", now=NOW) == 7.0
    assert parse_retry_after(" 0 ", now=NOW) == 0.0
    assert parse_retry_after("1.5", now=NOW) == 1.5
    later = format_datetime(datetime.fromtimestamp(NOW + 30, tz=UTC), usegmt=True)
    assert parse_retry_after(later, now=NOW) == 30.0
    earlier = format_datetime(datetime.fromtimestamp(NOW - 30, tz=UTC), usegmt=True)
    assert parse_retry_after(earlier, now=NOW) == 0.0  # a date in the past: no wait


@pytest.mark.parametrize(
    "value", [None, "", "soon", "-3", "nan", "inf", "Wed, 99 Foo 2015 07:28:00 GMT", "1e999"]
)
def test_a_retry_after_that_is_neither_is_ignored(value: str | None) -> None:
    assert parse_retry_after(value, now=NOW) is None


def test_openai_milliseconds_header_wins_over_seconds() -> None:
    headers = {"retry-after-ms": "250", "retry-after": "9"}
    assert retry_after_from_headers(headers, now=NOW) == 0.25
    assert retry_after_from_headers({"retry-after-ms": "x", "retry-after": "9"}, now=NOW) == 9.0
    assert retry_after_from_headers({}, now=NOW) is None


@given(st.text(max_size=40))
def test_any_header_text_parses_or_is_ignored(value: str) -> None:
    waited = parse_retry_after(value, now=NOW)
    assert waited is None or waited >= 0


@given(
    attempt=st.integers(min_value=1, max_value=40),
    jitter=st.floats(min_value=0, max_value=1),
    after=st.one_of(st.none(), st.floats(min_value=0, max_value=1000)),
)
def test_the_delay_never_undercuts_retry_after_and_jitter_stays_bounded(
    attempt: int, jitter: float, after: float | None
) -> None:
    delay = retry_delay(attempt, base=0.5, retry_after=after, jitter=jitter)
    if after is not None:
        assert after <= delay <= after + max(0.1 * after, 0.5) + 1e-9
    else:
        step = min(0.5 * 2.0 ** (attempt - 1), MAX_BACKOFF)
        assert step / 2 <= delay <= step + 1e-9


def test_jitter_spreads_the_same_attempt() -> None:
    delays = {retry_delay(3, base=0.5, retry_after=None, jitter=j / 10) for j in range(10)}
    assert len(delays) == 10


async def test_openai_adapter_reads_retry_after_from_a_real_429() -> None:
    with WireServer() as server:
        server.push(
            Fail(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "3"}),
            Fail(503, {"error": {"message": "busy"}}),  # no header: the loop's backoff
        )
        model = OpenAIChatModel(model="gpt-test", base_url=f"{server.base_url}/v1", api_key="sk")
        try:
            with pytest.raises(RateLimitedError) as limited:
                await model.complete(HELLO)
            with pytest.raises(ProviderError) as busy:
                await model.complete(HELLO)
        finally:
            await model.aclose()
    assert limited.value.retry_after == 3.0 and limited.value.retryable
    assert busy.value.retry_after is None and busy.value.retryable


async def test_anthropic_adapter_reads_an_http_date_retry_after() -> None:
    when = datetime.now(tz=UTC) + timedelta(seconds=60)
    with WireServer() as server:
        server.push(
            Fail(
                429,
                {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}},
                headers={"Retry-After": format_datetime(when, usegmt=True)},
            )
        )
        model = AnthropicModel(model="claude-test", base_url=server.base_url, api_key="sk")
        try:
            with pytest.raises(RateLimitedError) as caught:
                await model.complete(HELLO)
        finally:
            await model.aclose()
    # whole seconds on the wire, and some time passed since: between 55 and 60 s
    assert caught.value.retry_after is not None and 55 <= caught.value.retry_after <= 60


# ---------------------------------------------------------------- through the CLI


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


ANSWER = Stream(
    [chunk({"role": "assistant", "content": "done"}), chunk({}, finish="stop"), sse("[DONE]")]
)
LIMITED = {"error": {"message": "rate limit reached for requests", "type": "requests"}}


def run_cli(server: WireServer, tmp_path: Path, *extra: str) -> Any:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return CliRunner().invoke(
        main,
        [
            "run",
            "say done",
            "--model",
            f"openai-compatible:{server.base_url}/v1#gpt-test",
            "--workspace",
            str(ws),
            "--state",
            str(tmp_path / "state"),
            "--session",
            "r1",
            *extra,
        ],
    )


def retried_facts(tmp_path: Path) -> list[dict[str, Any]]:
    shown = CliRunner().invoke(
        main, ["log", "show", "r1", "--state", str(tmp_path / "state"), "--json"]
    )
    events = json.loads(shown.stdout)["events"]
    return [e["body"] for e in events if e["body"]["kind"] == "provider_retried"]


def test_the_cli_waits_as_long_as_retry_after_says_and_prints_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with WireServer() as server:
        server.push(Fail(429, LIMITED, headers={"Retry-After": "1"}), ANSWER)
        began = time.monotonic()
        result = run_cli(server, tmp_path)
        took = time.monotonic() - began
        arrivals = len(server.requests)
    assert result.exit_code == 0, result.output
    assert arrivals == 2
    assert took >= 1.0  # it did wait the second the server asked for (no upper bound)
    lines = [line for line in result.output.splitlines() if "retry" in line]
    assert len(lines) == 1, result.output
    assert re.fullmatch(
        r"  ~  retry 1 in 1\.\d s \(Retry-After 1 s\): HTTP 429: .*rate limit.*", lines[0]
    )
    (fact,) = retried_facts(tmp_path)
    assert 1000 <= fact["delay_ms"] <= 1500  # never earlier than asked; jitter at most +0.5 s


@pytest.mark.slow
def test_the_final_failure_says_it_gave_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with WireServer() as server:
        # Retry-After 0: the four retries come at once (plus at most 0.5 s of jitter each)
        server.push(*[Fail(429, LIMITED, headers={"Retry-After": "0"})] * 5)
        result = run_cli(server, tmp_path)
        arrivals = len(server.requests)
    assert result.exit_code == 1
    assert arrivals == 5  # the first try and four retries
    assert len([line for line in result.output.splitlines() if "  ~  retry" in line]) == 4
    assert "turn failed: gave up after 4 retries: " in result.output
    assert len(retried_facts(tmp_path)) == 4


def test_a_retry_after_beyond_the_limit_gives_up_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with WireServer() as server:
        server.push(Fail(429, LIMITED, headers={"Retry-After": "3600"}))
        result = run_cli(server, tmp_path, "--json")
        arrivals = len(server.requests)
    assert result.exit_code == 1 and arrivals == 1
    final = json.loads(result.stdout.splitlines()[-1])
    assert final["type"] == "result" and final["status"] == "failed"
    assert final["error"].startswith(
        "gave up at once (the provider asked to wait 3600 s, more than 120 s): "
    )
    assert retried_facts(tmp_path) == []

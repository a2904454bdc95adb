"""Audit: an MCP server cannot flood lodger. Real hostile servers: raw JSON-RPC over stdio
(``tests/mcp_servers/hostile_server.py``) and over streamable HTTP
(``tests/mcp_servers/hostile_http_server.py``), no SDK on their side.

What a server sends that is not protocol is one line per server on lodger's stderr,
counted, and JSON under ``--json``; a message over ``max_message_bytes`` is never read,
and lodger's memory stays within the bound ``lodger.tools.mcp`` states (measured as the
peak resident size of a real process, ``_mcp_peak.py``)."""

from __future__ import annotations

import itertools
import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lodger.errors import ConfigError
from lodger.runtime.config import load_mcp_servers
from lodger.tools._mcp_limits import DEFAULT_MAX_MESSAGE_BYTES
from lodger.tools.mcp import McpServerConfig

SERVERS = Path(__file__).parent.parent / "mcp_servers"
HOSTILE = str(SERVERS / "hostile_server.py")
HOSTILE_HTTP = str(SERVERS / "hostile_http_server.py")
PEAK = str(Path(__file__).parent / "_mcp_peak.py")
MB = 1024 * 1024


def lodger(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodger", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def stdio(*modes: str, **fields: Any) -> dict[str, Any]:
    return {"name": "h", "command": sys.executable, "args": [HOSTILE, *modes], **fields}


def peak(hostile: dict[str, Any], call: str | None = None) -> dict[str, Any]:
    """What ``_mcp_peak.py`` measured: the peak growth (bytes) past a tame server's."""
    tame = {"name": "t", "command": sys.executable, "args": [HOSTILE]}
    plan = json.dumps({"tame": tame, "hostile": hostile, "call": call})
    done = subprocess.run([sys.executable, PEAK, plan], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    report["growth"] = (report["peak_kb"] - report["baseline_kb"]) * 1024
    report["stderr"] = done.stderr
    return report


# ---------------------------------------------------------------- noise: one line


def test_a_thousand_lines_that_are_not_json_rpc_are_one_line_and_json_under_json(
    tmp_path: Path,
) -> None:
    # 1000 lines that are not JSON-RPC and 50 notifications the SDK cannot validate used
    # to print 1050 tracebacks (about 12 000 lines), as text under --json too.
    spec = f"h={shlex.quote(sys.executable)} {HOSTILE} garbage-flood bad-notes"
    listed = lodger("tools", "list", "--mcp", spec, "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "h__echo" in {row["name"] for row in json.loads(listed.stdout)["tools"]}
    (line,) = listed.stderr.splitlines()
    notice = json.loads(line)
    assert notice["v"] == 1 and notice["level"] == "warning"
    assert notice["notice"].startswith(
        "MCP server 'h': 1000 lines on its stdout were not JSON-RPC and were ignored "
        "(the first: 'debug: starting part 0')"
    )
    assert "the MCP SDK warned 50 times about it" in notice["notice"]

    text = lodger("tools", "list", "--mcp", spec, cwd=tmp_path)
    assert text.returncode == 0, text.stderr[-2000:]
    (line,) = text.stderr.splitlines()
    assert line.startswith("warning: MCP server 'h': 1000 lines on its stdout")


def test_a_quiet_server_prints_nothing(tmp_path: Path) -> None:
    listed = lodger(
        "tools", "list", "--mcp", f"h={shlex.quote(sys.executable)} {HOSTILE}", cwd=tmp_path
    )
    assert listed.returncode == 0 and listed.stderr == ""


# ---------------------------------------------------------------- stdio: memory


def test_a_listing_of_100000_tools_in_one_message_is_not_read() -> None:
    # 14 MB in one line: lodger used to build a model of each of the 100 000 tools before
    # it cut the listing to 2000 (the brief measured 705 MB).
    report = peak(stdio("huge-listing"))
    assert report["outcome"].startswith(
        "did not start: MCP server 'h' did not start: the server's answer has "
    )
    assert f"more than its max_message_bytes ({DEFAULT_MAX_MESSAGE_BYTES})" in report["outcome"]
    assert report["growth"] < 2 * DEFAULT_MAX_MESSAGE_BYTES + 8 * MB, report


def test_a_listing_of_100000_tools_under_a_raised_limit_is_cut_before_the_sdk_models_it() -> None:
    size = 14 * MB  # about what the server sends
    report = peak(stdio("huge-listing", max_message_bytes=16 * MB))
    assert report["tools"] == 2000, report
    assert "lists more than 2000 tools (100004 so far)" in report["stderr"]
    # the stated bound: about 30 times the message while it is parsed (Python's objects);
    # a model of every tool came on top of that (the 705 MB)
    assert report["growth"] < 20 * size, report


def test_a_50_mb_answer_over_stdio_is_an_error_result_and_never_read() -> None:
    # The SDK's reader built the 50 MB line by repeated concatenation (about a minute)
    # and parsed it whole: 256 MB more.
    report = peak(stdio(env={"BIG_MB": "50"}), call="big")
    assert report["outcome"].startswith(
        "error: h__big did not get an answer lodger could read: the server's answer has "
        "52428882 bytes, more than its max_message_bytes"
    )
    assert report["growth"] < 2 * DEFAULT_MAX_MESSAGE_BYTES + 8 * MB, report
    assert "1 messages were larger than its max_message_bytes" in report["stderr"]


def test_an_answer_under_the_limit_is_read_whole() -> None:
    report = peak(stdio(env={"BIG_MB": "3.5"}), call="big")
    assert report["outcome"] == f"ok: {int(3.5 * MB)} characters"
    assert report["growth"] < 30 * 3.5 * MB, report


# ---------------------------------------------------------------- HTTP: memory


@pytest.fixture
def http_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """The hostile HTTP server with the test's modes (``indirect`` parameters)."""
    modes: tuple[str, ...] = request.param
    proc = subprocess.Popen(
        [sys.executable, HOSTILE_HTTP, *modes], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize(
    "http_server", [("big-json=50",), ("big-sse=50",)], indirect=True, ids=["json", "sse"]
)
def test_a_50_mb_answer_over_http_is_an_error_result_and_never_read(http_server: str) -> None:
    # A JSON body was read whole and parsed (245 MB more); an event over the SDK's own
    # 1 MiB was "SSE stream failed", which lodger took for a lost connection.
    report = peak({"name": "h", "url": http_server}, call="big")
    assert report["outcome"].startswith(
        "error: h__big did not get an answer lodger could read: the server's answer is "
        f"larger than its max_message_bytes ({DEFAULT_MAX_MESSAGE_BYTES})"
    )
    assert report["growth"] < 2 * DEFAULT_MAX_MESSAGE_BYTES + 8 * MB, report


@pytest.mark.parametrize("http_server", [("big-sse=3",)], indirect=True, ids=["sse"])
def test_an_event_over_the_sdks_own_megabyte_but_under_the_limit_is_read(
    http_server: str,
) -> None:
    report = peak({"name": "h", "url": http_server}, call="big")
    assert report["outcome"] == "ok: 3000000 characters"
    assert report["growth"] < 30 * 3 * MB, report


@pytest.mark.parametrize("http_server", [("gzip-bomb=50",)], indirect=True, ids=["gzip"])
def test_a_compressed_answer_is_refused_unread(http_server: str) -> None:
    # 50 KB of gzip inflating to 50 MB: no count of the bytes on the wire bounds it.
    report = peak({"name": "h", "url": http_server}, call="big")
    assert "compressed its answer (gzip) though lodger asked for none" in report["outcome"]
    assert report["growth"] < 8 * MB, report


@pytest.mark.parametrize("http_server", [("many-tools=20000",)], indirect=True, ids=["json"])
def test_a_long_listing_over_http_is_parsed_once_and_cut(http_server: str) -> None:
    # 2.8 MB of listing: the SDK's own parsing of it took about 100 MB, its models 150 more.
    report = peak({"name": "h", "url": http_server})
    assert report["tools"] == 2000, report
    assert report["growth"] < 20 * 3 * MB, report


# ---------------------------------------------------------------- the parts


@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    limit=st.integers(min_value=1, max_value=30),
)
def test_lines_split_any_chunking_alike_and_skip_only_the_long_ones(
    lines: list[bytes], cuts: list[int], limit: int
) -> None:
    from lodger.tools._mcp_stdio import _Lines, _Skipped

    stream = b"".join(line + b"\n" for line in lines)
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    splitter = _Lines(limit)
    out: list[bytes | _Skipped] = []
    for start, end in itertools.pairwise(bounds):
        out.extend(splitter.feed(stream[start:end]))
    expected = [
        line if len(line) <= limit else _Skipped(len(line), line[:256], line[-256:])
        for line in lines
    ]
    assert out == expected


@pytest.mark.parametrize(
    ("line", "answered"),
    [
        (b'{"jsonrpc": "2.0", "id": 12, "result": {"content": "' + b"x" * 2000 + b'"}}', 12),
        (b'{"id": "r-1", "jsonrpc": "2.0", "result": {"content": "' + b"x" * 2000 + b'"}}', "r-1"),
        (b'{"result": {"x": "' + b"x" * 2000 + b'"}, "jsonrpc": "2.0", "id": 5}', 5),  # TS order
        (b'{"result": {"x": "' + b"x" * 2000 + b'", "id": 9}}', None),  # an id, not the message's
        (b'{"jsonrpc": "2.0", "id": 4, "method": "roots/list", "params": "' + b"x" * 2000, None),
        (b"x" * 3000, None),
    ],
    ids=["id-first", "id-second", "id-last", "nested-id", "server-request", "no-json"],
)
def test_a_skipped_line_answers_its_request_only_when_its_ends_show_which(
    line: bytes, answered: int | str | None
) -> None:
    from lodger.tools._mcp_stdio import _Lines, _Skipped

    (skipped,) = _Lines(1024).feed(line + b"\n")
    assert isinstance(skipped, _Skipped) and skipped.size == len(line)
    assert skipped.answered() == answered


@pytest.mark.parametrize(
    "message",
    [
        {
            "jsonrpc": "2.0",
            "id": 7,
            "result": {"content": [{"type": "text", "text": "x" * 70_000}]},
        },
        {"jsonrpc": "2.0", "id": "a", "error": {"code": -1, "message": "y", "data": "x" * 70_000}},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "sampling/createMessage",
            "params": {"x": "x" * 70_000},
        },
        {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x" * 70_000}},
    ],
    ids=["response", "error", "request", "notification"],
)
def test_a_long_message_parsed_by_lodger_stands_in_for_the_stub_the_sdk_parsed(
    message: dict[str, Any],
) -> None:
    import mcp_types
    from mcp.shared.message import SessionMessage

    from lodger.tools._mcp_streams import Parsed

    parsed = Parsed()
    text = json.dumps(message).encode()
    stub = parsed.stub(text)
    assert len(stub) < 200
    sdk = mcp_types.jsonrpc_message_adapter.validate_json(stub, by_name=False)
    taken = parsed.take(SessionMessage(sdk))
    assert isinstance(taken, SessionMessage)
    assert taken.message.model_dump(by_alias=True, exclude_unset=True) == message
    # a stub that is not one of ours (a server writing the key itself) is left alone
    forged = mcp_types.jsonrpc_message_adapter.validate_json(stub, by_name=False)
    assert parsed.take(SessionMessage(forged)).message is forged  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the setting


def test_max_message_bytes_is_read_from_lodger_toml_and_checked(tmp_path: Path) -> None:
    (tmp_path / "lodger.toml").write_text(
        '[mcp.servers.a]\ncommand = "x"\nmax_message_bytes = 16777216\n', encoding="utf-8"
    )
    (config,) = load_mcp_servers(tmp_path)
    assert config.max_message_bytes == 16 * MB
    assert McpServerConfig(name="b", command="x").max_message_bytes == 4 * MB
    for bad in ("0", "100", "true", '"4 MiB"', "4.5e6"):
        (tmp_path / "lodger.toml").write_text(
            f'[mcp.servers.a]\ncommand = "x"\nmax_message_bytes = {bad}\n', encoding="utf-8"
        )
        with pytest.raises(ConfigError, match="max_message_bytes"):
            load_mcp_servers(tmp_path)

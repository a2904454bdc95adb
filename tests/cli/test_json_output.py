"""Machine output: `lodger run --json` streams JSON Lines (schema v1), every `--json`
document is an object with `v` and named fields, errors under `--json` are JSON on
stderr with the documented exit code; `--last` and id prefixes work wherever a session
is taken; the demo's state is findable right after `lodger demo`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lodger.cli import main

CATALOG = Path(__file__).parent.parent / "data" / "mcp_catalog.json"

SCRIPT = {
    "turns": [
        [
            {"text": "Reading.", "calls": [{"name": "read_file", "args": {"path": "a.txt"}}]},
            {"text": "It says hello."},
        ],
        [{"text": "Second turn."}],
    ]
}


def lodger(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "lodger", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hello\n")
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    return tmp_path


def run_json(project: Path, *extra: str) -> Any:
    return lodger(
        "run", "what does a.txt say?", "--json", "--model", f"script:{project / 'script.json'}",
        "--workspace", project / "ws", "--state", project / "state", *extra, cwd=project,
    )  # fmt: skip


def test_run_json_streams_versioned_lines_ending_in_the_result(project: Path) -> None:
    proc = run_json(project)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert all(line["v"] == 1 for line in lines)
    assert {line["type"] for line in lines} == {"text", "fact", "result"}
    facts = [line for line in lines if line["type"] == "fact"]
    assert [f["offset"] for f in facts] == list(range(len(facts)))  # every fact, in order
    assert all(f["kind"] == f["event"]["body"]["kind"] for f in facts)
    assert [f["kind"] for f in facts][:2] == ["session_started", "turn_started"]
    assert "".join(line["delta"] for line in lines if line["type"] == "text") == (
        "Reading.It says hello."
    )
    *_, result = lines
    assert result["type"] == "result"
    session = facts[0]["event"]["session_id"]
    assert result["session_id"] == session and result["status"] == "completed"
    assert (result["answer"], result["error"], result["exit_code"]) == ("It says hello.", None, 0)
    assert set(result["usage"]) == {"input_tokens", "output_tokens", "total_tokens", "requests"}
    assert len(result["usage"]["requests"]) == 2
    assert 0 < result["commits"] <= len(facts)
    # the facts are the log: the same events `log show --json` reads back
    shown = lodger("log", "show", session, "--state", project / "state", "--json", cwd=project)
    assert json.loads(shown.stdout)["events"] == [f["event"] for f in facts]

    # a second turn on the same session, named by a prefix of its id
    again = run_json(project, "--session", session[:13])
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout.splitlines()[-1])
    assert (second["session_id"], second["answer"]) == (session, "Second turn.")


def test_errors_under_json_are_json_on_stderr_with_the_exit_code(project: Path) -> None:
    state = project / "state"
    # the real process: one JSON document on stderr, nothing on stdout, no traceback
    proc = lodger("log", "show", "nope", "--state", state, "--json", cwd=project)
    assert (proc.returncode, proc.stdout) == (4, "")
    (line,) = proc.stderr.splitlines()
    missing = json.loads(line)
    assert missing["v"] == 1 and missing["error"]["code"] == "session_not_found"
    assert missing["error"]["session_id"] == "nope" and "--state" in missing["error"]["hint"]
    cases = [
        # (arguments, exit code, error code)
        (["run", "x", "--json", "--last", "--state", state, "--model", "test"], 4, None),
        (["run", "x", "--json", "--model", "nosuch:model", "--workspace", project], 2, "config"),
        (["log", "show", "--json", "--bogus-option"], 2, "usage"),
        (["sessions", "--json", "--state", state, "extra-argument"], 2, "usage"),
        (["log", "show", "s", "--json", "--all", "--turn", "1"], 2, "usage"),
    ]
    for args, exit_code, code in cases:
        result = CliRunner().invoke(main, list(map(str, args)))
        assert result.exit_code == exit_code, (args, result.output)
        assert result.stdout == "", args
        (line,) = result.stderr.splitlines()
        error = json.loads(line)
        assert error["v"] == 1 and isinstance(error["error"]["message"], str)
        assert isinstance(error["error"]["next_steps"], list)
        if code is not None:
            assert error["error"]["code"] == code, error


@pytest.fixture
def demo_state(tmp_path: Path) -> tuple[Path, str]:
    state = tmp_path / "demo-state"
    result = CliRunner().invoke(main, ["demo", "--state", str(state)])
    assert result.exit_code == 0, result.output
    session = re.search(r"inspect: lodger log show (\S+)", result.output).group(1)  # type: ignore[union-attr]
    return state, session


def invoke_json(*args: str | Path) -> dict[str, Any]:
    result = CliRunner().invoke(main, [*map(str, args), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert isinstance(document, dict) and document["v"] == 1, document
    return document  # type: ignore[no-any-return]


def test_every_json_document_is_a_versioned_object_with_named_fields(
    demo_state: tuple[Path, str], tmp_path: Path
) -> None:
    state, session = demo_state
    assert [s["session_id"] for s in invoke_json("sessions", "--state", state)["sessions"]] == [
        session
    ]
    shown = invoke_json("log", "show", session, "--state", state)
    assert shown["session_id"] == session and shown["turns"] == {"count": 1, "shown": [1]}
    assert shown["events"][0]["body"]["kind"] == "session_started"
    assert shown["high_water"] == len(shown["events"])
    timing = invoke_json("log", "show", "--last", "--state", state, "--timing")
    assert timing["session_id"] == session and isinstance(timing["steps"], list)
    verified = invoke_json("log", "verify", session[:8], "--state", state)
    assert verified["ok"] is True and verified["high_water"] == shown["high_water"]
    plan = invoke_json("recover", "--last", "--state", state)
    assert plan["session_id"] == session and "calls" in plan
    listed = invoke_json("tools", "list", "--state", state)
    assert {"tools", "summary", "sandbox"} <= listed.keys()
    found = invoke_json("tools", "search", "create an issue", "--catalog", CATALOG)
    assert {"query", "terms", "results"} <= found.keys()
    forked = invoke_json("fork", "--last", "--as", "f1", "--state", state)
    assert forked["session_id"] == "f1" and forked["parent"]["session_id"] == session


def test_last_and_prefixes_wherever_a_session_is_taken(demo_state: tuple[Path, str]) -> None:
    state, session = demo_state
    runner = CliRunner()
    for args in (
        ["fork", session[:10], "--as", "copy-1"],
        ["fork", "--last", "--as", "copy-2"],
        ["log", "verify", "--last"],
        ["recover", session[:10]],
    ):
        result = runner.invoke(main, [*args, "--state", str(state)])
        assert result.exit_code == 0, (args, result.output)
    # `decide --last CALL_ID`: the one positional is the call; the session is the latest
    # (the fork copy-2; its turn is not open, so the decision is refused, naming it)
    decided = runner.invoke(
        main, ["decide", "--last", "call-9-9", "--completed", "--state", str(state)]
    )
    assert decided.exit_code == 2
    assert "call 'call-9-9' is not part of an interrupted turn of session 'copy-2'" in (
        decided.stderr
    )
    # copy-1 and copy-2 both start with "copy-": a prefix two ids share is refused
    ambiguous = runner.invoke(main, ["fork", "copy-", "--state", str(state), "--json"])
    assert ambiguous.exit_code == 2
    error = json.loads(ambiguous.stderr)["error"]
    assert error["code"] == "ambiguous_session" and "copy-1" in error["message"]


@pytest.mark.slow
def test_the_demo_state_is_findable_right_after_the_demo(tmp_path: Path) -> None:
    # a private temporary directory, so another demo on the machine cannot be the latest
    private = tmp_path / "tmp"
    private.mkdir()
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {"TMPDIR": str(private)}
    demo = lodger("demo", cwd=cwd, env=env)
    assert demo.returncode == 0, demo.stderr
    session = re.search(r"inspect: lodger log show (\S+)", demo.stdout).group(1)  # type: ignore[union-attr]
    listed = lodger("sessions", cwd=cwd, env=env)
    assert listed.returncode == 0
    assert listed.stdout == "no sessions in .lodger\n"
    hint = re.fullmatch(
        r"hint: the latest `lodger demo` kept its session in (\S+): lodger sessions --state \1\n",
        listed.stderr,
    )
    assert hint is not None, listed.stderr
    assert Path(hint.group(1)).parent.parent == private
    found = lodger("sessions", "--state", hint.group(1), "--json", cwd=cwd, env=env)
    assert [s["session_id"] for s in json.loads(found.stdout)["sessions"]] == [session]


WAIT_TOOL = '''
import asyncio
from lodger import tool

@tool
async def wait_long() -> str:
    """Waits half a minute."""
    await asyncio.sleep(30)
    return "finished"
'''


@pytest.mark.slow
def test_an_interrupted_json_run_keeps_stderr_json(tmp_path: Path) -> None:
    (tmp_path / "tools.py").write_text(WAIT_TOOL)
    script = [{"calls": [{"name": "wait_long", "args": {}}]}, {"text": "done"}]
    (tmp_path / "script.json").write_text(json.dumps(script))
    args = [
        sys.executable, "-m", "lodger", "run", "wait", "--json", "--session", "s1",
        "--model", f"script:{tmp_path / 'script.json'}", "--tools", str(tmp_path / "tools.py"),
        "--workspace", str(tmp_path), "--state", str(tmp_path / "state"),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until the call is dispatched (its T1 is a fact line)
        if json.loads(line).get("kind") == "tool_dispatched":
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    lines = [json.loads(line) for line in err.splitlines()]  # every stderr line is JSON
    assert lines[0]["v"] == 1 and lines[0]["notice"].startswith("stopping (Ctrl-C)")
    error = lines[-1]["error"]
    assert (error["code"], error["session_id"]) == ("interrupted", "s1")
    assert error["next_steps"][0]["command"].startswith("lodger resume s1 --state ")
    facts = [json.loads(line) for line in out.splitlines()]
    assert facts[-1]["kind"] == "run_ended"  # the settled call and the run's end, as facts
    assert facts[-1]["event"]["body"]["status"] == "interrupted"

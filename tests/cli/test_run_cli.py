"""``lodger run`` and ``lodger demo`` as a user runs them: real files, a real SQLite log."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from lodger.cli import main

TOOLS_FILE = '''
from lodger import tool

COUNTER = []

@tool(group="custom")
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()
'''


def lodger(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodger", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def test_demo_runs_offline_and_its_log_verifies() -> None:
    proc = lodger("demo")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "turn completed" in out
    assert "shell rejected (denied)" in out
    workspace = Path(re.search(r"workspace: (\S+)", out).group(1))  # type: ignore[union-attr]
    assert "PORT = 4000" in (workspace / "app/config.py").read_text()
    assert "port 4000" in (workspace / "README.md").read_text()
    verify_cmd = re.search(r"verify:\s+lodger (log verify \S+ --state \S+)", out)
    assert verify_cmd is not None
    verified = lodger(*verify_cmd.group(1).split())
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith("ok: session")


def test_run_with_a_script_and_a_tools_file(tmp_path: Path) -> None:
    (tmp_path / "tools.py").write_text(TOOLS_FILE)
    script = [
        {"calls": [{"name": "shout", "args": {"text": "hi"}}]},
        {"calls": [{"name": "write_file", "args": {"path": "out.txt", "content": "HI"}}]},
        {"text": "wrote HI"},
    ]
    (tmp_path / "script.json").write_text(json.dumps(script))
    ws = tmp_path / "ws"
    ws.mkdir()
    state = tmp_path / "state"
    result = CliRunner().invoke(
        main,
        [
            "run",
            "shout hi into out.txt",
            "--model",
            f"script:{tmp_path / 'script.json'}",
            "--tools",
            str(tmp_path / "tools.py"),
            "--workspace",
            str(ws),
            "--state",
            str(state),
            "--session",
            "s1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "<- shout ok HI" in result.output
    assert (ws / "out.txt").read_text() == "HI"
    shown = CliRunner().invoke(main, ["log", "show", "s1", "--state", str(state), "--json"])
    kinds = [e["body"]["kind"] for e in json.loads(shown.output)["events"]]
    assert kinds.count("tool_dispatched") == kinds.count("tool_responded") == 2


def test_run_without_a_model_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", "x", "--state", str(tmp_path)], env={})
    assert result.exit_code == 2
    assert "error: no model given" in result.output
    assert "lodger demo" in result.output


def test_run_with_bad_inputs_prints_one_line_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    bad_spec = runner.invoke(main, ["run", "x", "--model", "nope:x", "--state", str(tmp_path)])
    assert bad_spec.exit_code == 2
    assert "unknown model provider 'nope'" in bad_spec.output
    missing = runner.invoke(
        main,
        ["run", "x", "--model", "script:missing.json", "--state", str(tmp_path)],
    )
    assert missing.exit_code == 2
    assert "does not exist" in missing.output
    (tmp_path / "empty.py").write_text("x = 1\n")
    (tmp_path / "s.json").write_text('[{"text": "x"}]')
    no_tools = runner.invoke(
        main,
        [
            "run",
            "x",
            "--model",
            f"script:{tmp_path / 's.json'}",
            "--tools",
            str(tmp_path / "empty.py"),
            "--state",
            str(tmp_path),
        ],
    )
    assert no_tools.exit_code == 2
    assert "defines no tools" in no_tools.output
    assert "Traceback" not in bad_spec.output + missing.output + no_tools.output

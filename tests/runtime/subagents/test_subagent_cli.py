"""``lodger run --subagents``, the delegation inline in ``lodger log show`` (folded, and
unfolded with ``--children``) and the family in ``lodger sessions --tree``."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from lodger.cli import main

SCRIPT = [
    {"calls": [{"name": "delegate", "args": {"task": "count the files", "tools": ["list_files"]}}]},
    {"text": "all done"},
]


def _run(tmp_path: Path) -> Path:
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a")
    state = tmp_path / "state"
    result = CliRunner().invoke(
        main,
        [
            "run",
            "delegate the count",
            "--model",
            f"script:{tmp_path / 'script.json'}",
            "--subagents",
            "--workspace",
            str(ws),
            "--state",
            str(state),
            "--session",
            "p1",
        ],
    )
    assert result.exit_code == 0, result.output
    return state


def test_run_with_subagents_shows_the_child_inline_and_in_the_tree(tmp_path: Path) -> None:
    state = _run(tmp_path)
    runner = CliRunner()
    listed = json.loads(runner.invoke(main, ["sessions", "--state", str(state), "--json"]).output)[
        "sessions"
    ]
    assert len(listed) == 2
    child_id = next(row["session_id"] for row in listed if row["session_id"] != "p1")

    # the child plays the same script: its delegate call is refused (not in its tools), and
    # its answer is the script's last step
    shown = runner.invoke(main, ["log", "show", "p1", "--state", str(state)])
    assert shown.exit_code == 0, shown.output
    (folded,) = [line for line in shown.output.splitlines() if f"subagent {child_id}" in line]
    assert "completed" in folded and "answer: all done" in folded
    assert "│" not in shown.output

    unfolded = runner.invoke(main, ["log", "show", "p1", "--state", str(state), "--children"])
    assert unfolded.exit_code == 0, unfolded.output
    inner = [line for line in unfolded.output.splitlines() if "│ " in line]
    assert any(f"session {child_id}" in line for line in inner)
    assert any("unknown tool 'delegate'" in line for line in inner)  # not in its subset

    tree = runner.invoke(main, ["sessions", "--state", str(state), "--tree"])
    assert tree.exit_code == 0, tree.output
    lines = tree.output.splitlines()
    assert lines[0].startswith("p1")
    assert lines[1].startswith(f"└─ {child_id}") and "subagent of call" in lines[1]
    as_json = json.loads(
        runner.invoke(main, ["sessions", "--state", str(state), "--tree", "--json"]).output
    )["sessions"]
    parents = {row["session_id"]: (row["parent"], row["relation"]) for row in as_json}
    assert parents == {"p1": (None, "root"), child_id: ("p1", "subagent")}
    # a fork of the child is a fork of it, not a second subagent of p1
    forked = runner.invoke(main, ["fork", child_id, "--as", "f1", "--state", str(state)])
    assert forked.exit_code == 0, forked.output
    as_json = json.loads(
        runner.invoke(main, ["sessions", "--state", str(state), "--tree", "--json"]).output
    )["sessions"]
    assert {r["session_id"]: r["parent"] for r in as_json}["f1"] == child_id
    assert {r["session_id"]: r["relation"] for r in as_json}["f1"] == "fork"


def test_resume_without_subagents_names_the_missing_tool(tmp_path: Path) -> None:
    state = _run(tmp_path)
    # nothing to resume here; the option parses and the session ends as it was
    result = CliRunner().invoke(
        main, ["resume", "p1", "--state", str(state), "--subagents", "2", "--model", "test"]
    )
    assert result.exit_code != 0
    assert "no interrupted turn" in result.output

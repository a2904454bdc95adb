"""``lodger run --code-mode``: the exec tool is bound, a cell reads workspace files through
nested calls, and ``lodger log show`` hangs the nested calls under their cell."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from lodger.cli import main

CELL = (
    "const names = ['a.txt', 'b.txt'];\n"
    "const texts = await Promise.all(names.map((path) => tools.read_file({path})));\n"
    "return texts.map((t) => JSON.stringify(t).length);"
)


def test_run_with_code_mode_and_show_the_cell(tmp_path: Path) -> None:
    script = [{"calls": [{"name": "exec", "args": {"code": CELL}}]}, {"text": "read both"}]
    (tmp_path / "script.json").write_text(json.dumps(script))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    (ws / "b.txt").write_text("beta\n")
    state = tmp_path / "state"
    common = ["--state", str(state)]
    result = CliRunner().invoke(
        main,
        [
            "run", "read a and b", "--model", f"script:{tmp_path / 'script.json'}",
            "--workspace", str(ws), "--session", "s1", "--code-mode", *common,
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    shown = CliRunner().invoke(main, ["log", "show", "s1", "--json", *common])
    events = json.loads(shown.output)["events"]
    cell = next(
        e for e in events if e["body"]["kind"] == "tool_dispatched" and e["body"]["tool"] == "exec"
    )
    nested = [e for e in events if e.get("parent_call_id") == cell["call_id"]]
    assert sorted(e["body"]["tool"] for e in nested if e["body"]["kind"] == "tool_dispatched") == [
        "read_file",
        "read_file",
    ]
    text = CliRunner().invoke(main, ["log", "show", "s1", *common]).output
    assert "[code_mode, hidden]" in text

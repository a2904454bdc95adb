"""``--store URL`` / ``LODGER_STORE`` and ``lodger fork`` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from lodger.cli import main

SCRIPT = [
    {"calls": [{"name": "write_file", "args": {"path": "out.txt", "content": "HI"}}]},
    {"text": "wrote HI"},
]


def _run(tmp_path: Path, *store_args: str, env: dict[str, str] | None = None) -> None:
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    result = CliRunner(env=env).invoke(
        main,
        [
            "run",
            "write HI",
            "--model",
            f"script:{tmp_path / 'script.json'}",
            "--workspace",
            str(ws),
            "--session",
            "s1",
            "--yes",
            *store_args,
        ],
    )
    assert result.exit_code == 0, result.output
    assert (ws / "out.txt").read_text() == "HI"


def test_run_verify_and_fork_on_a_file_object_store(tmp_path: Path) -> None:
    objects = tmp_path / "objects"
    url = f"file://{objects}"
    _run(tmp_path, "--store", url, "--state", str(tmp_path / "unused"))
    assert not (tmp_path / "unused").exists()  # nothing went to the state directory
    assert any((objects / "sessions" / "s1" / "seg").iterdir())
    runner = CliRunner(env={"LODGER_STORE": url})
    verified = runner.invoke(main, ["log", "verify", "s1"])
    assert verified.exit_code == 0, verified.output
    assert verified.output.startswith("ok: session")
    forked = runner.invoke(main, ["fork", "s1", "--at", "3", "--as", "s2", "--json"])
    assert forked.exit_code == 0, forked.output
    made = json.loads(forked.output)
    assert made["session_id"] == "s2"
    assert made["parent"]["session_id"] == "s1" and made["parent"]["high_water"] == 3
    listed = runner.invoke(main, ["sessions", "--json"])
    assert {s["session_id"] for s in json.loads(listed.output)["sessions"]} == {"s1", "s2"}
    assert runner.invoke(main, ["log", "verify", "s2"]).exit_code == 0


def test_fork_on_the_sqlite_state_dir_and_past_the_head(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    _run(tmp_path, "--state", state)
    runner = CliRunner()
    forked = runner.invoke(main, ["fork", "s1", "--as", "s2", "--state", state])
    assert forked.exit_code == 0, forked.output
    assert "into s2" in forked.output and "nothing copied" in forked.output
    beyond = runner.invoke(main, ["fork", "s1", "--at", "999", "--state", state])
    assert beyond.exit_code == 2
    assert "cannot fork session 's1' at offset 999" in beyond.output


def test_bad_store_url_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["sessions", "--store", "ftp://nowhere/x?secret=1"])
    assert result.exit_code == 2
    assert "unknown scheme 'ftp'" in result.output
    assert "secret" not in result.output  # the query string is never shown

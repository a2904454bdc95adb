"""Every hint and next step names the storage the command was given, and ``resume``
reads the store it is pointed at (it opened ``.lodger`` whatever ``--store`` said)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from lodger.cli import main
from lodger.cli._common import storage_flags
from lodger.runtime import StorageLocation

SCRIPT = [
    {"calls": [{"name": "write_file", "args": {"path": "out.txt", "content": "HI"}}]},
    {"text": "wrote HI"},
]


def _runner() -> CliRunner:
    return CliRunner(env={"LODGER_STORE": None, "LODGER_CONTROL": None, "COLUMNS": "300"})


def _run(tmp_path: Path, *where: str) -> str:
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    result = _runner().invoke(
        main,
        ["run", "write HI", "--model", f"script:{tmp_path / 'script.json'}",
         "--workspace", str(ws), "--session", "s1", "--yes", *where],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return result.output


def test_run_on_a_store_says_how_to_inspect_it_there(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'objects'}"
    out = _run(tmp_path, "--store", url)
    assert f"inspect: lodger log show s1 --store {url}" in out
    shown = _runner().invoke(main, ["log", "show", "s1", "--store", url])
    assert shown.exit_code == 0, shown.output  # the printed command works as printed


def test_resume_reads_the_store_it_is_given_not_the_state_directory(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'objects'}"
    _run(tmp_path, "--store", url)
    resumed = _runner().invoke(
        main, ["resume", "s1", "--store", url, "--model", f"script:{tmp_path / 'script.json'}"]
    )
    # before: "no log for session 's1'" (exit 4), read from ./.lodger
    assert resumed.exit_code == 2, resumed.output
    assert "has no interrupted turn" in resumed.output
    assert f'next: lodger run "TASK" --session s1 --store {url}' in resumed.output


def test_error_next_steps_name_the_state_directory_and_the_store(tmp_path: Path) -> None:
    state = tmp_path / "my state"
    _run(tmp_path, "--state", str(state))
    again = _runner().invoke(
        main,
        ["resume", "s1", "--state", str(state), "--model", f"script:{tmp_path / 'script.json'}"],
    )  # fmt: skip
    assert again.exit_code == 2, again.output
    # quoted, so the printed command survives the space in the path
    assert f"next: lodger run \"TASK\" --session s1 --state '{state}'" in again.output
    url = f"file://{tmp_path / 'objects'}"
    verify = _runner().invoke(main, ["log", "verify", "s9", "--json", "--store", url])
    error = json.loads(verify.output)["error"]  # not found there: the next step names it
    assert [step["command"] for step in error["next_steps"]] == [f"lodger sessions --store {url}"]


def test_flags_never_print_a_control_planes_password() -> None:
    where = StorageLocation(
        state="st", store="s3://b/p?endpoint=http://h:9000",
        control="postgresql://lodger:s3cret@db:5432/lodger",
    )  # fmt: skip
    flags = storage_flags(where)
    assert "s3cret" not in flags
    assert flags == (
        " --state st --store 's3://b/p?endpoint=http://h:9000'"
        " --control postgresql://lodger:PASSWORD@db:5432/lodger"
    )
    keywords = storage_flags(StorageLocation(control="host=db password=hunter2 dbname=x"))
    assert "hunter2" not in keywords and "password=PASSWORD" in keywords
    assert storage_flags(StorageLocation()) == ""

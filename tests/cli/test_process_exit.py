"""A lodger process that loaded obstore leaves with ``os._exit`` once its command is done
(obstore's Rust runtime threads can abort the interpreter's teardown, exit 134), after
running the exit handlers and flushing its output, with the command's exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import atexit, sys
import obstore  # what a command on an object store loads
marker = sys.argv[1]
atexit.register(lambda: open(marker, "w").write("handlers ran"))


class TornDown:  # finalized only by the interpreter's teardown
    def __del__(self, _open=open, _path=marker + ".teardown"):
        with _open(_path, "w") as out:
            out.write("teardown ran")


kept = TornDown()
from lodger.cli import main
sys.argv = ["lodger", *sys.argv[2:]]
main()
"""


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    marker = tmp_path / "marker"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(marker), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done, marker


def test_a_done_command_runs_its_exit_handlers_and_keeps_its_output(tmp_path: Path) -> None:
    done, marker = _run(tmp_path, "--version")
    assert done.returncode == 0, done.stderr
    assert "lodger" in done.stdout
    assert marker.read_text() == "handlers ran"
    # ... and the interpreter's teardown, where obstore's threads could abort it, is skipped
    assert not Path(f"{marker}.teardown").exists()


def test_a_failing_command_keeps_its_exit_code_and_its_error(tmp_path: Path) -> None:
    done, marker = _run(tmp_path, "log", "show", "nope", "--state", str(tmp_path / "empty"))
    assert done.returncode == 4, (done.stdout, done.stderr)  # not found
    assert "error:" in done.stderr
    assert marker.read_text() == "handlers ran"


TOOLS_FILE = """
import os
from lodger import tool
{imports}

# a module-level log file a user's tools may keep open (buffered, never flushed by hand)
LOG = open(os.environ["USER_TOOLS_LOG"], "a")
LOG.write("imported\\n")


@tool
def note(text: str) -> str:
    \"\"\"Remember a line.\"\"\"
    LOG.write(text + "\\n")
    return "ok"
"""


@pytest.mark.parametrize("imports", ["", "import obstore  # then lodger leaves with os._exit"])
def test_a_command_that_ran_a_users_tools_file_keeps_what_it_left_unflushed(
    tmp_path: Path, imports: str
) -> None:
    """The interpreter's teardown flushes a file object user code left open: a command
    that loaded a tools file keeps it (and flushes such files itself where the object
    store makes it leave without that teardown)."""
    tools, script, log = tmp_path / "tools.py", tmp_path / "script.json", tmp_path / "user.log"
    tools.write_text(TOOLS_FILE.replace("{imports}", imports))
    script.write_text(
        '[{"calls": [{"name": "note", "args": {"text": "from the tool"}}]}, {"text": "done"}]'
    )
    (tmp_path / "ws").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "lodger", "run", "remember", "--model", f"script:{script}",
         "--tools", str(tools), "--workspace", str(tmp_path / "ws"),
         "--state", str(tmp_path / "state"), "--yes"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "USER_TOOLS_LOG": str(log)},
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert log.read_text() == "imported\nfrom the tool\n"

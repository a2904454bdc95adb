"""The cycle collector's schedule: tuned in processes the ``lodger`` command owns, left
alone for a program that embeds lodger (or a test runner that invokes the command)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

from click.testing import CliRunner

from lodger._core.collector import YOUNG_THRESHOLD, tune_owned_process
from lodger.cli import main

# the command line as the console script runs it, reporting the young threshold it
# left when the process exits (``lodger`` leaves through atexit, then os._exit)
_PROBE = (
    "import atexit, gc, sys\n"
    "atexit.register(lambda: print('young', gc.get_threshold()[0], flush=True))\n"
    "sys.argv = ['lodger', '--version']\n"
    "from lodger.cli import main\n"
    "main()\n"
)


def _young_threshold_of_the_command(**env: str) -> int:
    environ = {k: v for k, v in os.environ.items() if k != "LODGER_COLLECTOR"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={**environ, **env},
        timeout=60,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("young ")]
    assert lines, done.stdout + done.stderr
    return int(lines[-1].split()[1])


def test_the_command_collects_the_young_generation_less_often() -> None:
    assert _young_threshold_of_the_command() == YOUNG_THRESHOLD


def test_lodger_collector_default_keeps_the_interpreters_schedule() -> None:
    fresh = subprocess.run(
        [sys.executable, "-c", "import gc; print(gc.get_threshold()[0])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert _young_threshold_of_the_command(LODGER_COLLECTOR="default") == int(fresh.stdout)
    assert int(fresh.stdout) < YOUNG_THRESHOLD


def test_a_runner_invoking_the_command_keeps_its_own_schedule() -> None:
    before = gc.get_threshold()
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    assert gc.get_threshold() == before


def test_tuning_leaves_the_older_generations_and_a_disabled_collector_alone() -> None:
    before, enabled = gc.get_threshold(), gc.isenabled()
    try:
        gc.set_threshold(700, 11, 12)
        assert tune_owned_process({}) is True
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 11, 12)
        assert tune_owned_process({}) is False  # already as high: nothing changes
        gc.set_threshold(700, 11, 12)
        assert tune_owned_process({"LODGER_COLLECTOR": " Default "}) is False
        assert gc.get_threshold() == (700, 11, 12)
        gc.disable()
        assert tune_owned_process({}) is False
        assert gc.get_threshold() == (700, 11, 12)
    finally:
        gc.set_threshold(*before)
        if enabled:
            gc.enable()

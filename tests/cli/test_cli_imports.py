"""What the log commands import at start-up: not the engine (``lodger log``, ``lodger
sessions`` read and render facts; the usage line imports what it needs when it is made)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_the_log_commands_start_without_the_engine() -> None:
    code = (
        "import sys, lodger.cli._log; "
        "print(sorted(m for m in ('lodger.runtime.agent', 'lodger.engine.loop') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    assert done.stdout.strip() == "[]", done.stdout
    from lodger.cli._render import usage_of

    assert usage_of([]).requests == ()  # the engine's RunUsage, imported on first use

"""Ctrl-C during `lodger run`: the running call settles and is recorded, the turn ends
"cancelled", and the command exits 130 with one line. A real process and a real SIGINT."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

TOOLS = '''
import asyncio
from lodger import tool

@tool
async def wait_long() -> str:
    """Waits half a minute."""
    await asyncio.sleep(30)
    return "finished"
'''


def test_sigint_settles_the_running_call_and_records_the_turn(tmp_path: Path) -> None:
    (tmp_path / "tools.py").write_text(TOOLS)
    script = [{"calls": [{"name": "wait_long", "args": {}}]}, {"text": "never reached"}]
    (tmp_path / "script.json").write_text(json.dumps(script))
    state = tmp_path / "state"
    args = [
        sys.executable, "-m", "lodger", "run", "wait", "--session", "s1",
        "--model", f"script:{tmp_path / 'script.json'}", "--tools", str(tmp_path / "tools.py"),
        "--workspace", str(tmp_path), "--state", str(state),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    for line in proc.stdout:  # wait until the call is dispatched
        if "-> wait_long" in line:
            break
        assert time.monotonic() < deadline
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert time.monotonic() - started < 10  # the 30 s tool was stopped, not waited for
    assert err.strip().splitlines()[-1] == "interrupted"
    assert "Traceback" not in err

    shown = subprocess.run(
        [sys.executable, "-m", "lodger", "log", "show", "s1", "--state", str(state), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    events = json.loads(shown.stdout)
    responded = [e["body"] for e in events if e["body"]["kind"] == "tool_responded"]
    assert [r["status"] for r in responded] == ["cancelled"]
    assert events[-1]["body"]["kind"] == "turn_ended"
    assert events[-1]["body"]["status"] == "cancelled"

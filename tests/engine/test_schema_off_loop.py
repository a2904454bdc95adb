"""The full JSON-schema check's first run (jsonschema: about 0.1 s of imports, then a
compile per schema) never happens on the event loop: the quick check answers there, and
what it cannot vouch for is checked on a worker thread until the schema's validator is
compiled (see test_schema_inline.py). Run in a fresh interpreter, so the first import
is the one watched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import asyncio, json, sys, threading
from lodger.runtime.agent import Agent
from lodger.providers.scripted import ScriptedModel
from lodger.storage import EventLog, MemoryArtifactStore, SqliteLogStore, Storage
from lodger.runtime.builtin import workspace_tools

watching = False
seen = []


class Watch:
    def find_spec(self, name, path, target=None):
        if watching and name == "jsonschema":
            seen.append(threading.current_thread() is threading.main_thread())
        return None


sys.meta_path.insert(0, Watch())
state, workspace = sys.argv[1], sys.argv[2]
script = [{"calls": [{"name": "read_file", "args": {"path": 5}}]}, {"text": "done"}]


async def turn():
    global watching
    storage = Storage(log=EventLog(SqliteLogStore(state)), artifacts=MemoryArtifactStore())
    agent = Agent(model=ScriptedModel(script), tools=workspace_tools(), storage=storage,
                  workspace=workspace)
    watching = "jsonschema" not in sys.modules
    try:
        result = await agent.run("read it", session="s1")
    finally:
        await agent.close()
    return result.status


status = asyncio.run(turn())
print(json.dumps({"status": status, "seen": seen, "loaded": "jsonschema" in sys.modules}))
"""


def test_a_call_the_quick_check_refuses_is_checked_off_the_loop(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "state"), str(tmp_path / "ws")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["status"] == "completed" and out["loaded"]  # the bad call needed jsonschema
    assert out["seen"] == [False], out  # imported once, on a worker thread

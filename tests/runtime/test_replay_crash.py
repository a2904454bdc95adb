"""A replay killed with SIGKILL in the middle of a call: nothing ran in the world, the
replay's log verifies, its call is not run again by anyone (the replay's session refuses
a resume with the real tools), it can be abandoned, and the source replays again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lodger.errors import UsageError
from lodger.events import ReplayStarted, ToolDispatched, ToolResponded
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.replay import replay
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage
from lodger.tools import tool

pytestmark = pytest.mark.slow

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    from lodger.providers.scripted import ScriptedModel
    from lodger.runtime.replay import replay
    from lodger.runtime.sessions import Binding, Sessions
    from lodger.storage import Storage
    from lodger.tools import tool

    root = Path(sys.argv[1])

    @tool(writes=True)
    def notify(message: str) -> str:
        "Tell the team."
        with (root / "effects.log").open("a") as f:
            f.write(message + "\\n")
        return "told"

    @tool(recovery="idempotent")
    async def wait_for(name: str) -> str:
        "Wait for a file."
        (root / "waiting").write_text("yes")
        while not (root / name).exists():
            await asyncio.sleep(0.05)
        return "there"

    async def main():
        steps = json.loads(sys.argv[2])
        async with Sessions(Storage.local(root / "state")) as sessions:
            binding = Binding(model=ScriptedModel(steps), tools=[notify, wait_for])
            await replay(sessions, "src", binding=binding, session="replay-1")

    asyncio.run(main())
    """
)


def make_tools(root: Path) -> list[object]:
    @tool(writes=True)
    def notify(message: str) -> str:
        "Tell the team."
        with (root / "effects.log").open("a") as f:
            f.write(message + "\n")
        return "told"

    @tool(recovery="idempotent")
    async def wait_for(name: str) -> str:
        "Wait for a file."
        return "there"

    return [notify, wait_for]


def kill_mid_call(root: Path, steps: list[dict[str, object]]) -> None:
    """Run the replay in a child process and SIGKILL it once its live call is running."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with (root / "child.err").open("wb") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), json.dumps(steps)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        deadline = time.monotonic() + 60
        try:
            while not (root / "waiting").exists():
                assert child.poll() is None, (root / "child.err").read_text()
                assert time.monotonic() < deadline, "the replay never reached its live call"
                time.sleep(0.05)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)


async def test_a_replay_killed_mid_call_leaves_no_effect_and_no_rerun(tmp_path: Path) -> None:
    tools = make_tools(tmp_path)
    source = [{"calls": [{"name": "notify", "args": {"message": "once"}}]}, {"text": "done"}]
    async with Sessions(Storage.local(tmp_path / "state")) as sessions:
        binding = Binding(model=ScriptedModel(source), tools=tools)  # type: ignore[arg-type]
        await sessions.run("go", binding=binding, session="src")
    assert (tmp_path / "effects.log").read_text() == "once\n"

    steps = [
        {"calls": [{"name": "notify", "args": {"message": "once"}}]},
        {"calls": [{"name": "notify", "args": {"message": "twice"}}]},
        {"calls": [{"name": "wait_for", "args": {"name": "never"}}]},
        {"text": "replayed"},
    ]
    await asyncio.to_thread(kill_mid_call, tmp_path, steps)

    assert (tmp_path / "effects.log").read_text() == "once\n"  # nothing ran in the world
    async with Sessions(Storage.local(tmp_path / "state")) as sessions:
        events = await sessions.storage.log.read_all("replay-1")  # verifies the chain
        assert isinstance(events[1].body, ReplayStarted)
        waiting = [e.body for e in events if isinstance(e.body, ToolDispatched)][-1]
        assert waiting.tool == "wait_for" and waiting.recovery == "never_retry"
        assert not any(
            isinstance(e.body, ToolResponded) and e.body.operation_id == waiting.operation_id
            for e in events
        )
        binding = Binding(model=ScriptedModel(steps), tools=tools)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="is a replay of 'src'"):
            await sessions.resume("replay-1", binding=binding)
        ended = await sessions.abandon("replay-1", reason="killed replay")
        assert ended[-1].kind == "turn_ended"
        again = await replay(
            sessions,
            "src",
            binding=Binding(model=ScriptedModel(source), tools=tools),  # type: ignore[arg-type]
        )
        assert again.report.diverged_at is None
    assert (tmp_path / "effects.log").read_text() == "once\n"

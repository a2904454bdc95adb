"""A crash during a compaction's model call leaves the log as it was: a real child
process (``compaction_world.py``) is SIGKILLed while its second summary is being
written; the log verifies, holds the first compaction only, the projection is the one
before the crash, and the resume chains its compaction from the last committed one."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from compaction_world import SECRET, World, agent, policy

from lodger.context import project_messages
from lodger.engine.checkpoint import open_fold
from lodger.errors import UsageError
from lodger.events import Compacted, CompactionFailed
from lodger.providers.base import UserMessage
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage

WORLD = Path(__file__).with_name("compaction_world.py")


def _kill_during_the_second_summary(state: Path) -> None:
    marker = state.parent / "summarizing"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    errors = state.parent / "child.err"
    with errors.open("wb") as sink:
        child = subprocess.Popen(
            [sys.executable, str(WORLD), str(state), "crash"],
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=env,
        )
    try:
        deadline = time.monotonic() + 90
        while not marker.exists():
            if child.poll() is not None:
                raise AssertionError(errors.read_text())
            if time.monotonic() > deadline:
                raise AssertionError("the child never reached its second summary")
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.slow
async def test_a_sigkill_during_the_summary_leaves_the_last_committed_compaction(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    await asyncio.to_thread(_kill_during_the_second_summary, state)
    storage = Storage.local(state)
    try:
        await storage.log.verify("s")
        events = await storage.log.read_all("s")
        compactions = [e for e in events if isinstance(e.body, Compacted)]
        assert len(compactions) == 1  # the second was being written: nothing of it is there
        assert not any(isinstance(e.body, CompactionFailed) for e in events)
        assert events[-1].kind == "tool_responded"  # killed at the step boundary after it
        fold = await open_fold(storage.log, "s")
        projected = tuple(fold.projector.project().messages)
        assert projected == tuple(project_messages(events).messages)
        first = compactions[0].body
        assert isinstance(first, Compacted)
        head = projected[0]
        assert isinstance(head, UserMessage) and first.summary in head.text
        # the interrupted run is still open: a manual compaction is refused, clearly
        sessions = Sessions(storage)
        with pytest.raises(UsageError) as running:
            await sessions.compact("s", binding=Binding(model="test"))
        assert running.value.code == "session_running"
        # the resume's compaction chains from the committed one: its summary is in the
        # transcript the summarizer reads, and the turn completes with the fact
        world = World(steps=60)
        async with agent(storage, world, policy(threshold_tokens=6000, budget_tokens=9000)) as a:
            result = await a.resume("s")
            after = await a.log.read_all("s")
        assert result.status == "completed", result.error
        assert result.answer == f"the secret code is {SECRET}"
        assert first.summary in world.transcripts[0]
        chained = [e for e in after[len(events) :] if isinstance(e.body, Compacted)]
        assert chained and chained[0].body.previous == compactions[0].offset
        await storage.log.verify("s")
    finally:
        await storage.close()

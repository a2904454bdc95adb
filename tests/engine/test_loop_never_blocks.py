"""Nothing blocks the event loop: a whole turn runs under asyncio's debug mode, which
logs every callback that holds the loop longer than ``slow_callback_duration``."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from lodger.agent import Agent
from lodger.cli._run import DEMO_FILES, DEMO_SCRIPT
from lodger.engine.permissions import PermissionPolicy
from lodger.providers.scripted import ScriptedModel
from lodger.storage import EventLog, SqliteLogStore
from lodger.tools.builtin import workspace_tools

SLOW_S = 0.05


def test_a_turn_with_file_tools_never_blocks_the_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    workspace = tmp_path / "ws"
    for rel, content in DEMO_FILES.items():
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_text(content * 2000)  # big enough for real file I/O

    async def turn() -> str:
        loop = asyncio.get_running_loop()
        loop.slow_callback_duration = SLOW_S
        agent = Agent(
            model=ScriptedModel(DEMO_SCRIPT),
            tools=workspace_tools(),
            log=EventLog(SqliteLogStore(tmp_path / "state")),
            workspace=workspace,
            permissions=PermissionPolicy(approve_all=True),
        )
        try:
            return (await agent.run("move the port", session="s1")).status
        finally:
            await agent.close()

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        status = asyncio.run(turn(), debug=True)
    assert status == "completed"
    slow = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert slow == [], slow


def test_the_detector_catches_a_blocking_tool(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import time

    from lodger.tools import tool

    @tool
    async def blocks() -> str:
        """A badly written async tool that sleeps on the loop."""
        time.sleep(SLOW_S * 2)  # noqa: ASYNC251 - the point of this test
        return "done"

    async def turn() -> None:
        asyncio.get_running_loop().slow_callback_duration = SLOW_S
        agent = Agent(
            model=ScriptedModel([{"calls": [{"name": "blocks"}]}, {"text": "ok"}]),
            tools=[blocks],
            log=EventLog(SqliteLogStore(tmp_path / "state")),
        )
        try:
            await agent.run("go", session="s1")
        finally:
            await agent.close()

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        asyncio.run(turn(), debug=True)
    assert any("took" in r.getMessage() for r in caplog.records)


def test_opening_a_long_session_keeps_the_loop_free(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from lodger.events import EventDraft, TurnStarted

    async def build_and_open() -> int:
        log = EventLog(SqliteLogStore(tmp_path / "state"))
        writer = await log.open_writer("long")
        drafts = [
            EventDraft(id=f"e{i}", ts=i, body=TurnStarted(input="x" * 200)) for i in range(20_000)
        ]
        for i in range(0, len(drafts), 2_000):
            await writer.append(drafts[i : i + 2_000], expected_offset=i)
        await writer.close()
        asyncio.get_running_loop().slow_callback_duration = SLOW_S
        caplog.clear()
        reopened = await log.open_writer("long")  # verifies all 20k events
        high_water = reopened.head.high_water
        await reopened.close()
        await log.close()
        # Freeing this test's 20k events when the coroutine returns takes tens of ms on
        # a loaded machine; that is the test's garbage, not lodger blocking the loop.
        asyncio.get_running_loop().slow_callback_duration = 3600
        return high_water

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        assert asyncio.run(build_and_open(), debug=True) == 20_000
    slow = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert slow == [], slow

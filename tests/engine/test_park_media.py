"""A result made before any step of its run loaded the session's media (a turn parked on
a budget by an agent that opened the session fresh) still hands back the context with its
images: the engine reads them first instead of failing on media it had not loaded.
Found writing the schema 8 golden log: budgets and media met there first. Real SQLite.
"""

from __future__ import annotations

from pathlib import Path

from lodger import Agent, BinaryContent, ScriptedModel
from lodger.engine.budgets import UsageLimits
from lodger.engine.settings import Limits
from lodger.providers.base import UserMessage

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(24))


async def test_a_fresh_agent_parks_a_turn_of_a_session_with_an_image(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with Agent(model=ScriptedModel([{"text": "a dot"}]), storage=state) as agent:
        first = await agent.run(["what is this?", BinaryContent(PNG, "image/png")], session="s")
    assert first.status == "completed"
    limits = Limits(usage=UsageLimits(request_limit=0))
    async with Agent(model=ScriptedModel([]), storage=state, limits=limits) as fresh:
        parked = await fresh.run("and now?", session="s")
    assert parked.status == "parked" and parked.budget is not None
    images = [p.data for m in parked.messages if isinstance(m, UserMessage) for p in m.parts]
    assert images == [PNG]

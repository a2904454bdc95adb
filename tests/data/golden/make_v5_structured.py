"""Writes ``v5_structured.jsonl`` through the real writer (run once; never regenerate a
shipped golden): a turn with an output type whose first answer fails validation
(``output_rejected``), whose before-call hook vetoes one call (``call_rejected`` reason
``vetoed``), and whose second answer ends the turn with ``turn_ended.output``.

    PYTHONPATH=src python tests/data/golden/make_v5_structured.py
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from pydantic import BaseModel

from lodger import Agent, CallInfo, ScriptedModel, Veto, tool
from lodger.engine.settings import Hooks, Services
from lodger.ids import ManualClock, SequentialIds
from lodger.storage import EventLog, MemoryArtifactStore, MemoryLogStore, Storage

SESSION = "golden-v5"
SCRIPT = [
    {
        "calls": [
            {"name": "measure", "args": {"city": "Oslo"}},
            {"name": "measure", "args": {"city": "Atlantis"}},
        ]
    },
    {"text": "It is 3 degrees in Oslo."},
    {"text": '{"city": "Oslo", "celsius": 3}'},
]


class Weather(BaseModel):
    city: str
    celsius: int


@tool
def measure(city: str) -> int:
    """The temperature in a city."""
    return 3


def no_atlantis(call: CallInfo) -> Veto | None:
    return Veto("Atlantis is not a real city") if call.arguments["city"] == "Atlantis" else None


async def main() -> None:
    store = MemoryLogStore()
    agent = Agent(
        model=ScriptedModel(SCRIPT, name="golden"),
        tools=[measure],
        storage=Storage(log=EventLog(store), artifacts=MemoryArtifactStore()),
        services=Services(
            clock=ManualClock(1_717_000_500_000_000, tick_us=1000), ids=SequentialIds("g5")
        ),
        output_type=Weather,
        hooks=Hooks(before_call=[no_atlantis]),
    )
    result = await agent.run("how warm is Oslo?", session=SESSION)
    assert result.output == Weather(city="Oslo", celsius=3), result
    records = await store.read_records(session_id=SESSION, start=0, end=None)
    kinds = [json.loads(r.data)["body"]["kind"] for r in records]
    assert "output_rejected" in kinds, kinds
    out = Path(__file__).with_name("v5_structured.jsonl")
    out.write_text(
        "".join(
            json.dumps({"offset": r.offset, "data": r.data.decode("utf-8"), "digest": r.digest})
            + "\n"
            for r in records
        ),
        encoding="utf-8",
    )


if __name__ == "__main__":
    asyncio.run(main())

"""Writes ``v6_parked_approval.jsonl`` through the real writer (run once; never
regenerate a shipped golden): a turn whose approval is parked (``permission_decided``
``park``; the call is not dispatched and the run ends waiting), then resumed by an agent
whose approver allows it, so the call runs and the turn completes.

    PYTHONPATH=src python tests/data/golden/make_v6_parked_approval.py
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from lodger import Agent, ScriptedModel, tool
from lodger.engine.settings import Hooks, Services
from lodger.ids import ManualClock, SequentialIds
from lodger.storage import EventLog, MemoryArtifactStore, MemoryLogStore, Storage
from lodger.tools.spec import Tool

SESSION = "golden-v6"
SCRIPT = [
    {"calls": [{"name": "deploy", "args": {"target": "prod"}}]},
    {"text": "Deployed to prod."},
]


@tool(approval=True)
def deploy(target: str) -> str:
    """Deploy to a target (needs approval)."""
    return f"deployed {target}"


def answering(answer: str) -> Any:
    async def approve(t: Tool, arguments: dict[str, Any]) -> str:
        return answer

    return approve


async def main() -> None:
    store = MemoryLogStore()
    artifacts = MemoryArtifactStore()
    clock = ManualClock(1_717_000_600_000_000, tick_us=1000)
    ids = SequentialIds("g6")
    model = ScriptedModel(SCRIPT, name="golden")
    for answer in ("park", "once"):
        agent = Agent(
            model=model,
            tools=[deploy],
            storage=Storage(log=EventLog(store), artifacts=artifacts),
            services=Services(clock=clock, ids=ids),
            hooks=Hooks(approver=answering(answer)),
        )  # fmt: skip
        async with agent:
            if answer == "park":
                result = await agent.run("deploy to prod", session=SESSION)
                assert result.status == "waiting", result
            else:
                result = await agent.resume(SESSION)
                assert result.status == "completed", result
    records = await store.read_records(session_id=SESSION, start=0, end=None)
    decisions = [
        json.loads(r.data)["body"].get("decision")
        for r in records
        if json.loads(r.data)["body"]["kind"] == "permission_decided"
    ]
    assert decisions == ["park", "allow"], decisions
    out = Path(__file__).with_name("v6_parked_approval.jsonl")
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

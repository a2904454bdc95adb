"""Writes ``v7_decided_by.jsonl`` through the real writer (run once; never regenerate a
shipped golden): decisions that say who decided (schema 7). A turn whose first call a
rule allows (``who`` the rule) and whose second the user allows at a terminal (``who``
``cli:golden``). (An operator decision's ``who`` is the same optional field: older
goldens hold operator decisions without it.)

    PYTHONPATH=src python tests/data/golden/make_v7_decided_by.py
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from lodger import Agent, ScriptedModel, tool
from lodger.engine.permissions import Answered
from lodger.engine.settings import Hooks, Services
from lodger.ids import ManualClock, SequentialIds
from lodger.storage import EventLog, MemoryArtifactStore, MemoryLogStore, Storage
from lodger.tools.policy import PermissionPolicy, Rule
from lodger.tools.spec import Tool

SESSION = "golden-v7"
SCRIPT = [
    {
        "calls": [
            {"name": "echo", "args": {"text": "hi"}},
            {"name": "deploy", "args": {"target": "prod"}},
        ]
    },
    {"text": "Deployed to prod."},
]


@tool
def echo(text: str) -> str:
    """Say it back."""
    return text


@tool(approval=True)
def deploy(target: str) -> str:
    """Deploy to a target (needs approval)."""
    return f"deployed {target}"


def answering(answer: Any) -> Any:
    async def approve(t: Tool, arguments: dict[str, Any]) -> Any:
        return answer

    return approve


async def main() -> None:
    store = MemoryLogStore()
    artifacts = MemoryArtifactStore()
    storage = Storage(log=EventLog(store), artifacts=artifacts)
    clock = ManualClock(1_717_000_700_000_000, tick_us=1000)
    ids = SequentialIds("g7")
    model = ScriptedModel(SCRIPT, name="golden")
    agent = Agent(
        model=model,
        tools=[echo, deploy],
        storage=storage,
        permissions=PermissionPolicy([Rule(pattern="echo", decision="allow")]),
        services=Services(clock=clock, ids=ids),
        hooks=Hooks(approver=answering(Answered("once", "cli:golden"))),
    )
    async with agent:
        result = await agent.run("deploy to prod", session=SESSION)
        assert result.status == "completed", result
    records = await store.read_records(session_id=SESSION, start=0, end=None)
    whos = [
        json.loads(r.data)["body"].get("who")
        for r in records
        if json.loads(r.data)["body"]["kind"] in ("permission_decided", "operator_decision")
    ]
    assert whos == ["rule 'echo'", "cli:golden"], whos
    out = Path(__file__).with_name("v7_decided_by.jsonl")
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

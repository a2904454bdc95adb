"""Writes ``v4_relocated.jsonl`` through the real writer (run once; never regenerate a
shipped golden): a turn interrupted before a T2, resumed with a relocation to a copied
workspace (``run_started.workspace``), then a second turn interrupted and abandoned by
the operator with a reason (``turn_ended.reason``).

    PYTHONPATH=src python tests/data/golden/make_v4_relocated.py
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from lodger.engine.settings import Services
from lodger.errors import CommitFailedError
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.agent import Agent
from lodger.runtime.builtin import workspace_tools
from lodger.storage import EventLog, MemoryArtifactStore, MemoryLogStore, Storage
from lodger.storage.logstore import Record
from lodger.testing import FaultyLogStore

SESSION = "golden-v4"
ROOT = Path("/tmp/lodger-golden-v4")
SCRIPT = [
    {"calls": [{"name": "write_file", "args": {"path": "a.txt", "content": "alpha"}}]},
    {"calls": [{"name": "write_file", "args": {"path": "b.txt", "content": "bravo"}}]},
    {"text": "both written"},
    {"calls": [{"name": "write_file", "args": {"path": "c.txt", "content": "charlie"}}]},
    {"text": "never reached"},
]


def fail_t2(nth: int) -> object:
    seen = {"t2": 0}

    def predicate(records: Sequence[Record]) -> bool:
        if any(b'"kind":"tool_responded"' in r.data for r in records):
            seen["t2"] += 1
            return seen["t2"] == nth
        return False

    return predicate


async def main() -> None:
    shutil.rmtree(ROOT, ignore_errors=True)
    (ROOT / "project").mkdir(parents=True)
    store = MemoryLogStore()
    clock = ManualClock(1_717_000_400_000_000, tick_us=1000)

    def agent(log_store: object, workspace: Path, prefix: str) -> Agent:
        return Agent(
            model=ScriptedModel(SCRIPT, name="golden"),
            tools=workspace_tools(),
            storage=Storage(log=EventLog(log_store), artifacts=MemoryArtifactStore()),
            workspace=workspace,
            services=Services(clock=clock, ids=SequentialIds(prefix)),
        )

    first = agent(FaultyLogStore(store, fail_when=fail_t2(2)), ROOT / "project", "g1")  # type: ignore[arg-type]
    try:
        await first.run("write a and b", session=SESSION)
    except CommitFailedError:
        pass  # the injected failure: the log a crash before this T2 leaves
    else:
        raise AssertionError("the injected T2 failure did not happen")
    shutil.copytree(ROOT / "project", ROOT / "moved")
    second = agent(store, ROOT / "moved", "g2")
    assert (await second.resume(SESSION, relocate=True)).status == "completed"
    third = agent(FaultyLogStore(store, fail_when=fail_t2(1)), ROOT / "moved", "g3")  # type: ignore[arg-type]
    try:
        await third.run("write c", session=SESSION)
    except CommitFailedError:
        pass  # the injected failure: the log a crash before this T2 leaves
    else:
        raise AssertionError("the injected T2 failure did not happen")
    await agent(store, ROOT / "moved", "g4").abandon(SESSION, reason="golden: stopped by hand")
    records = await store.read_records(session_id=SESSION, start=0, end=None)
    out = Path(__file__).with_name("v4_relocated.jsonl")
    out.write_text(
        "".join(
            json.dumps({"offset": r.offset, "data": r.data.decode("utf-8"), "digest": r.digest})
            + "\n"
            for r in records
        ),
        encoding="utf-8",
    )
    shutil.rmtree(ROOT)


if __name__ == "__main__":
    asyncio.run(main())

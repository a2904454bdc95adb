"""The crash harness's child: runs a real scripted session on the real SQLite log and
kills itself with SIGKILL at a named failpoint (or is killed by the parent at random).

    python child.py STATE WORKSPACE EFFECTS MODE FAILPOINT

MODE is ``run`` (start the turn) or ``resume``. Every side effect is an O_APPEND line in
EFFECTS (fsynced), written outside the log so the parent can count what really ran.
Exit codes: 0 the turn settled, 3 resume is blocked (parked calls; JSON on stdout),
4 nothing to resume. A SIGKILL shows as -9 to the parent.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lodger import Agent, ResumeBlockedError, ScriptedModel, UsageError, tool
from lodger.providers.base import ModelRequest, ModelResponse, TextSink
from lodger.runtime.builtin import workspace_tools
from lodger.storage import EventLog, MemoryArtifactStore, SqliteLogStore, Storage
from lodger.storage.logstore import Record
from lodger.testing import FaultyLogStore

STATE, WORKSPACE, EFFECTS, MODE, FAILPOINT = sys.argv[1:6]

SCRIPT: list[dict[str, Any]] = [
    {"text": "Looking up the price.", "calls": [{"name": "lookup", "args": {"key": "price"}}]},
    {
        "text": "Charging, checking stock and writing the receipt in one batch.",
        "calls": [
            {"name": "charge", "args": {"amount": 5}},
            {"name": "lookup", "args": {"key": "stock"}},
            {"name": "write_file", "args": {"path": "receipt.txt", "content": "paid 5\n"}},
        ],
    },
    {"calls": [{"name": "charge", "args": {"amount": 7}}]},
    {"text": "All done: charged 5 and 7, receipt written."},
]

# Code mode (LODGER_CRASH_CELLS=1; failpoints named cell_*): one cell looks the price up,
# then charges 5 and 7 in flight together under Promise.all; every kill lands inside it.
CELL = """
const price = await tools.lookup({key: 'price'});
const [a, b] = await Promise.all([tools.charge({amount: 5}), tools.charge({amount: 7})]);
return {price, a, b};
"""
CELL_SCRIPT: list[dict[str, Any]] = [
    {"text": "One cell for all of it.", "calls": [{"name": "exec", "args": {"code": CELL}}]},
    {"text": "All done: charged 5 and 7, receipt written."},
]


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def effect(line: str) -> None:
    fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@tool(nestable=True)
async def charge(amount: int) -> str:
    """Charge a card (never retried)."""
    if FAILPOINT == "during_effect":
        effect(f"started\tcharge\t{amount}")
        die()
    await asyncio.sleep(0.003)
    effect(f"charge\t{amount}")
    if FAILPOINT == "after_effect_before_t2":
        die()
    return f"charged {amount}"


@tool(recovery="idempotent", nestable=True)
async def lookup(key: str) -> str:
    """Look a value up (safe to repeat)."""
    await asyncio.sleep(0.002)
    effect(f"lookup\t{key}")
    return f"{key}=42"


class KillingStore(FaultyLogStore):
    """The real SQLite store; kills the process before or after a chosen append."""

    def __init__(self, inner: SqliteLogStore, failpoint: str) -> None:
        super().__init__(inner)
        self.failpoint = failpoint
        self.seen: dict[bytes, int] = {}

    def _count(self, records: Sequence[Record], marker: bytes) -> int:
        if any(marker in r.data for r in records):
            self.seen[marker] = self.seen.get(marker, 0) + 1
            return self.seen[marker]
        return 0

    def _nested(self, records: Sequence[Record], kind: bytes) -> int:
        """The count of nested (code_mode) facts of ``kind`` once this append holds one."""
        key = b"nested " + kind
        here = sum(1 for r in records if b'"origin":"code_mode"' in r.data and kind in r.data)
        if not here:
            return 0
        self.seen[key] = self.seen.get(key, 0) + here
        return self.seen[key]

    async def append_records(
        self, *, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        fp = self.failpoint
        t1 = self._count(records, b'"kind":"tool_dispatched"')
        t2 = self._count(records, b'"kind":"tool_responded"')
        claim = self._count(records, b'"resumed_from":{')
        ended = self._count(records, b'"kind":"run_ended"')
        n_t1 = self._nested(records, b'"kind":"tool_dispatched"')
        n_t2 = self._nested(records, b'"kind":"tool_responded"')
        if (
            (fp == "before_t1" and t1 == 2)
            or (fp == "resume_before_claim" and claim == 1)
            or (fp == "cell_before_nested_t1" and n_t1 == 1)
        ):
            die()
        await self.inner.append_records(
            session_id=session_id, records=records, expected_offset=expected_offset
        )
        if (
            (fp == "after_t1" and t1 == 2)
            or (fp == "after_t2" and t2 == 1)
            or (fp == "mid_batch" and t2 == 2)
            or (fp == "after_run_end" and ended == 1)
            or (fp == "resume_after_claim" and claim == 1)
            # lookup's T1 is committed, its T2 is not
            or (fp == "cell_between_nested_t1_and_t2" and n_t1 == 1)
            # both charges dispatched under Promise.all, neither answered
            or (fp == "cell_nested_in_flight" and n_t1 == 3)
            # every nested T2 is committed, the cell's own T2 is not
            or (fp == "cell_after_last_nested_t2" and n_t2 == 3)
        ):
            die()


class StreamKillingModel(ScriptedModel):
    """Dies while the provider is 'streaming' its third output."""

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        outputs = sum(1 for m in request.messages if type(m).__name__ == "AssistantMessage")
        if FAILPOINT == "during_streaming" and outputs == 2:
            if on_text is not None:
                on_text("Charg")
            die()
        return await super().complete(request, on_text=on_text)


async def main() -> int:
    # STATE is a state directory, or an object-store URL (the harness on the object log)
    inner = Storage.from_url(STATE).log.store if "://" in STATE else SqliteLogStore(STATE)
    store = KillingStore(inner, FAILPOINT)  # type: ignore[arg-type]
    # the parent sets LODGER_CRASH_CELLS for every child of a cell session (resumes too)
    cells = os.environ.get("LODGER_CRASH_CELLS") == "1"
    agent = Agent(
        model=StreamKillingModel(CELL_SCRIPT if cells else SCRIPT, name="crash"),
        code_mode="javascript" if cells else None,
        tools=[charge, lookup, *[t for t in workspace_tools() if t.name == "write_file"]],
        storage=Storage(
            log=EventLog(store),
            artifacts=MemoryArtifactStore(),
            state_dir=Path(STATE.removeprefix("file://") if "://" in STATE else STATE),
        ),
        workspace=WORKSPACE,
    )
    print("ready", flush=True)  # the parent's random kill clock starts here
    try:
        if MODE == "run":
            result = await agent.run("Charge for the order and write a receipt.", session="s1")
        else:
            result = await agent.resume("s1")
    except ResumeBlockedError as exc:
        print(json.dumps({"blocked": exc.blockers}))
        return 3
    except UsageError as exc:
        print(json.dumps({"usage": exc.code}))
        return 4
    finally:
        await agent.close()
    print(json.dumps({"status": result.status, "answer": result.answer}))
    return 0


if __name__ == "__main__":
    Path(EFFECTS).touch()
    sys.exit(asyncio.run(main()))

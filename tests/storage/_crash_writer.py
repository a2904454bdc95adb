"""Child process of ``test_crash.py``: append to one SQLite session until killed.

Usage: python _crash_writer.py STATE_DIR SESSION_ID SEED

Prints ``ready <high_water>`` once it holds the writer lock, then after every append has
returned (and is therefore durable) prints the new high-water mark and flushes stdout.
"""

from __future__ import annotations

import asyncio
import random
import sys

from lodger.events import EventDraft, ToolResponded, TurnStarted
from lodger.storage import EventLog, SqliteLogStore


def make_draft(offset: int, rng: random.Random) -> EventDraft:
    filler = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz ", k=900))  # ~1 KiB event
    body = (
        TurnStarted(input=filler)
        if offset % 2 == 0
        else ToolResponded(operation_id=f"op-{offset}", status="ok", content=filler)
    )
    return EventDraft(id=f"ev-{offset:06d}", ts=1_700_000_000_000_000 + offset, body=body)


async def main(state_dir: str, session_id: str, seed: int) -> None:
    rng = random.Random(seed)
    log = EventLog(SqliteLogStore(state_dir))
    writer = await log.open_writer(session_id)
    high_water = writer.head.high_water
    print(f"ready {high_water}", flush=True)
    while True:
        size = rng.choice((1, 3))
        drafts = [make_draft(high_water + i, rng) for i in range(size)]
        await writer.append(drafts, expected_offset=high_water)
        high_water += size
        print(high_water, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))

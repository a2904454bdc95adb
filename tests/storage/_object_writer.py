"""A child process that writes to an object-store log; run by test_object_store.py.

    python _object_writer.py race URL SESSION NAME ROUNDS   # via multiprocessing, see race()
    python _object_writer.py kill-before-head URL SESSION COUNT

``kill-before-head`` appends COUNT + 1 events one by one (one segment put each; only the
first append records a head), then SIGKILLs itself when releasing the writer, at the put
of the head that would have covered them all.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from lodger.errors import WriterFencedError
from lodger.events import EventDraft, TurnStarted
from lodger.storage import EventLog
from lodger.storage.objectstore import ObjectLogStore, open_object_store


def make_draft(name: str, n: int) -> EventDraft:
    return EventDraft(id=f"{name}-{n}", ts=n, body=TurnStarted(input=f"{name} says {n}"))


def open_log(url: str, name: str) -> EventLog:
    where = open_object_store(url)
    # a distinct identity per writer: two processes never share an in-process lease; and
    # no lease object: these writers each believe they hold the session, and the segment
    # keys alone must fence them (the lease refusing them is tested in test_writer_lease)
    return EventLog(
        ObjectLogStore(
            where.store,
            identity=f"{where.identity}#{name}",
            local_root=where.local_root,
            writer_lease=False,
        )
    )


async def race_rounds(url: str, session: str, name: str, rounds: int, barrier: Any) -> list[str]:
    """Each round: both writers read the head, meet, append one event at it."""
    outcomes: list[str] = []
    log = open_log(url, name)
    try:
        for n in range(rounds):
            barrier.wait()
            writer = await log.open_writer(session)
            at = writer.head.high_water
            barrier.wait()
            try:
                await writer.append([make_draft(name, n)], expected_offset=at)
                outcomes.append(f"won {at}")
            except WriterFencedError as exc:
                # the loser names the offset it lost and says it was fenced
                outcomes.append(f"fenced {exc.offset}" if "fenced" in str(exc) else repr(exc))
            finally:
                await writer.close()
    finally:
        await log.close()
    return outcomes


def race(url: str, session: str, name: str, rounds: int, barrier: Any, results: Any) -> None:
    results.put((name, asyncio.run(race_rounds(url, session, name, rounds, barrier))))
    # Leave without the interpreter's finalization: obstore's Rust runtime threads now and
    # then abort the process (SIGABRT) while Python tears itself down, after all the work
    # is done (seen once in a full run). The race's outcome is already delivered.
    results.close()
    results.join_thread()
    os._exit(0)


async def kill_before_head(url: str, session: str, count: int) -> None:
    log = open_log(url, "killed")
    store = log.store
    assert isinstance(store, ObjectLogStore)
    async with await log.open_writer(session) as writer:
        for n in range(count):
            await writer.append([make_draft("killed", n)], expected_offset=n)

        def die_at_head(key: str) -> bool:
            if "/head/" in key:
                os.kill(os.getpid(), signal.SIGKILL)
            return False

        await writer.append([make_draft("killed", count)], expected_offset=count)
        store.fail_put = die_at_head
    raise SystemExit("not killed")


if __name__ == "__main__":
    if sys.argv[1] == "kill-before-head":
        asyncio.run(kill_before_head(sys.argv[2], sys.argv[3], int(sys.argv[4])))

"""The whole-session read maps the database for its one statement only (``_BULK_MMAP`` in
``lodger.storage.sqlite``): it returns what an unmapped read returns, appends after it
go through ordinary writes, and a byte edited in the file still fails the read closed."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import pytest

from lodger.errors import CorruptLogError
from lodger.storage import EventLog, SqliteLogStore
from lodger.testing.log_conformance import SID, drafts, seed


async def _mmap_size(store: SqliteLogStore) -> int:
    """The setting on the store's own connection, asked on the thread that owns it."""

    def work() -> int:
        conn = store._conn
        assert conn is not None
        return int(conn.execute("PRAGMA mmap_size").fetchone()[0])

    return await store._run(work)


def test_the_mapping_lasts_one_statement_and_reads_the_same(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLogStore(tmp_path)
        log = EventLog(store)
        try:
            await seed(log, SID, 40)
            whole = await store.read_records(session_id=SID, start=0, end=None)
            assert await _mmap_size(store) == 0  # back to reads and writes through the file
            ranged = await store.read_records(session_id=SID, start=0, end=40)  # unmapped
            assert whole == ranged and len(whole) == 40
            async with await log.open_writer(SID) as writer:  # appends after it, unmapped
                await writer.append(drafts(40, 3), expected_offset=40)
            assert await _mmap_size(store) == 0
            again = await log.read_verified(SID)
            assert len(again) == 43 and list(again.records[:40]) == whole
        finally:
            await log.close()

    asyncio.run(main())


def test_an_edited_byte_still_fails_the_mapped_read(tmp_path: Path) -> None:
    asyncio.run(_seed_and_close(tmp_path))
    with contextlib.closing(sqlite3.connect(tmp_path / "log.sqlite3")) as conn:
        (data,) = conn.execute(
            'SELECT data FROM events WHERE session_id = ? AND "offset" = 17', (SID,)
        ).fetchone()
        edited = bytes([data[0] ^ 1]) + data[1:]
        conn.execute(
            'UPDATE events SET data = ? WHERE session_id = ? AND "offset" = 17', (edited, SID)
        )
        conn.commit()

    async def read() -> None:
        log = EventLog(SqliteLogStore(tmp_path))
        try:
            await log.read_verified(SID)
        finally:
            await log.close()

    with pytest.raises(CorruptLogError) as caught:
        asyncio.run(read())
    assert caught.value.offset == 17


async def _seed_and_close(state: Path) -> None:
    log = EventLog(SqliteLogStore(state))
    try:
        await seed(log, SID, 30)
    finally:
        await log.close()

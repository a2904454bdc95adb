"""What only the SQLite backend has: a file others can edit with SQL, and a lock file."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lodger.errors import CorruptLogError, SessionLockedError
from lodger.storage import EventLog, SqliteLogStore
from lodger.testing.log_conformance import SID, seed


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[EventLog]:
    opened = EventLog(SqliteLogStore(tmp_path / "state"))
    yield opened
    await opened.close()


def sql(state_dir: Path, statement: str) -> None:
    with contextlib.closing(sqlite3.connect(state_dir / "log.sqlite3")) as db, db:
        db.execute(statement)


async def test_row_rewritten_as_text_with_the_same_bytes_still_verifies(
    log: EventLog, tmp_path: Path
) -> None:
    await seed(log, SID, 4)
    head = await log.verify(SID)
    sql(tmp_path / "state", 'UPDATE events SET data = CAST(data AS TEXT) WHERE "offset" = 2')
    assert await log.verify(SID) == head
    assert len(await log.read(SID, start=3)) == 1


@pytest.mark.parametrize("offset", [2, 3])  # 3 is the last row, which `head` also reads
async def test_row_edited_with_sql_text_functions_fails_closed(
    log: EventLog, tmp_path: Path, offset: int
) -> None:
    await seed(log, SID, 4)
    sql(
        tmp_path / "state",
        f"UPDATE events SET data = replace(data, 'op', 'OP') WHERE \"offset\" = {offset}",
    )
    assert (await log.head(SID)).high_water == 4
    with pytest.raises(CorruptLogError) as info:
        await log.verify(SID)
    assert (info.value.session_id, info.value.offset, info.value.code) == (
        SID,
        offset,
        "digest_mismatch",
    )


async def test_rows_lodger_wrote_are_read_without_a_check_per_field(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lodger.storage.sqlite as module

    checked: list[int] = []
    real = module._stored_offset

    def counting(value: object, session_id: str, where: int) -> int:
        checked.append(where)
        return real(value, session_id, where)

    monkeypatch.setattr(module, "_stored_offset", counting)
    await seed(log, SID, 6)
    checked.clear()  # the writer's reads of the last row check it as before
    records = await log.store.read_records(session_id=SID, start=0, end=None)
    assert [r.offset for r in records] == list(range(6))
    assert all(type(r.data) is bytes and type(r.digest) is str for r in records)
    assert records[3] == (await log.store.read_records(session_id=SID, start=3, end=4))[0]
    assert checked == []  # one pass of type checks, no call per row


async def test_an_offset_edited_to_a_real_number_fails_closed_naming_it(
    log: EventLog, tmp_path: Path
) -> None:
    await seed(log, SID, 6)
    sql(tmp_path / "state", 'UPDATE events SET "offset" = 3.5 WHERE "offset" = 3')
    with pytest.raises(CorruptLogError) as info:
        await log.store.read_records(session_id=SID, start=0, end=None)
    assert (info.value.offset, info.value.code) == (3, "offset_mismatch")
    assert "offset 3.5, which is not an integer" in str(info.value)


@pytest.mark.slow
async def test_lock_names_the_process_that_holds_it(log: EventLog, tmp_path: Path) -> None:
    holder = (
        "import asyncio, sys\n"
        "from lodger.storage import EventLog, SqliteLogStore\n"
        "async def main():\n"
        "    log = EventLog(SqliteLogStore(sys.argv[1]))\n"
        "    await log.open_writer(sys.argv[2])\n"
        "    print('holding', flush=True)\n"
        "    sys.stdin.read()\n"
        "asyncio.run(main())\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        holder,
        str(tmp_path / "state"),
        SID,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        assert await proc.stdout.readline() == b"holding\n"
        with pytest.raises(SessionLockedError) as info:
            await log.open_writer(SID)
        assert f"pid {proc.pid}" in str(info.value)
        assert info.value.session_id == SID
    finally:
        proc.kill()
        await proc.communicate()
    # the kernel dropped the dead holder's lock
    async with await log.open_writer(SID) as writer:
        assert writer.head.high_water == 0


async def test_head_records_of_any_length_overwrite_each_other_cleanly(tmp_path: Path) -> None:
    """The head record is overwritten in place: a long record followed by a short one must
    leave no trailing bytes (the longest session id and digest still fit)."""
    from lodger.storage._heads import HeadFiles

    heads = HeadFiles(tmp_path)
    heads.root.mkdir()
    sid = "s" * 128
    heads.write(sid, 10**18, "f" * 64)
    heads.write(sid, 1, "a" * 64)
    assert heads.read(sid) == (1, "a" * 64)
    heads.write(sid, 0, "")
    assert heads.read(sid) == (0, "")
    heads.close()


def page_size(state_dir: Path) -> int:
    with contextlib.closing(sqlite3.connect(state_dir / "log.sqlite3")) as db:
        return int(db.execute("PRAGMA page_size").fetchone()[0])


async def test_a_new_database_has_8k_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    log = EventLog(SqliteLogStore(fresh))
    try:
        await seed(log, SID, 3)
    finally:
        await log.close()
    assert page_size(fresh) == 8192

    old = tmp_path / "old"  # a database made with SQLite's default pages, as before
    old.mkdir()
    with contextlib.closing(sqlite3.connect(old / "log.sqlite3")) as db:
        db.execute("PRAGMA page_size = 4096")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("CREATE TABLE t (x)")
    log = EventLog(SqliteLogStore(old))
    try:
        await seed(log, SID, 3)
        assert (await log.verify(SID)).high_water == 3
    finally:
        await log.close()
    assert page_size(old) == 4096

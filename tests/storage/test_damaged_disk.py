"""A damaged disk under the SQLite log: a real writer is SIGKILLed, then its WAL is damaged
for real (a flipped byte, a truncation, a deletion), or the state directory is deleted or
moved under a live writer. Every case fails closed; none reads as a shorter valid log
(DESIGN L4, L8)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lodger.errors import CommitFailedError, CorruptLogError, UsageError
from lodger.storage import EventLog, Record, SqliteLogStore
from lodger.testing.log_conformance import SID, assert_fails_closed, drafts

CHILD = Path(__file__).with_name("_crash_writer.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def kill_writer_after(state_dir: Path, acks_wanted: int) -> int:
    """Run the crash writer until it acknowledged ``acks_wanted`` appends, SIGKILL it and
    return the last high-water mark it acknowledged (it may have acknowledged more than
    ``acks_wanted`` by the time the signal lands)."""
    with subprocess.Popen(
        [sys.executable, str(CHILD), str(state_dir), SID, "7"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"ready ")
        acked = 0
        deadline = time.monotonic() + 30
        for _ in range(acks_wanted):
            line = proc.stdout.readline()
            assert line.endswith(b"\n"), proc.stderr and proc.stderr.read()
            acked = int(line)
            assert time.monotonic() < deadline
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
    # the writer goes on while we read: the last whole line it printed is its last ack
    for line in rest.split(b"\n")[:-1]:
        acked = int(line)
    return acked


def wal_frames(wal: Path) -> tuple[int, int]:
    """(number of whole frames, frame size) of a WAL file (32-byte header, then frames of
    a 24-byte header and one page)."""
    data = wal.read_bytes()
    (page_size,) = struct.unpack(">I", data[8:12])
    frame = 24 + page_size
    return (len(data) - 32) // frame, frame


def flip_byte(wal: Path) -> None:
    frames, size = wal_frames(wal)
    at = 32 + (frames // 2) * size + 24 + 100  # inside the page of the middle frame
    with wal.open("r+b") as handle:
        handle.seek(at)
        byte = handle.read(1)
        handle.seek(at)
        handle.write(bytes([byte[0] ^ 0x01]))


def truncate(wal: Path) -> None:
    frames, size = wal_frames(wal)
    os.truncate(wal, 32 + (frames // 2) * size + 10)  # cut inside the middle frame


def delete(wal: Path) -> None:
    wal.unlink()


def delete_with_shm(wal: Path) -> None:
    wal.unlink()
    Path(str(wal).replace("-wal", "-shm")).unlink(missing_ok=True)


@pytest.mark.slow
@pytest.mark.parametrize("damage", [flip_byte, truncate, delete, delete_with_shm])
async def test_damaged_wal_after_a_killed_writer_fails_closed(
    tmp_path: Path, damage: object
) -> None:
    state = tmp_path / "state"
    acked = await asyncio.to_thread(kill_writer_after, state, 12)
    wal = state / "log.sqlite3-wal"
    assert wal.stat().st_size > 0, "the killed writer's appends must still be in its WAL"
    head = json.loads((state / "heads" / f"{SID}.head").read_text())
    # the head names every acknowledged append, plus at most the one in flight (1 or 3)
    assert head["high_water"] - acked in (0, 1, 3)
    assert callable(damage)
    damage(wal)

    log = EventLog(SqliteLogStore(state))
    try:
        with pytest.raises(CorruptLogError) as info:
            await log.verify(SID)
        err = info.value
        assert err.code == "truncated", repr(err)
        lost_from = err.offset
        assert lost_from is not None and lost_from < acked
        assert f"recorded {head['high_water']} events" in str(err)
        # every read and every writer (so every resume) fails the same way
        await assert_fails_closed(log, SID, offset=lost_from, code="truncated")
        # the session does not vanish from the listing when all of its events are lost
        assert await log.list_sessions() == [SID]
    finally:
        await log.close()

    # the command line says so too, naming the offsets, with no traceback
    cli = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "lodger", "log", "verify", SID, "--state", str(state), "--json"],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        timeout=60,
        check=False,
    )
    assert cli.returncode == 1, cli.stderr
    error = json.loads(cli.stdout)["error"]
    assert (error["code"], error["offset"], error["session_id"]) == ("truncated", lost_from, SID)
    assert f"invalid at offset {lost_from}" in error["message"]
    assert b"Traceback" not in cli.stderr


@pytest.mark.slow
async def test_killed_writer_without_damage_still_verifies(tmp_path: Path) -> None:
    # the control for the test above: a plain SIGKILL loses nothing and fails nothing
    state = tmp_path / "state"
    acked = await asyncio.to_thread(kill_writer_after, state, 12)
    log = EventLog(SqliteLogStore(state))
    try:
        assert (await log.verify(SID)).high_water - acked in (0, 1, 3)
    finally:
        await log.close()


@pytest.mark.slow
async def test_deleted_head_file_fails_closed_and_blocks_writers(tmp_path: Path) -> None:
    state = tmp_path / "state"
    await asyncio.to_thread(kill_writer_after, state, 3)
    (state / "heads" / f"{SID}.head").unlink()
    log = EventLog(SqliteLogStore(state))
    try:
        events = len(await log.read(SID, start=0, end=10_000))
        await assert_fails_closed(log, SID, offset=events, code="head_missing")
        # nor does an append straight to the store quietly make a new head
        stray = [Record(events, b"{}", "0" * 64)]
        with pytest.raises(CorruptLogError) as info:
            await log.store.append_records(session_id=SID, records=stray, expected_offset=events)
        assert (info.value.code, info.value.offset) == ("head_missing", events)
        assert not (state / "heads" / f"{SID}.head").exists()
        assert len(await log.read(SID, start=0, end=10_000)) == events
    finally:
        await log.close()


@pytest.mark.parametrize("damaged", [b"", b"{not json", b'{"session_id": "other"}'])
async def test_damaged_head_file_fails_closed(tmp_path: Path, damaged: bytes) -> None:
    state = tmp_path / "state"
    log = EventLog(SqliteLogStore(state))
    try:
        async with await log.open_writer(SID) as writer:
            await writer.append(drafts(0, 2), expected_offset=0)
        (state / "heads" / f"{SID}.head").write_bytes(damaged)
        await assert_fails_closed(log, SID, offset=0, code="head_damaged")
        assert await log.list_sessions() == [SID]
    finally:
        await log.close()


class _DiesWhileWriting:
    """``os`` for the head files, except that the process "dies" (raises) at its first
    write of a record: what a SIGKILL while a head file is being created leaves behind."""

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    @staticmethod
    def write(fd: int, data: bytes) -> int:
        raise SystemExit("killed while creating the head file")

    @staticmethod
    def pwrite(fd: int, data: bytes, offset: int) -> int:
        raise SystemExit("killed while writing the head file")


async def test_a_writer_killed_while_creating_a_head_file_leaves_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head file is created whole (a hidden temporary file renamed into place): a writer
    killed meanwhile leaves no head file, never an empty one that reads as damaged, and the
    session opens and takes its first events afterwards. (Seen once in the crash harness:
    ``head_damaged`` after a SIGKILL between creating the file and writing its record.)"""
    import lodger.storage._heads as heads

    state = tmp_path / "state"
    log = EventLog(SqliteLogStore(state))
    monkeypatch.setattr(heads, "os", _DiesWhileWriting())
    try:
        with pytest.raises(SystemExit):
            async with await log.open_writer(SID) as writer:
                await writer.append(drafts(0, 2), expected_offset=0)
    finally:
        monkeypatch.undo()
        await log.close()
    assert not (state / "heads" / f"{SID}.head").exists()
    log = EventLog(SqliteLogStore(state))
    try:
        async with await log.open_writer(SID) as writer:
            await writer.append(drafts(0, 2), expected_offset=0)
        assert (await log.verify(SID)).high_water == 2
    finally:
        await log.close()


# ---------------------------------------------------------------- the state directory goes away


def remove(state: Path) -> None:
    shutil.rmtree(state)


def rename_away(state: Path) -> None:
    state.rename(state.with_name("moved-away"))


def replace_with_empty(state: Path) -> None:
    state.rename(state.with_name("moved-away"))
    state.mkdir()


@pytest.mark.parametrize("vanish", [remove, rename_away, replace_with_empty])
async def test_commit_fails_once_the_state_directory_is_gone(
    tmp_path: Path, vanish: object
) -> None:
    state = tmp_path / "state"
    log = EventLog(SqliteLogStore(state))
    try:
        writer = await log.open_writer(SID)
        await writer.append(drafts(0, 2), expected_offset=0)
        assert callable(vanish)
        vanish(state)
        for _ in range(2):  # and it keeps failing: nothing is ever reported committed
            with pytest.raises(CommitFailedError) as info:
                await writer.append(drafts(2, 1), expected_offset=2)
            err = info.value
            assert (err.code, err.session_id, err.offset) == ("log_file_gone", SID, 2)
            assert str(state / "log.sqlite3") in str(err)
            with pytest.raises(UsageError):
                _ = writer.head  # unknown: the writer must not go on as if it had committed
        await writer.close()
    finally:
        await log.close()
    moved = tmp_path / "moved-away"
    if moved.exists():  # the directory that was moved away holds what was committed: 2 events
        again = EventLog(SqliteLogStore(moved))
        try:
            assert (await again.verify(SID)).high_water == 2
        finally:
            await again.close()

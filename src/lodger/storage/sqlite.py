"""The embedded ``LogStore``: one SQLite file in the state directory.

WAL journal, ``synchronous=FULL`` (the WAL is fsynced on every commit). All SQLite work
runs on one dedicated thread so the event loop never blocks and the connection never
crosses threads. Appends are committed in groups (``_group_commit``): the appends of every
session that arrive while a commit is in flight share the next transaction and its fsync,
each checked against its own session's high-water mark (kept in memory while this store
holds the session's writer lock, read with ``SELECT MAX`` otherwise).

One writer per session is enforced with an ``flock`` on ``locks/<session>.lock``; the
kernel drops it when the process dies, so a SIGKILLed writer never leaves a stale lock,
and the file names the current holder. The holder is also recorded in
``writers/<session>.json`` (``_writer_record``), so deleting ``locks/`` under a live
writer does not let a second one in.

A damaged disk fails closed instead of losing facts quietly:

- each session's head ``(high_water, digest)`` is also kept in ``heads/<session>.head``
  (``_heads.py``), outside the WAL, so a damaged, truncated or deleted WAL is seen as a
  lost tail (``CorruptLogError`` code ``truncated``) instead of a shorter valid log;
- every commit checks that the database file it writes is still the one at
  ``<state>/log.sqlite3``: once the state directory was deleted, moved or replaced, SQLite
  would go on writing to an unlinked file, so the append fails with ``CommitFailedError``;
- reads never create, lock or migrate anything: a read-only state directory can be
  inspected (read-only SQLite, or a private copy when no ``-shm`` can be made there).

``PRAGMA user_version`` 1 marks a database whose sessions all have head files; it is
checkpointed into the main file when set, so losing the WAL cannot lose it. A database
without it (and without ``heads/``) was written before head files existed: its
sessions get head files from their stored state the first time it is opened to write.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import sqlite3
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import quote

from lodger._core.sqlite import use_wal
from lodger.errors import (
    AppendConflictError,
    CommitFailedError,
    CorruptLogError,
    LodgerError,
    SessionLockedError,
    StorageError,
)
from lodger.storage._group_commit import AppendQueue, GroupStats, PendingAppend
from lodger.storage._heads import HeadFiles, head_missing
from lodger.storage._worker import IoThread
from lodger.storage._writer_record import claim_writer, disclaim_writer
from lodger.storage.checkpoints import FileCheckpoints
from lodger.storage.logstore import Record

__all__ = ["SqliteLogStore"]

T = TypeVar("T")

_FORMAT = 1  # PRAGMA user_version: every session has a head file
_INSERT = 'INSERT INTO events (session_id, "offset", data, digest) VALUES (?, ?, ?, ?)'
_READ_HINT = "the disk may be failing or the database file damaged; verify the log"
# Pages of 8 KiB for a new database: a WITHOUT ROWID row longer than about a quarter of
# a page spills into an overflow page of its own, mostly empty. Measured on a 100k-event
# session (rows of 0.2-1 KB): 215 MB at 4 KiB against 80 MB, a whole-session read 140 ->
# 97 ms, and a one-event commit 0.28 -> 0.23 ms (16 KiB: 82 MB, 92 ms). Databases made
# before keep their page size (it changes only with a VACUUM, which lodger never runs).
_PAGE = 8192
# Not mapped: a whole-session read through ``PRAGMA mmap_size`` was 60 ms faster at 100k
# records, but a disk that fails a read under a mapping kills the process with SIGBUS,
# where ``pread`` gives SQLite an I/O error that lodger reports with ``_READ_HINT``.

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    "offset" INTEGER NOT NULL,
    data BLOB NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (session_id, "offset")
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS heads (
    session_id TEXT PRIMARY KEY,
    high_water INTEGER NOT NULL,
    digest TEXT NOT NULL
);
"""


def _insert_rows(conn: sqlite3.Connection, rows: list[tuple[str, int, bytes, str]]) -> None:
    """Insert ``rows`` through one prepared statement. (One multi-row ``VALUES`` would
    leave the GIL fewer times, but SQLite takes about 1.6x the CPU for it.)"""
    conn.executemany(_INSERT, rows)


def _stored_bytes(value: object) -> bytes:
    # a row edited with SQL text functions comes back as TEXT: pass its bytes on to the
    # digest check (which then fails closed) instead of crashing with a TypeError here
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def _as_record(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> Record:
    """A read's row factory: the row as a ``Record`` as it is (``tuple.__new__`` is what
    ``Record._make`` does, without its frame), its types checked by ``_records_of``. Made
    as SQLite hands over each row: 100k rows cost 20 ms of CPU so, against 40 ms for a
    second pass that copied every row of the list into a record."""
    record: Record = _new_tuple(Record, row)
    return record


_new_tuple: Any = tuple.__new__


def _records_of(rows: list[Any], session_id: str, start: int) -> list[Record]:
    """The rows of a read (made by ``_as_record``) as records. Rows lodger wrote (an int,
    bytes and text) are records as they are, after one pass of type checks, with no
    call per field (40k records: 85 ms -> 61 ms); any other row takes the checks below,
    which name its offset."""
    for o, d, g in rows:
        if type(o) is not int or type(d) is not bytes or type(g) is not str:
            return [
                Record(_stored_offset(o, session_id, start + i), _stored_bytes(d), str(g))
                for i, (o, d, g) in enumerate(rows)
            ]
    return cast(list[Record], rows)


def _stored_offset(value: object, session_id: str, where: int) -> int:
    # SQLite stores whatever an UPDATE gives a column ('abc', 5.5); only an integer is an
    # offset lodger wrote. ``where`` is the offset the row stands at in the read.
    if type(value) is int:
        return value
    raise CorruptLogError(
        f"log for session {session_id!r} is invalid at offset {where}: a stored row has "
        f"offset {value!r}, which is not an integer",
        hint="the database was edited outside lodger; restore it from a backup or fork the "
        f"session from offset {where}",
        code="offset_mismatch",
        session_id=session_id,
        offset=where,
    )


def _no_table(exc: sqlite3.Error) -> bool:
    # a database whose schema was only in a lost WAL (written before format 1) holds nothing
    return isinstance(exc, sqlite3.OperationalError) and "no such table" in str(exc)


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK)  # EROFS on a read-only mount, even for root


class _FileLease:
    def __init__(self, store: SqliteLogStore, session_id: str, fd: int) -> None:
        self._store = store
        self.session_id = session_id
        self._fd: int | None = fd

    async def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            self._store._leased.discard(self.session_id)
            disclaim_writer(self._store.state_dir, self.session_id)
            # closing drops the flock; done inline (it does not block) so a lease can still be
            # released after its store was closed, instead of holding the lock until exit
            os.close(fd)


class SqliteLogStore:
    """Events of every session in ``<state_dir>/log.sqlite3``, heads in ``heads/``."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / "log.sqlite3"
        self.heads = HeadFiles(self.state_dir)
        #: fold checkpoints, a cache beside the log (``lodger.engine.checkpoint``)
        self.checkpoints = FileCheckpoints(self.state_dir / "checkpoints")
        self._io = IoThread("lodger-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._prepared = False  # _conn is read-write, migrated, and its file identified
        self._read_write = False
        self._identity: tuple[int, int] | None = None
        self._snapshot: tempfile.TemporaryDirectory[str] | None = None
        self._head_files_seen: set[str] = set()
        self._appends = AppendQueue(self._io, self._commit_group)
        # high-water marks after this store's own commits, trusted only for the sessions
        # whose writer lock this store holds (``_leased``): nobody else can move them then
        self._high_water: dict[str, int] = {}
        self._leased: set[str] = set()

    @property
    def group_stats(self) -> GroupStats:
        """How appends were grouped into commits (``lodger.storage._group_commit``)."""
        return self._appends.stats

    # -- plumbing -------------------------------------------------------------

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self._io.run(fn)

    def _open_error(self, exc: BaseException) -> StorageError:
        return StorageError(
            f"cannot open the event log at {self.path}: {exc}",
            hint="check the --state directory exists, is writable, has free space and is "
            "not corrupt",
            code="storage_open",
        )

    def _reader(self) -> sqlite3.Connection | None:
        """A connection to read with, or None when nothing was ever stored.

        Never creates, migrates or locks anything, so read-only directories can be read.
        """
        if self._conn is not None:
            return self._conn
        if not self.path.exists():
            return None
        try:
            if _writable(self.state_dir) and _writable(self.path):
                conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
                try:
                    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
                    self._conn, self._read_write = conn, True
                    return conn
                except sqlite3.Error:  # e.g. a full disk has no room for the -shm file
                    conn.close()
            self._conn = self._read_only_connection()
        except (sqlite3.Error, OSError) as exc:
            raise self._open_error(exc) from exc
        return self._conn

    def _read_only_connection(self) -> sqlite3.Connection:
        uri = f"file:{quote(str(self.path.absolute()))}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30.0)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError:
            conn.close()
        # WAL mode needs a -shm file that cannot be created here; `immutable=1` would skip
        # the WAL and its events. Read a private copy of the database and its WAL instead:
        # nobody can write to a directory we cannot write either.
        snapshot = tempfile.TemporaryDirectory(prefix="lodger-read-")
        try:
            copy = Path(snapshot.name) / self.path.name
            for suffix in ("", "-wal"):
                source = Path(f"{self.path}{suffix}")
                if suffix == "" or source.exists():
                    shutil.copyfile(source, f"{copy}{suffix}")
            conn = sqlite3.connect(copy, isolation_level=None, timeout=30.0)
        except BaseException:
            snapshot.cleanup()
            raise
        self._snapshot = snapshot
        return conn

    def _writer(self) -> sqlite3.Connection:
        """The read-write connection, created, migrated and identified on first use."""
        if self._conn is not None and self._prepared:
            return self._conn
        if self._conn is not None and not self._read_write:
            self._close_connection()
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            if self._conn is None:
                self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
                self._read_write = True
            conn = self._conn
            # a new database only (SQLite ignores it once the file holds a page): see _PAGE
            conn.execute(f"PRAGMA page_size = {_PAGE}")
            use_wal(conn)
            conn.executescript(_SCHEMA)
            if int(conn.execute("PRAGMA user_version").fetchone()[0]) < _FORMAT:
                self._adopt(conn)
            self.heads.root.mkdir(exist_ok=True)
            status = os.stat(self.path)
        except (sqlite3.Error, OSError) as exc:
            raise self._open_error(exc) from exc
        self._identity = (status.st_dev, status.st_ino)
        self._prepared = True
        return conn

    def _adopt(self, conn: sqlite3.Connection) -> None:
        """Give every session of an older database a head file (never replacing one), then
        mark the database and checkpoint the mark into the main file, out of the WAL."""
        self.heads.root.mkdir(exist_ok=True)
        recorded = dict(
            (str(sid), (int(hw), str(digest)))
            for sid, hw, digest in conn.execute("SELECT session_id, high_water, digest FROM heads")
        )
        for sid, last, digest in conn.execute(
            'SELECT session_id, MAX("offset"), digest FROM events GROUP BY session_id'
        ):
            # SQLite takes `digest` from the row holding the MAX
            recorded.setdefault(str(sid), (int(last) + 1, str(digest)))
        for sid, (high_water, digest) in recorded.items():
            if not self.heads.path(sid).exists():
                self.heads.write(sid, high_water, digest)
        conn.execute(f"PRAGMA user_version = {_FORMAT}")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _legacy(self, conn: sqlite3.Connection) -> bool:
        """Written before head files existed and never opened to write since."""
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        return version < _FORMAT and not self.heads.exists()

    def _same_file(self) -> bool:
        try:
            status = os.stat(self.path)
        except OSError:
            return False
        return (status.st_dev, status.st_ino) == self._identity

    def _moved(self, session_id: str, offset: int) -> CommitFailedError:
        return CommitFailedError(
            f"append to session {session_id!r} at offset {offset} was not committed: the "
            f"event log at {self.path} is no longer the file this process opened (the state "
            "directory was deleted, moved or replaced)",
            hint="nothing from this append was committed; put the state directory back "
            "and resume, or start again in a new one",
            code="log_file_gone",
            session_id=session_id,
            offset=offset,
        )

    def _close_connection(self) -> None:
        self.heads.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._prepared = self._read_write = False
        if self._snapshot is not None:
            self._snapshot.cleanup()
            self._snapshot = None

    # -- LogStore -------------------------------------------------------------

    async def append_records(
        self, *, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        await self._appends.append(session_id, records, expected_offset)

    def _commit_group(self, group: list[PendingAppend]) -> None:
        """Commit a group of appends in one transaction (one fsync); see ``_group_commit``.

        Each append is checked against its session's high-water mark; a refused one is
        left out and the rest commit. The database file's identity is checked once before
        the commit and once after it, and each session's head is written once."""
        try:
            conn = self._writer()
        except StorageError as exc:
            for entry in group:
                entry.error = exc
            return
        accepted: list[PendingAppend] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                accepted = self._stage_group(conn, group)
                if accepted and not self._same_file():
                    for entry in accepted:
                        entry.error = self._moved(entry.session_id, entry.expected_offset)
                    accepted = []
                if accepted:
                    conn.execute("COMMIT")
                else:
                    conn.execute("ROLLBACK")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except (sqlite3.Error, OSError) as exc:
            for entry in group:
                if entry.error is None or entry in accepted:
                    # rolled back: read the mark again next time
                    self._high_water.pop(entry.session_id, None)
                    entry.error = self._commit_failed(entry, exc)
            return
        self._after_commit(accepted)

    def _stage_group(
        self, conn: sqlite3.Connection, group: list[PendingAppend]
    ) -> list[PendingAppend]:
        """Insert the rows of every append that passes its checks into the open
        transaction; return those appends (the others have their ``error`` set).

        The rows of the whole group go through one ``executemany``, with no savepoint per
        append (three statements each, every one a trip off the GIL and back for this
        thread, which under many sessions can wait out the event loop's switch interval,
        and about a quarter more of SQLite's CPU for the group). Only when SQLite
        refuses a row does the group go again, each append in a savepoint of its own, so
        that the refused row fails its own append, not its neighbours'."""
        tails: dict[str, int] = {}
        staged: list[PendingAppend] = []
        rows: list[tuple[str, int, bytes, str]] = []
        for entry in group:
            entry.error = self._check(conn, entry, tails)
            if entry.error is None:
                staged.append(entry)
                rows += [(entry.session_id, r.offset, r.data, r.digest) for r in entry.records]
        if len(staged) <= 1:
            _insert_rows(conn, rows)  # alone, a refused row fails its append as it is
            return staged
        try:
            _insert_rows(conn, rows)
        except sqlite3.IntegrityError:
            conn.execute("ROLLBACK")
            conn.execute("BEGIN IMMEDIATE")
        else:
            return staged
        accepted = []
        for entry in staged:
            entry.error = self._insert_isolated(conn, entry)
            if entry.error is None:
                accepted.append(entry)
        return accepted

    def _check(
        self, conn: sqlite3.Connection, entry: PendingAppend, tails: dict[str, int]
    ) -> BaseException | None:
        """Check one append against its session's high-water mark (``tails``: the marks
        of the appends of this group checked before it), or say why it cannot go in."""
        session_id = entry.session_id
        high_water = tails.get(session_id)
        if high_water is None and session_id in self._leased:
            # this store holds the session's writer lock: nobody else moved the mark
            high_water = self._high_water.get(session_id)
        try:
            if high_water is None:
                high_water = self._stored_high_water(conn, session_id, entry.expected_offset)
            if high_water != entry.expected_offset:
                return AppendConflictError(
                    f"append to session {session_id!r} expected offset "
                    f"{entry.expected_offset} but the stored high-water mark is {high_water}",
                    hint="another writer appended first; re-read the log",
                    session_id=session_id,
                    offset=entry.expected_offset,
                )
            if entry.records:
                self._ensure_head_file(session_id, high_water)
        except CorruptLogError as exc:
            return exc
        except OSError as exc:
            return self._commit_failed(entry, exc)
        # The head goes to its file after the commit (``_after_commit``); the old
        # ``heads`` table is read only in databases no writer has adopted.
        tails[session_id] = entry.end
        return None

    def _insert_isolated(
        self, conn: sqlite3.Connection, entry: PendingAppend
    ) -> BaseException | None:
        """Insert one append's rows in a savepoint: a row SQLite refuses fails this
        append only."""
        conn.execute("SAVEPOINT one_append")
        try:
            _insert_rows(
                conn, [(entry.session_id, r.offset, r.data, r.digest) for r in entry.records]
            )
        except sqlite3.IntegrityError as exc:
            conn.execute("ROLLBACK TO one_append")
            conn.execute("RELEASE one_append")
            return self._commit_failed(entry, exc)
        conn.execute("RELEASE one_append")
        return None

    def _stored_high_water(self, conn: sqlite3.Connection, session_id: str, where: int) -> int:
        row = conn.execute(
            'SELECT MAX("offset") FROM events WHERE session_id = ?', (session_id,)
        ).fetchone()
        return 0 if row[0] is None else _stored_offset(row[0], session_id, where) + 1

    def _commit_failed(self, entry: PendingAppend, exc: BaseException) -> CommitFailedError:
        error = CommitFailedError(
            f"append to session {entry.session_id!r} at offset {entry.expected_offset} in "
            f"{self.path} failed: {exc}",
            hint="nothing from this append was committed; check disk space and "
            f"permissions of the state directory {self.state_dir}",
            session_id=entry.session_id,
            offset=entry.expected_offset,
        )
        error.__cause__ = exc
        return error

    def _ensure_head_file(self, session_id: str, high_water: int) -> None:
        """Before a session's first commit, create its head file (empty), so that events
        without a head file always mean the file was lost, never a crash in between."""
        if session_id in self._head_files_seen:
            return
        if self.heads.read(session_id) is None:
            if high_water > 0:
                raise head_missing(session_id, high_water, str(self.heads.path(session_id)))
            self.heads.write(session_id, 0, "")
        self._head_files_seen.add(session_id)

    def _after_commit(self, accepted: list[PendingAppend]) -> None:
        """After a group's commit: check the file is still there, then write each
        session's head once (from the group's last append of it)."""
        if not accepted:
            return
        moved = not self._same_file()
        last: dict[str, PendingAppend] = {}
        for entry in accepted:
            self._high_water[entry.session_id] = entry.end
            if entry.records:
                last[entry.session_id] = entry
        if moved:
            # the directory went away between the check and the commit: the facts are in
            # a file nobody can open again
            for entry in accepted:
                error = self._moved(entry.session_id, entry.expected_offset)
                error.message = error.message.replace("was not committed", "is lost")
                error.hint = (
                    "the append went to a database file that no longer exists at that path; "
                    "put the state directory back and resume, or start again in a new one"
                )
                entry.error = error
            return
        for session_id, entry in last.items():
            record = entry.records[-1]
            try:
                self.heads.write(session_id, record.offset + 1, record.digest)
            except OSError as exc:
                for failed in accepted:
                    if failed.session_id == session_id:
                        failed.error = self._head_not_written(failed, exc)

    def _head_not_written(self, entry: PendingAppend, exc: OSError) -> CommitFailedError:
        error = CommitFailedError(
            f"append to session {entry.session_id!r} at offset {entry.expected_offset} is in "
            f"the log, but its head record {self.heads.path(entry.session_id)} could not be "
            f"written: {exc}",
            hint="the log is still valid; check disk space and permissions of the state "
            f"directory {self.state_dir}, then resume",
            session_id=entry.session_id,
            offset=entry.expected_offset,
        )
        error.__cause__ = exc
        return error

    async def read_records(self, *, session_id: str, start: int, end: int | None) -> list[Record]:
        def work() -> list[Record]:
            conn = self._reader()
            if conn is None:
                return []
            try:
                cursor = conn.cursor()
                cursor.row_factory = _as_record  # this cursor only: the writer shares conn
                rows = cursor.execute(
                    'SELECT "offset", data, digest FROM events WHERE session_id = ? '
                    'AND "offset" >= ? AND "offset" < ? ORDER BY "offset"',
                    (session_id, start, end if end is not None else 2**62),
                ).fetchall()
            except sqlite3.Error as exc:
                if _no_table(exc):
                    return []
                raise StorageError(
                    f"cannot read session {session_id!r} from {self.path}: {exc}",
                    hint=_READ_HINT,
                    session_id=session_id,
                ) from exc
            return _records_of(rows, session_id, start)

        return await self._run(work)

    def _last(self, session_id: str) -> Record | None:
        conn = self._reader()
        if conn is None:
            return None
        try:
            row = conn.execute(
                'SELECT "offset", data, digest FROM events WHERE session_id = ? '
                'ORDER BY "offset" DESC LIMIT 1',
                (session_id,),
            ).fetchone()
        except sqlite3.Error as exc:
            if _no_table(exc):
                return None
            raise StorageError(
                f"cannot read session {session_id!r} from {self.path}: {exc}",
                hint=_READ_HINT,
                session_id=session_id,
            ) from exc
        if row is None:
            return None
        if type(row[0]) is not int:  # text sorts after every integer: it comes first here
            (count,) = conn.execute(
                "SELECT count(*) FROM events WHERE session_id = ?", (session_id,)
            ).fetchone()
            _stored_offset(row[0], session_id, int(count) - 1)
        return Record(int(row[0]), _stored_bytes(row[1]), str(row[2]))

    async def last_record(self, *, session_id: str) -> Record | None:
        return await self._run(lambda: self._last(session_id))

    async def stored_head(self, *, session_id: str) -> tuple[int, str] | None:
        def work() -> tuple[int, str] | None:
            # the file first: it is written after each commit, so the events read after it
            # are never fewer than it names
            head = self.heads.read(session_id)
            if head is not None:
                return head
            conn = self._reader()
            if conn is None:
                return None
            try:
                if self._legacy(conn):
                    row = conn.execute(
                        "SELECT high_water, digest FROM heads WHERE session_id = ?", (session_id,)
                    ).fetchone()
                    return None if row is None else (int(row[0]), str(row[1]))
            except sqlite3.Error as exc:
                if _no_table(exc):
                    return None
                raise StorageError(
                    f"cannot read the head of session {session_id!r} from {self.path}: {exc}",
                    hint=_READ_HINT,
                    session_id=session_id,
                ) from exc
            last = self._last(session_id)
            if last is None:
                return None
            # a writer creates the head file before a session's first commit: look again
            # in case it did so after our first look
            head = self.heads.read(session_id)
            if head is not None:
                return head
            raise head_missing(session_id, last.offset + 1, str(self.heads.path(session_id)))

        return await self._run(work)

    def present(self) -> bool:
        # head files without a database: the log was lost, which must fail closed
        return self.path.exists() or self.heads.exists()

    async def list_sessions(self) -> list[str]:
        def work() -> list[str]:
            found: set[str] = set()
            conn = self._reader()
            if conn is not None:
                try:
                    rows = conn.execute("SELECT DISTINCT session_id FROM events").fetchall()
                except sqlite3.Error as exc:
                    if not _no_table(exc):
                        raise StorageError(
                            f"cannot list the sessions in {self.path}: {exc}",
                            hint=_READ_HINT,
                        ) from exc
                    rows = []
                found.update(str(r[0]) for r in rows)
            # a session whose events were all lost still has its head: list it, so that
            # reading it fails closed instead of the session vanishing
            for session_id in self.heads.sessions():
                if session_id not in found and self._head_names_events(session_id):
                    found.add(session_id)
            return sorted(found)

        return await self._run(work)

    def _head_names_events(self, session_id: str) -> bool:
        try:
            head = self.heads.read(session_id)
        except LodgerError:  # damaged: list it, reading it then says what is wrong
            return True
        return head is not None and head[0] > 0

    async def acquire_writer(self, *, session_id: str) -> _FileLease:
        lock_dir = self.state_dir / "locks"
        path = lock_dir / f"{session_id}.lock"

        def work() -> int:
            try:
                lock_dir.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise StorageError(
                    f"cannot take the writer lock of session {session_id!r} at {path}: "
                    f"{exc.strerror or exc}",
                    hint="writing needs a writable state directory with free space; "
                    "read-only commands (sessions, log, recover) work without one",
                    code="storage_lock",
                    session_id=session_id,
                ) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = "an unknown process"
                with contextlib.suppress(OSError, ValueError):
                    info = json.loads(path.read_text() or "{}")
                    holder = f"pid {info.get('pid')} on {info.get('host')}"
                raise SessionLockedError(
                    f"session {session_id!r} is being written by {holder}",
                    hint="wait for that run to finish or stop it; one writer per session",
                    session_id=session_id,
                ) from None
            try:
                claim_writer(self.state_dir, session_id)
            except BaseException:
                os.close(fd)
                raise
            # another process may have written since this store last held the lock
            self._high_water.pop(session_id, None)
            self._leased.add(session_id)
            info = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
            with contextlib.suppress(OSError):  # the holder's name is a courtesy
                os.ftruncate(fd, 0)
                os.pwrite(fd, info.encode(), 0)
            return fd

        fd = await self._run(work)
        return _FileLease(self, session_id, fd)

    async def close(self) -> None:
        await self._run(self._close_connection)
        await self._io.close()

"""Head records kept outside SQLite: one small file per session, ``<state>/heads/<id>.head``.

DESIGN L8: the digest chain cannot see a lost tail, so every open checks the events
against a head ``(high_water, digest)`` stored where losing the events does not lose it
too. SQLite's ``heads`` table lives in the same WAL as the events it covers: a damaged,
truncated or deleted WAL takes both. These files do not.

Each file holds one fixed-size record (JSON padded to ``_RECORD`` bytes), overwritten in
place with one ``pwrite`` through a descriptor the writer keeps open, after every commit
and without an fsync: a killed process leaves its writes in the page cache, so the file
survives a process crash followed by damage to the WAL. (A rename per commit cost about
190 us on ext4 here, more than the SQLite commit itself; an in-place write of one record
that fits in a disk sector costs about 3 us.) The file is written after the commit it
describes, so a reader that reads the head first and the events second always finds at
least the head's events; after a crash between the commit and the write the head lags
one append behind, which is still a valid prefix. A reader that meets a record being
overwritten reads it again before calling it damaged. A new file is created whole
(written under a hidden temporary name, then renamed), so a process killed while creating
it leaves no file or a complete one; a leftover temporary file is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path

from lodger.errors import CorruptLogError, StorageError, UsageError
from lodger.storage.logstore import check_session_id

__all__ = ["HEADS_DIR", "HeadFiles", "head_damaged", "head_missing"]

HEADS_DIR = "heads"
_SUFFIX = ".head"
_RECORD = 512  # bytes, one disk sector: a session id (<= 128) and a digest fit easily
_READ_TRIES = 3


def head_missing(session_id: str, stored: int, where: str = "") -> CorruptLogError:
    """The session has ``stored`` events but no head record (``where`` names its file)."""
    return CorruptLogError(
        f"log for session {session_id!r} is invalid at offset {stored}: its head record"
        f"{' ' + where if where else ''} is missing, so the {stored} stored events cannot be "
        "checked for a lost tail",
        hint="the head record was deleted outside lodger; restore the state directory from "
        "a backup (lodger will not guess where the log ended)",
        code="head_missing",
        session_id=session_id,
        offset=stored,
    )


def head_damaged(session_id: str, path: Path, why: str) -> CorruptLogError:
    return CorruptLogError(
        f"log for session {session_id!r} is invalid at offset 0: its head record {path} is "
        f"damaged ({why})",
        hint="the head file was modified outside lodger or torn by a power loss; restore "
        "the state directory from a backup",
        code="head_damaged",
        session_id=session_id,
        offset=0,
    )


class _NotARecord(Exception):
    """The head file is something lodger never writes there."""


def _read_record(path: Path) -> bytes:
    """The head file's bytes: a regular file of at most one record. Opened without
    blocking and read no further than a record, so a FIFO or a link to /dev/zero put in
    its place fails closed instead of hanging or filling memory."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise _NotARecord("a directory, not a file")
        if not stat.S_ISREG(mode):
            raise _NotARecord("not a regular file")
        raw = os.read(fd, _RECORD + 1)
    finally:
        os.close(fd)
    if len(raw) > _RECORD:
        raise _NotARecord(f"longer than a {_RECORD}-byte record")
    return raw


class HeadFiles:
    """The head files of one state directory. Blocking: call from the store's I/O thread."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / HEADS_DIR
        self._open: dict[str, tuple[int, int, int]] = {}  # session -> (fd, st_dev, st_ino)

    def close(self) -> None:
        for fd, _, _ in self._open.values():
            os.close(fd)
        self._open.clear()

    def path(self, session_id: str) -> Path:
        return self.root / f"{session_id}{_SUFFIX}"

    def exists(self) -> bool:
        return self.root.is_dir()

    def read(self, session_id: str) -> tuple[int, str] | None:
        """The recorded head, None when there is no file; damage fails closed."""
        path = self.path(session_id)
        for attempt in range(_READ_TRIES):
            try:
                raw = _read_record(path)
            except FileNotFoundError:
                return None
            except _NotARecord as exc:
                raise head_damaged(session_id, path, str(exc)) from None
            except OSError as exc:  # unreadable: say so, never a traceback
                raise StorageError(
                    f"cannot read the head record {path} of session {session_id!r}: "
                    f"{exc.strerror or exc}",
                    hint="check the permissions of the state directory and the disk",
                    code="storage",
                    session_id=session_id,
                ) from exc
            try:
                value = json.loads(raw)
                break
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                if attempt == _READ_TRIES - 1:  # not a write in progress: damaged
                    raise head_damaged(session_id, path, f"not JSON: {exc}") from None
        if not isinstance(value, dict) or set(value) != {"session_id", "high_water", "digest"}:
            raise head_damaged(session_id, path, "unexpected fields")
        high_water, digest = value["high_water"], value["digest"]
        if value["session_id"] != session_id:
            raise head_damaged(session_id, path, f"it names session {value['session_id']!r}")
        if (
            not isinstance(high_water, int)
            or isinstance(high_water, bool)
            or high_water < 0
            or not isinstance(digest, str)
            or (high_water == 0) != (digest == "")
        ):
            raise head_damaged(session_id, path, "invalid high-water mark or digest")
        return high_water, digest

    def write(self, session_id: str, high_water: int, digest: str) -> None:
        """Overwrite the session's head record in place (no fsync; see the module
        docstring)."""
        data = json.dumps(
            {"session_id": session_id, "high_water": high_water, "digest": digest},
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        if len(data) >= _RECORD:  # ids and digests are bounded: this is a programming error
            raise OSError(f"the head record of session {session_id!r} does not fit")
        record = data.ljust(_RECORD - 1) + b"\n"
        fd = self._fd(session_id, record)
        if fd is not None and os.pwrite(fd, record, 0) != len(record):
            raise OSError(f"short write to the head record of session {session_id!r}")

    def _fd(self, session_id: str, record: bytes) -> int | None:
        """The open head file of the session, reopened if the file at its path changed
        (deleted, replaced from a backup): writing to a file no path leads to helps nobody.
        None when there was no file: it is created holding ``record``."""
        path = self.path(session_id)
        known = self._open.get(session_id)
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        if known is not None:
            fd, dev, ino = known
            if now is not None and (now.st_dev, now.st_ino) == (dev, ino):
                return fd
            os.close(fd)
            del self._open[session_id]
        created = now is None
        if created:
            self._create(path, record)
        fd = os.open(path, os.O_WRONLY)
        info = os.fstat(fd)
        self._open[session_id] = (fd, info.st_dev, info.st_ino)
        return None if created else fd

    def _create(self, path: Path, record: bytes) -> None:
        """Create a head file whole: written under a hidden temporary name, then renamed,
        so a process killed while creating it leaves no file or a complete one, never an
        empty one that would read as damaged."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if os.write(fd, record) != len(record):
                raise OSError(f"short write creating the head record {path}")
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def sessions(self) -> list[str]:
        """Sessions that have a head file (whatever it holds)."""
        try:
            names = os.listdir(self.root)
        except (FileNotFoundError, NotADirectoryError):
            return []
        found: list[str] = []
        for name in names:
            if not name.endswith(_SUFFIX) or name.startswith("."):
                continue
            session_id = name[: -len(_SUFFIX)]
            with contextlib.suppress(UsageError):  # not a session's file: not ours
                found.append(check_session_id(session_id))
        return found

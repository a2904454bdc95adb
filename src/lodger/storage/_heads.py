"""Head records kept outside SQLite: one small file per session, ``<state>/heads/<id>.head``.

DESIGN L8: the digest chain cannot see a lost tail, so every open checks the events
against a head ``(high_water, digest)`` stored where losing the events does not lose it
too. SQLite's ``heads`` table lives in the same WAL as the events it covers: a damaged,
truncated or deleted WAL takes both. These files do not.

Each file is replaced atomically (write a temporary file, then ``rename``) after every
commit, without an fsync: a killed process leaves its writes in the page cache, so the
file survives a process crash followed by damage to the WAL. The file is written after
the commit it describes, so a reader that reads the head first and the events second
always finds at least the head's events; after a crash between the commit and the
rename the head lags one append behind, which is still a valid prefix.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from lodger.errors import CorruptLogError, UsageError
from lodger.storage.logstore import check_session_id

__all__ = ["HEADS_DIR", "HeadFiles", "head_damaged", "head_missing"]

HEADS_DIR = "heads"
_SUFFIX = ".head"


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


class HeadFiles:
    """The head files of one state directory. Blocking: call from the store's I/O thread."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / HEADS_DIR

    def path(self, session_id: str) -> Path:
        return self.root / f"{session_id}{_SUFFIX}"

    def exists(self) -> bool:
        return self.root.is_dir()

    def read(self, session_id: str) -> tuple[int, str] | None:
        """The recorded head, None when there is no file; damage fails closed."""
        path = self.path(session_id)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            value = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
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
        """Replace the session's head atomically (no fsync; see the module docstring)."""
        data = json.dumps(
            {"session_id": session_id, "high_water": high_water, "digest": digest},
            sort_keys=True,
        ).encode()
        final = self.path(session_id)
        tmp = self.root / f".{session_id}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

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

"""The SQLite store's second line of writer exclusion: ``writers/<session>.json``.

The ``flock`` on ``locks/<session>.lock`` is the lock; but a lock file deleted (or its
directory) under a live writer lets the next process lock a new file. So the holder
also writes its record (``_liveness``) here, and a writer that got the flock refuses
when the record names another process that is still alive on this machine. A record
left by a dead process (SIGKILL) is simply replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from lodger.errors import SessionLockedError
from lodger.storage._liveness import alive, describe, this_process

__all__ = ["claim_writer", "disclaim_writer"]

_MINE: dict[tuple[str, str], str] = {}  # (state dir, session) -> this process's token


def _path(state_dir: Path, session_id: str) -> Path:
    return state_dir / "writers" / f"{session_id}.json"


def _read(path: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        record = json.loads(path.read_text())
        return record if isinstance(record, dict) else None
    return None


def claim_writer(state_dir: Path, session_id: str) -> None:
    """Record this process as the session's writer; ``SessionLockedError`` when the
    record names another live writer (its lock file was deleted under it)."""
    path = _path(state_dir, session_id)
    record = _read(path)
    if record is not None and alive(record):
        raise SessionLockedError(
            f"session {session_id!r} is being written by {describe(record)} "
            f"(its lock file {state_dir / 'locks' / (session_id + '.lock')} was removed)",
            hint="wait for that run to finish or stop it; one writer per session",
            session_id=session_id,
        )
    token = secrets.token_hex(6)
    mine = {**this_process(), "token": token}
    with contextlib.suppress(OSError):  # read-only or full: the append fails on its own
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(mine))
        os.replace(tmp, path)
        _MINE[(str(state_dir), session_id)] = token


def disclaim_writer(state_dir: Path, session_id: str) -> None:
    """Remove this writer's record (not a newer writer's)."""
    token = _MINE.pop((str(state_dir), session_id), None)
    path = _path(state_dir, session_id)
    record = _read(path)
    if token is not None and record is not None and record.get("token") == token:
        with contextlib.suppress(OSError):
            path.unlink()

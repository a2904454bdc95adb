"""Putting workspace files back for a rewind, so that a crash at any point can be finished.

A rewind writes an *intent* first: a small JSON record in the state directory
(``rewinds/<session>.json``, written to a temporary name, fsynced and renamed) that names
the branch it will start, the prefix it forks, and every file change. Then each file is
staged beside its target (``.<name>.lodger-rewind``), fsynced and renamed over it, one at a
time; then the new branch is committed (that commit is the branch pointer,
:mod:`lodger.storage.branches`); then the intent is removed. Whoever opens the session next
and finds an intent finishes it: the changes again (each is idempotent: a file already
holding its target bytes is left alone), the branch if it is not committed yet. So a
SIGKILL anywhere leaves a log that verifies, and, once the session is opened again, a
workspace that matches the new branch; before the branch commits nothing the old branch
recorded is lost (its workspace was snapshotted first).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lodger.errors import StorageError, UsageError
from lodger.runtime._workspace_at import Change
from lodger.storage.artifacts import ArtifactStore

__all__ = ["Intent", "apply_changes", "drop_intent", "read_intent", "write_intent"]

_STAGED = ".lodger-rewind"


@dataclass(frozen=True, kw_only=True)
class Intent:
    """A rewind that has begun: enough to finish it after a crash."""

    session: str
    branch: str
    source: str
    at: int
    workspace: str | None
    changes: tuple[Change, ...]
    #: the ``rewound`` fact's fields (``left``, ``to``, counts, ``forced``, ``who``)
    rewound: dict[str, Any]
    #: the changes that put the workspace back as the rewind found it (a roll back)
    revert: tuple[Change, ...] = ()

    def to_json(self) -> bytes:
        raw = {
            "v": 1,
            "session": self.session,
            "branch": self.branch,
            "source": self.source,
            "at": self.at,
            "workspace": self.workspace,
            "changes": [c.to_dict() for c in self.changes],
            "rewound": self.rewound,
            "revert": [c.to_dict() for c in self.revert],
        }
        return json.dumps(raw, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Intent:
        raw = json.loads(data)
        return cls(
            session=raw["session"],
            branch=raw["branch"],
            source=raw["source"],
            at=int(raw["at"]),
            workspace=raw["workspace"],
            changes=tuple(Change.from_dict(c) for c in raw["changes"]),
            rewound=raw["rewound"],
            revert=tuple(Change.from_dict(c) for c in raw.get("revert", ())),
        )


def _intent_path(state_dir: Path, session: str) -> Path:
    return state_dir / "rewinds" / f"{session}.json"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, data: bytes, mode: int = 0o600) -> None:
    """``data`` at ``path``, all or nothing: staged beside it, fsynced, renamed, the
    directory fsynced."""
    staged = path.with_name(f".{path.name}{_STAGED}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=False) as handle:
            handle.write(data)
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(staged, path)
    _fsync_dir(path.parent)


async def write_intent(state_dir: Path | None, intent: Intent) -> None:
    if state_dir is None:
        return  # a memory store: nothing outlives the process to finish it

    def write() -> None:
        path = _intent_path(state_dir, intent.session)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_durably(path, intent.to_json())

    await asyncio.to_thread(write)


async def read_intent(state_dir: Path | None, session: str) -> Intent | None:
    """The unfinished rewind of ``session``, if a crash left one."""
    if state_dir is None:
        return None
    path = _intent_path(state_dir, session)
    if not path.exists():  # nearly always: one stat here, not a thread's round trip
        return None
    try:
        data = await asyncio.to_thread(path.read_bytes)
    except FileNotFoundError:
        return None
    try:
        return Intent.from_json(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(
            f"the unfinished rewind of session {session!r} at {path} cannot be read ({exc})",
            hint="it was changed outside lodger; check the workspace, then delete the file",
            code="storage",
            session_id=session,
        ) from exc


async def drop_intent(state_dir: Path | None, session: str) -> None:
    if state_dir is None:
        return

    def drop() -> None:
        path = _intent_path(state_dir, session)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            _fsync_dir(path.parent)

    await asyncio.to_thread(drop)


def confined(root: Path, relative: str, hidden: Sequence[Path]) -> Path:
    """``root / relative`` when it stays beneath ``root`` (symlinked directories
    resolved) and outside every hidden path; a log naming anything else is refused."""
    parts = Path(relative).parts
    if not parts or Path(relative).is_absolute() or ".." in parts:
        raise _outside(relative)
    target = root / relative
    parent = target.parent.resolve()
    base = root.resolve()
    if parent != base and base not in parent.parents:
        raise _outside(relative)
    where = parent / target.name
    for path in hidden:
        if where == path or path in where.parents:
            raise _outside(relative)
    return where


def _outside(relative: str) -> UsageError:
    return UsageError(
        f"cannot restore {relative!r}: it leads outside the workspace",
        hint="the log names a path lodger never writes; rewind to another point",
        code="rewind_target",
    )


def _hash_of(path: Path) -> tuple[str, int] | None:
    try:
        with open(path, "rb") as handle:  # a symlink is followed: compared by content
            return hashlib.file_digest(handle, "sha256").hexdigest(), os.fstat(
                handle.fileno()
            ).st_mode & 0o7777
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


async def apply_changes(
    root: Path, changes: Sequence[Change], blobs: ArtifactStore, hidden: Sequence[Path]
) -> None:
    """Make each file what its change says, one durable rename at a time; a file that
    already is is left alone, so applying again after a crash finishes the job."""
    for change in changes:
        target = await asyncio.to_thread(confined, root, change.path, hidden)
        try:
            await _apply(target, change, blobs)
        except OSError as exc:
            raise StorageError(
                f"cannot restore {change.path!r} in {root}: {exc.strerror or exc}",
                hint="check the workspace's permissions and free space",
                code="storage",
            ) from exc


async def _apply(target: Path, change: Change, blobs: ArtifactStore) -> None:
    # a copy staged by a rewind killed before its rename is never used: drop it
    await asyncio.to_thread(target.with_name(f".{target.name}{_STAGED}").unlink, missing_ok=True)
    if change.sha256 is None:
        await asyncio.to_thread(_remove, target)
        return
    if await asyncio.to_thread(_hash_of, target) == (change.sha256, change.mode):
        return
    data = await blobs.get(change.sha256)
    if hashlib.sha256(data).hexdigest() != change.sha256:
        raise StorageError(
            f"the stored bytes of {change.path!r} do not match their hash {change.sha256[:16]}",
            hint="the artifact store was damaged; run `lodger store verify --deep`",
            code="artifact_corrupt",
        )
    await asyncio.to_thread(_put, target, data, change.mode)


def _put(target: Path, data: bytes, mode: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # the rename replaces a symlink there: never written through
    _write_durably(target, data, mode)


def _remove(target: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if target.is_dir() and not target.is_symlink():
            return  # directories are never removed
        target.unlink()
        _fsync_dir(target.parent)

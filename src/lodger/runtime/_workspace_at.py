"""What the log says a session's workspace held at a prefix, and how a rewind gets there.

Two kinds of fact describe a workspace: ``workspace_snapshot`` (the whole tree, at a turn's
end and when a rewind leaves a branch) and ``file_checkpoint`` (one file tool's edit: the
hash before and after, the old bytes as an artifact). The view at a prefix ``[0, end)``:

- from the newest snapshot before ``end``, with the edits after it (up to ``end``) applied:
  each edit's ``after_sha256`` (its bytes are found by hash: a later snapshot, a later
  edit's ``before``, or the snapshot a rewind takes when it leaves hold them);
- else from the first snapshot at or after ``end``, with the edits between ``end`` and it
  undone (each edit's ``before``);
- else only the files the edits touched are known (a *partial* view): a file's state at
  ``end`` is the ``after`` of its last edit before ``end`` or the ``before`` of its first
  edit after. Files no fact names are left alone.

Only regular files are restored (contents and permission bits); directories are created
as needed and never removed, symlinks are left as they are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lodger.events import Event, FileCheckpoint, WorkspaceSnapshot
from lodger.storage.artifacts import ArtifactStore

__all__ = ["Change", "WorkspaceView", "plan_changes", "read_snapshot", "reverting", "view_at"]

_DEFAULT_MODE = 0o644


@dataclass(frozen=True, slots=True)
class FileState:
    """A file as a fact records it: its sha256 and permission bits (None: not known)."""

    sha256: str
    mode: int | None = None


@dataclass(kw_only=True)
class WorkspaceView:
    """Regular files by workspace-relative path (None: absent). ``complete``: a path not
    listed is absent too (the view comes from a snapshot)."""

    files: dict[str, FileState | None] = field(default_factory=dict)
    complete: bool = False

    def knows(self, path: str) -> bool:
        return self.complete or path in self.files

    def get(self, path: str) -> FileState | None:
        return self.files.get(path)


@dataclass(frozen=True, slots=True)
class Change:
    """Put ``path`` back to ``sha256`` with ``mode`` (``sha256`` None: remove it)."""

    path: str
    sha256: str | None
    mode: int = _DEFAULT_MODE

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "mode": self.mode}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Change:
        return cls(path=str(raw["path"]), sha256=raw["sha256"], mode=int(raw["mode"]))


async def read_snapshot(blobs: ArtifactStore, ref: str) -> WorkspaceView:
    """The regular files of snapshot ``ref`` (its manifest is read and checked)."""
    raw = json.loads(await blobs.get(ref))
    files: dict[str, FileState | None] = {
        str(e["path"]): FileState(str(e["sha256"]), int(e["mode"]))
        for e in raw["entries"]
        if e["type"] == "file"
    }
    return WorkspaceView(files=files, complete=True)


def _after(checkpoint: FileCheckpoint, known: FileState | None) -> FileState | None:
    if checkpoint.after_sha256 is None:
        return None
    return FileState(checkpoint.after_sha256, known.mode if known is not None else None)


def _before(checkpoint: FileCheckpoint, known: FileState | None) -> FileState | None:
    if checkpoint.before_sha256 is None:
        return None
    return FileState(checkpoint.before_sha256, known.mode if known is not None else None)


async def view_at(events: Sequence[Event], end: int, blobs: ArtifactStore) -> WorkspaceView:
    """The workspace the log ``events`` says there was at prefix ``[0, end)``."""
    last = next(
        (i for i in range(end - 1, -1, -1) if isinstance(events[i].body, WorkspaceSnapshot)),
        None,
    )
    if last is not None:
        body = events[last].body
        assert isinstance(body, WorkspaceSnapshot)
        view = await read_snapshot(blobs, body.ref)
        _redo(view, events[last + 1 : end])
        return view
    after = next(
        (i for i in range(end, len(events)) if isinstance(events[i].body, WorkspaceSnapshot)),
        None,
    )
    if after is not None:
        body = events[after].body
        assert isinstance(body, WorkspaceSnapshot)
        view = await read_snapshot(blobs, body.ref)
        _undo(view, events[end:after])
        return view
    view = WorkspaceView()
    _redo(view, events[:end])
    later = WorkspaceView()
    _undo(later, events[end:])
    for path, state in later.files.items():
        view.files.setdefault(path, state)
    return view


def _redo(view: WorkspaceView, events: Sequence[Event]) -> None:
    for event in events:
        if isinstance(event.body, FileCheckpoint):
            path = event.body.path
            view.files[path] = _after(event.body, view.files.get(path))


def _undo(view: WorkspaceView, events: Sequence[Event]) -> None:
    for event in reversed(events):
        if isinstance(event.body, FileCheckpoint):
            path = event.body.path
            view.files[path] = _before(event.body, view.files.get(path))


def plan_changes(
    *, current: WorkspaceView, logged: WorkspaceView, target: WorkspaceView
) -> tuple[list[Change], list[str]]:
    """The changes that take the ``current`` workspace to ``target``, and the paths among
    them whose current content is not what the log says the branch left (``logged``):
    changed outside lodger."""
    paths = set(target.files)
    if target.complete:
        paths |= {p for p, state in current.files.items() if state is not None}
    changes: list[Change] = []
    outside: list[str] = []
    for path in sorted(paths):
        want, have = target.get(path), current.get(path)
        if _sha(want) == _sha(have) and _same_mode(want, have):
            continue
        mode = next(
            (s.mode for s in (want, have) if s is not None and s.mode is not None), _DEFAULT_MODE
        )
        changes.append(Change(path=path, sha256=_sha(want), mode=mode))
        if logged.knows(path) and _sha(logged.get(path)) != _sha(have):
            outside.append(path)
    return changes, outside


def reverting(changes: Sequence[Change], current: WorkspaceView) -> list[Change]:
    """The changes that put each file ``changes`` touch back as it is in ``current``."""
    out: list[Change] = []
    for change in changes:
        now = current.get(change.path)
        if now is None:
            out.append(Change(path=change.path, sha256=None))
        else:
            out.append(Change(path=change.path, sha256=now.sha256, mode=now.mode or _DEFAULT_MODE))
    return out


def _same_mode(want: FileState | None, have: FileState | None) -> bool:
    if want is None or want.mode is None:
        return True
    return have is not None and have.mode == want.mode


def _sha(state: FileState | None) -> str | None:
    return state.sha256 if state is not None else None

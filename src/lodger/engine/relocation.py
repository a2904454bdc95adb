"""Relocation: resuming a session in another workspace, vouched for by the log's hashes.

A workspace is known by its identity (real path, device and inode: ``workspace_id``), so
a moved, copied or recreated directory is another workspace and resume refuses it. An
operator can still name the directory that now holds the session's files: every write
tool records in its T1 the hash each file has before and will have after the write
(``FileExpectation``). Folded over the log in order, those say what each file the session
wrote must hold now; when every one of them matches in the new directory, the resume
moves there and its claim (``run_started``) records the new workspace, which the session
keeps from then on. Files changed by tools that record no expectations (a shell command)
cannot be checked; the check covers exactly what the log's hashes cover.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from lodger.errors import ToolCallError
from lodger.events import (
    Event,
    FileExpectation,
    OperatorDecision,
    RecoveryObserved,
    ToolDispatched,
    ToolResponded,
)
from lodger.tools.workspace import resolve_in_workspace, sha256_of_file

__all__ = ["FileMismatch", "Relocation", "expected_files", "find_mismatches"]


@dataclass(frozen=True, kw_only=True)
class Relocation:
    """Where a resume moves the session: the new directory and its identity."""

    workspace: str
    workspace_id: str


@dataclass(frozen=True, kw_only=True)
class FileMismatch:
    """A file whose content is not one the log allows for it now."""

    path: str
    #: the hashes the log allows (None: the file is absent); two when an outcome is unknown
    allowed: frozenset[str | None]
    #: the hash found (None: absent); ``unreadable`` says why it could not be hashed
    found: str | None
    unreadable: str | None = None

    def describe(self) -> str:
        want = " or ".join(sorted(_name(h) for h in self.allowed))
        if self.unreadable is not None:
            return (
                f"file {self.path!r} cannot be checked ({self.unreadable}); the log expects {want}"
            )
        return f"file {self.path!r} is {_name(self.found)}; the log expects {want}"


def _name(digest: str | None) -> str:
    return "absent" if digest is None else f"sha256 {digest[:16]}"


def expected_files(events: Iterable[Event]) -> dict[str, frozenset[str | None]]:
    """What each file the session wrote may hold now, from the T1 expectations in the log.

    A write known to have happened (T2 ok, or recovery or the operator found it completed)
    leaves its after-hash; one known not to have happened leaves its before-hash; a write
    whose outcome is unknown (no T2, a failed or interrupted response) allows either.
    A later write to a path replaces what an earlier one said.
    """
    pending: dict[str, tuple[FileExpectation, ...]] = {}
    allowed: dict[str, frozenset[str | None]] = {}

    def settle(operation_id: str, applied: bool) -> None:
        for x in pending.get(operation_id, ()):
            allowed[x.path] = frozenset({x.after_sha256 if applied else x.before_sha256})

    for e in events:
        body = e.body
        if isinstance(body, ToolDispatched) and body.expectations:
            pending[body.operation_id] = body.expectations
            for x in body.expectations:
                allowed[x.path] = frozenset({x.before_sha256, x.after_sha256})
        elif isinstance(body, ToolResponded):
            if body.status == "ok":
                settle(body.operation_id, True)
        elif isinstance(body, RecoveryObserved | OperatorDecision):
            outcome = body.status if isinstance(body, RecoveryObserved) else body.decision
            if outcome in ("completed", "not_applied"):
                settle(body.operation_id, outcome == "completed")
    return allowed


def find_mismatches(root: Path, allowed: Mapping[str, frozenset[str | None]]) -> list[FileMismatch]:
    """Every file under ``root`` whose hash the log does not allow, sorted by path.

    Blocking (it hashes files): call it from a thread.
    """
    out: list[FileMismatch] = []
    for path in sorted(allowed):
        hashes = allowed[path]
        try:
            found = sha256_of_file(resolve_in_workspace(root, path, must_exist=False))
        except (ToolCallError, OSError) as exc:
            message = exc.message if isinstance(exc, ToolCallError) else str(exc)
            out.append(FileMismatch(path=path, allowed=hashes, found=None, unreadable=message))
            continue
        if found not in hashes:
            out.append(FileMismatch(path=path, allowed=hashes, found=found))
    return out

"""``lodger store verify``: check the workspace snapshots of sessions against their blobs.

A snapshot looks at a blob already stored once (an object store: one HEAD, its size);
``--deep`` reads every blob back and compares its sha256 with its name, so a copy
damaged behind lodger's back with its size kept is found before a restore needs it.
``--repair`` stores a damaged blob again from the workspace file that still holds its
bytes (``lodger.storage.snapshotcheck``). Exit 1 while damage is left.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from lodger.cli._common import (
    echo_json,
    json_option,
    location,
    make_console,
    resolve_session,
    state_option,
)
from lodger.errors import SessionNotFoundError, UsageError
from lodger.events import WorkspaceSnapshot
from lodger.storage import Storage
from lodger.storage.control import open_control
from lodger.storage.snapshotcheck import SnapshotCheck, check_snapshots

__all__ = ["COMMANDS"]


@click.group("store")
def store_group() -> None:
    """Check what the store keeps for sessions.

    \b
    Example:
      lodger store verify SESSION --deep
      lodger store verify --deep --repair --workspace . --json
    """


@store_group.command("verify")
@click.argument("session_id", metavar="[SESSION]", required=False)
@click.option("--last", is_flag=True, default=False, help="Check the latest session only.")
@click.option(
    "--deep", is_flag=True, default=False, help="Read every blob back and check its sha256."
)
@click.option(
    "--repair",
    is_flag=True,
    default=False,
    help="Store a damaged blob again from the workspace file that still holds its bytes.",
)
@click.option(
    "--workspace",
    "workspace",
    default=".",
    show_default=True,
    metavar="DIR",
    type=click.Path(file_okay=False, dir_okay=True, path_type=Path),
    help="The live workspace --repair reads files from.",
)
@state_option
@json_option
def verify(
    session_id: str | None,
    last: bool,
    deep: bool,
    repair: bool,
    workspace: Path,
    state: str,
    as_json: bool,
) -> None:
    """Check every workspace snapshot of SESSION (default: of every session).

    Without --deep each blob is looked up by name and size, as a snapshot does; --deep
    reads each back (streamed) and compares its sha256 with its name, once per blob.
    Damage is named: session, snapshot, path, blob key. --repair (with --deep or alone)
    stores a damaged blob again from the file of --workspace whose bytes still hash to
    its name, keeping the damaged copy aside; one no file matches is reported as
    unrepairable. Snapshots come from the session's log and, where a control plane is
    configured, its index. Exits 1 while damage is left.

    \b
    Example:
      lodger store verify SESSION --deep
      lodger store verify --deep --repair --workspace ~/project --json
    """
    if repair and not workspace.is_dir():
        raise UsageError(
            f"--repair reads files from {workspace}, which is not a directory",
            hint="pass the session's live workspace with --workspace DIR",
        )
    ids = [resolve_session(state, session_id, last=last)] if session_id or last else None
    reports = asyncio.run(
        _verify(ids, deep=deep or repair, repair=repair, workspace=workspace.resolve())
    )
    left = sum(len(r.unrepaired) for r in reports)
    if as_json:
        echo_json(
            {"ok": left == 0, "deep": deep or repair, "sessions": [r.to_dict() for r in reports]}
        )
    else:
        _render(reports, deep=deep or repair)
    if left:
        raise click.exceptions.Exit(1)


async def _verify(
    ids: list[str] | None, *, deep: bool, repair: bool, workspace: Path
) -> list[SnapshotCheck]:
    storage = location().open()
    try:
        sessions = ids if ids is not None else sorted(await storage.log.list_sessions())
        reports = []
        for sid in sessions:
            refs = await _snapshot_refs(storage, sid)
            reports.append(
                await check_snapshots(
                    refs,
                    storage.artifacts,
                    session_id=sid,
                    deep=deep,
                    workspace=workspace,
                    repair=repair,
                )
            )
        return reports
    finally:
        await storage.log.close()


async def _snapshot_refs(storage: Storage, session_id: str) -> list[tuple[str, str]]:
    """The snapshots of ``session_id``, newest first: its log's ``workspace_snapshot``
    facts, and the snapshot the control plane's index holds for it (a worker's)."""
    refs: list[tuple[str, str]] = []
    in_log = await storage.log.exists(session_id)
    if in_log:
        for event in reversed(await storage.log.read_all(session_id)):
            if isinstance(event.body, WorkspaceSnapshot):
                refs.append(("log", event.body.ref))
    dsn = location().control_dsn(create=False)
    indexed = False
    if dsn is not None:
        plane = open_control(dsn)
        try:
            await plane.start()
            row = await plane.get_session(session_id=session_id)
        finally:
            await plane.close()
        indexed = row is not None
        if row is not None and row.snapshot:
            refs.insert(0, ("index", row.snapshot))
    if not in_log and not indexed:
        raise SessionNotFoundError(
            f"no session {session_id!r} in this store",
            hint="run `lodger sessions` (with the same --state or --store) to list them",
            session_id=session_id,
        )
    return refs


def _render(reports: list[SnapshotCheck], *, deep: bool) -> None:
    console = make_console()
    how = "read back" if deep else "looked up (name and size; --deep reads them back)"
    for report in reports:
        for damage in report.damage:
            mark = ("repaired", "bold green") if damage.repaired else ("damaged", "bold red")
            where = damage.path or "(the snapshot's manifest)"
            console.print(
                Text.assemble(
                    mark,
                    f": session {damage.session_id} snapshot {damage.snapshot[:16]} "
                    f"{where}: blob {damage.key} is {_problem(damage.problem)}",
                    f"; {damage.note}" if damage.note else "",
                ),
                soft_wrap=True,
            )
        left = len(report.unrepaired)
        status: tuple[str, str] = ("ok", "bold green") if not left else ("damaged", "bold red")
        console.print(
            Text.assemble(
                status,
                f": session {report.session_id}: {len(report.snapshots)} snapshot(s), "
                f"{report.blobs} blob(s) {how}, {len(report.damage)} damaged, "
                f"{left} left",
            ),
            soft_wrap=True,
        )
    if not reports:
        console.print("no sessions in this store")


def _problem(problem: Any) -> str:
    return {
        "missing": "missing",
        "corrupt": "damaged (its bytes do not hash to its name)",
        "size": "of the wrong size",
    }.get(str(problem), str(problem))


COMMANDS: tuple[click.Command, ...] = (store_group,)

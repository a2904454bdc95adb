"""``lodger rewind``: take a session back to an earlier point, conversation and files."""

from __future__ import annotations

import sys

import click

from lodger.cli._common import (
    echo_json,
    json_option,
    location,
    require_log,
    run_with_log,
    session_argument,
    state_option,
    storage_flags,
)
from lodger.cli._identity import cli_user
from lodger.errors import ResumeBlockedError
from lodger.runtime.rewind import RewindResult
from lodger.runtime.sessions import Sessions
from lodger.storage import EventLog

__all__ = ["COMMANDS", "rewind"]

EXIT_BLOCKED = 3


@click.command()
@session_argument
@click.option(
    "--to",
    "to",
    type=click.IntRange(min=1),
    default=None,
    metavar="OFFSET",
    help="Keep events [0, OFFSET) of the branch (offsets as `lodger log show` prints them).",
)
@click.option(
    "--turn",
    "turn",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Go back to just before turn N started (numbered from 1 as `lodger log show` does).",
)
@click.option(
    "--branch",
    "branch",
    default=None,
    metavar="BRANCH",
    help="Take the point from this branch of the session (default: its current one); "
    "alone, its head: rewinding to the branch a rewind left undoes it.",
)
@click.option("--undo", is_flag=True, default=False, help="Undo the session's last rewind.")
@click.option(
    "--force",
    is_flag=True,
    default=False,
    help="Overwrite files changed outside lodger (the branch left behind keeps them).",
)
@state_option
@json_option
def rewind(
    session_id: str,
    to: int | None,
    turn: int | None,
    branch: str | None,
    undo: bool,
    force: bool,
    state: str,
    as_json: bool,
) -> None:
    """Rewind SESSION to an earlier point: its conversation and its workspace files.

    Nothing is deleted: a new branch shares the session's events before the point (a
    copy-free fork) and becomes the session's current one, and the workspace's files are
    put back to what the log recorded there. The branch left behind stays, so a rewind
    is undone with --undo (or --branch LEFT). Files changed outside lodger since the log
    last recorded them refuse the rewind, named, unless --force.

    SESSION is an id, a unique prefix of one, or --last.

    \b
    Example:
      lodger rewind SESSION --turn 3
      lodger rewind SESSION --to 42 --force
      lodger rewind SESSION --undo
    """
    if not (to or turn or branch or undo):
        raise click.UsageError("give --to OFFSET, --turn N, --branch BRANCH or --undo")
    where = location()

    async def work(log: EventLog) -> RewindResult:
        require_log(log, state, session_id)
        async with Sessions(where.open()) as sessions:
            return await sessions.rewind(
                session_id,
                to=to,
                turn=turn,
                branch=branch,
                undo=undo,
                force=force,
                who=cli_user(),
            )

    try:
        done = run_with_log(state, work)
    except ResumeBlockedError as exc:
        if exc.code != "workspace_changed":
            raise
        _refused(exc)
        sys.exit(EXIT_BLOCKED)
    if as_json:
        echo_json(done.to_dict())
        return
    _report(done)


def _refused(exc: ResumeBlockedError) -> None:
    click.echo(f"refused: {exc.message}", err=True)
    for line in exc.blockers:
        click.echo(f"  - {line}", err=True)
    click.echo("hint: keep a copy of them, or rewind again with --force", err=True)


def _report(done: RewindResult) -> None:
    flag = storage_flags()
    click.echo(
        f"rewound {done.session_id} to offset {done.to.high_water} of {done.source}: "
        f"now on branch {done.branch}; {done.restored} file(s) restored, "
        f"{done.removed} removed"
    )
    for path in done.forced:
        click.echo(f"  overwrote {path} (changed outside lodger; kept on {done.left.session_id})")
    click.echo(f"undo: lodger rewind {done.session_id} --undo{flag}")


COMMANDS = (rewind,)

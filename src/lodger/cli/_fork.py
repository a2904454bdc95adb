"""``lodger fork``: a new session from a verified prefix of another, copying nothing."""

from __future__ import annotations

import click

from lodger.cli._common import (
    echo_json,
    json_option,
    refuse_empty,
    run_with_log,
    session_argument,
    state_option,
)
from lodger.ids import SystemClock, Uuid7Factory
from lodger.storage import EventLog
from lodger.storage.forks import Fork, fork_session

__all__ = ["COMMANDS", "fork"]


@click.command()
@session_argument
@click.option(
    "--at",
    "at",
    type=int,
    default=None,
    metavar="OFFSET",
    help="Share events [0, OFFSET) (default: all).",
)
@click.option(
    "--as", "new_id", default=None, metavar="ID", help="The fork's session id (default: a new one)."
)
@state_option
@json_option
def fork(session_id: str, at: int | None, new_id: str | None, state: str, as_json: bool) -> None:
    """Start a new session from SESSION's events before OFFSET.

    The prefix is verified first; the fork records the parent, the prefix's high-water
    mark and digest, and the parent's workspace snapshot at that point. No event,
    artifact or snapshot is copied. Both sessions go on independently.

    SESSION is an id, a unique prefix of one, or --last.

    \b
    Example:
      lodger fork 0197c2d4-... --at 12 --as try-other-fix
      lodger fork --last --as try-again
    """
    refuse_empty(new_id, "--as", hint="give the fork's session id, or leave --as out for a new one")
    session = session_id
    clock = SystemClock()
    ids = Uuid7Factory(clock)

    async def work(log: EventLog) -> Fork:
        return await fork_session(
            log,
            session,
            fork_id=new_id if new_id is not None else ids.new_id(),
            at=at,
            clock=clock,
            ids=ids,
        )

    made = run_with_log(state, work)
    if as_json:
        echo_json(
            {
                "session_id": made.session_id,
                "parent": made.parent.model_dump(),
                "snapshot": made.snapshot,
            }
        )
        return
    click.echo(
        f"forked {session} at offset {made.parent.high_water} into {made.session_id} "
        f"(shares {made.parent.high_water} events by reference; nothing copied)"
    )


COMMANDS = (fork,)

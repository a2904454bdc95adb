"""``lodger mode``: show or switch a session's permission mode.

``plan`` (read-only), ``ask`` (every effect asks), ``accept_edits`` (file edits in the
workspace go, other effects ask), ``full_auto`` (everything inside the sandbox goes). A
switch is a ``permission_mode_changed`` fact, committed by whoever runs the session (a
`lodger run` or a host on this machine takes it through the state directory), and
applies from the next step; the project's deny rules hold in every mode.
"""

from __future__ import annotations

import asyncio

import click

from lodger.cli._common import (
    echo_json,
    json_option,
    location,
    refuse_empty,
    remember_control,
    resolve_session,
    state_option,
    store_url,
)
from lodger.cli._identity import cli_user
from lodger.cli._recover import _outside_turns
from lodger.errors import SessionNotFoundError
from lodger.runtime._session_control import ModeOutcome, check_mode
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage

__all__ = ["COMMANDS", "mode"]


async def _mode(
    state: str, session_id: str, mode: str | None, dsn: str | None
) -> ModeOutcome | str | None:
    storage = Storage.open(state, store=store_url())
    try:
        sessions = Sessions(storage)
        if mode is not None:
            if dsn is not None:  # a worker running the turn commits it through the turn
                from lodger.runtime._worker_cancel import switch_through

                asked = await switch_through(dsn, session_id, check_mode(mode), who=cli_user())
                if asked is not None:
                    return asked
            # under the session's lease, as abandon does: never while a worker runs it
            async with _outside_turns(dsn, session_id):
                return await sessions.set_permission_mode(session_id, mode, who=cli_user())
        if not await storage.log.exists(session_id):
            raise SessionNotFoundError(
                f"no session {session_id!r} in {state!r}",
                hint="list them with `lodger sessions`",
                session_id=session_id,
            )
        return (await sessions.state(session_id)).permission_mode
    finally:
        await storage.close()


@click.command()
@click.argument("session_id", metavar="SESSION", required=False)
@click.argument("mode", required=False)
@click.option("--last", is_flag=True, default=False, help="Use the session with the latest event.")
@click.option(
    "--control",
    metavar="DSN",
    default=None,
    envvar="LODGER_CONTROL",
    show_envvar=True,
    help="The control plane of the workers (default: the one in the state directory, "
    "when a worker made one): a worker running the session's turn commits the switch "
    "through it.",
    callback=remember_control,
)
@state_option
@json_option
def mode(
    session_id: str | None,
    mode: str | None,
    last: bool,
    control: str | None,
    state: str,
    as_json: bool,
) -> None:
    """Show SESSION's permission mode, or switch it to MODE (one of the four below).

    \b
    plan          read-only: only tools that do not write run
    ask           every call of a tool that writes asks
    accept_edits  file edits in the workspace go; other effects ask
    full_auto     everything inside the sandbox goes

    The switch applies from the session's next step, also while a turn runs in another
    process here or (with --control) on a worker. Deny rules of lodger.toml hold in every
    mode.

    \b
    Example:
      lodger mode --last plan
      lodger mode 0197c2d4 full_auto
    """
    if last and session_id is not None and mode is None:
        session_id, mode = None, session_id  # `mode --last MODE`: the one given is MODE
    refuse_empty(session_id, "SESSION", hint="pass a session id, a unique prefix of one, or --last")
    if mode is not None:
        check_mode(mode)  # before anything is opened
    session_id = resolve_session(state, session_id, last=last)
    dsn = location().control_dsn(create=False)
    found = asyncio.run(_mode(state, session_id, mode, dsn))
    if not isinstance(found, ModeOutcome):
        if as_json:
            echo_json({"session_id": session_id, "mode": found})
        else:
            click.echo(f"{session_id}: {found or 'no mode set (the policy alone decides)'}")
        return
    if as_json:
        echo_json(found.to_dict())
        return
    if found.status == "unchanged":
        click.echo(f"{session_id} is in {found.mode} mode already; nothing was written")
    else:
        click.echo(
            f"{session_id}: permission mode {found.previous or 'none'} -> {found.mode} "
            "(from the next step)"
        )


COMMANDS = (mode,)

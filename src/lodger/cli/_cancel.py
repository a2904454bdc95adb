"""``lodger cancel``: end a session's running turn ``cancelled``, wherever it runs.

The turn may run in another ``lodger run`` process or in a host on this machine (the
request goes through the state directory: ``lodger.runtime._local_control``), or on a
worker (``--control``: the request goes through the control plane, and the worker that
holds the session's lease delivers it). Queued calls never start, calls past T1 settle
and are recorded. An open turn nobody runs (parked, interrupted by a crash) is ended
cancelled here; a second cancel, or one of a session with no open turn, writes nothing.
"""

from __future__ import annotations

import asyncio

import click

from lodger.cli._common import (
    echo_json,
    json_option,
    location,
    remember_control,
    session_argument,
    state_option,
    storage_flags,
    store_url,
)
from lodger.cli._identity import cli_user
from lodger.engine.control import CancelOutcome
from lodger.errors import SessionNotFoundError
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage

__all__ = ["COMMANDS", "cancel"]


async def _cancel(state: str, session_id: str, reason: str, control: str | None) -> CancelOutcome:
    storage = Storage.open(state, store=store_url())
    try:
        sessions = Sessions(storage)
        # with workers, an open turn is ended here only once none of them holds it
        outcome = await sessions.cancel(
            session_id, who=cli_user(), reason=reason, settle_open=control is None
        )
        if control is not None and outcome.status in ("not_running", "unknown_session"):
            from lodger.runtime._worker_cancel import request_cancel  # only with workers

            outcome = await request_cancel(control, session_id, who=cli_user(), reason=reason)
            if outcome.status == "not_running":  # nobody holds it: end an open turn here
                outcome = await sessions.cancel(session_id, who=cli_user(), reason=reason)
        return outcome
    finally:
        await storage.close()


_SAID = {
    "cancelled": "cancelled: turn {turn} of {sid} ended cancelled",
    "requested": "cancel requested: turn {turn} of {sid} ends cancelled at its next safe point "
    "(`lodger log show {sid}{flag}` shows when)",
    "already_cancelling": "already being cancelled: turn {turn} of {sid}; nothing more written",
    "not_running": "nothing to cancel: no turn of {sid} is open; nothing was written",
}


@click.command()
@session_argument
@click.option("--reason", default="", metavar="TEXT", help="Why, recorded with the fact.")
@click.option(
    "--control",
    metavar="DSN",
    default=None,
    envvar="LODGER_CONTROL",
    show_envvar=True,
    help="The control plane of the workers (default: the one in the state directory, "
    "when a worker made one): when no process here runs the session, the worker that "
    "holds its lease is asked to cancel.",
    callback=remember_control,
)
@state_option
@json_option
def cancel(session_id: str, reason: str, control: str | None, state: str, as_json: bool) -> None:
    """Cancel SESSION's running turn: it ends cancelled.

    Works for a turn another `lodger run`, a host or (with --control) a worker runs.
    Calls not started yet never start; a running call (a sandboxed command) is stopped,
    and it and every call past dispatch are recorded before the turn ends. Asking twice,
    or for a session that runs nothing, writes nothing and says so.

    \b
    Example:
      lodger cancel --last --reason "wrong task"
    """
    dsn = location().control_dsn(create=False)  # --control, or the state directory's own
    outcome = asyncio.run(_cancel(state, session_id, reason, dsn))
    if outcome.status == "unknown_session":
        raise SessionNotFoundError(
            f"no session {session_id!r} in {state!r}",
            hint="list them with `lodger sessions`",
            session_id=session_id,
        )
    if as_json:
        echo_json(outcome.to_dict())
        return
    text = _SAID[outcome.status].format(
        turn=outcome.turn_id or "-", sid=session_id, flag=storage_flags()
    )
    if outcome.status == "not_running" and outcome.turn_status is not None:
        text = f"nothing to cancel: the turn ended {outcome.turn_status} first; nothing was written"
    click.echo(text)


COMMANDS = (cancel,)

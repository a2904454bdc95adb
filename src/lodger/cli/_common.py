"""What every command shares: the ``--state`` and ``--json`` options, running async work
against the event log, JSON output and the rich console.

A new command module uses these and registers itself in ``lodger/cli/__init__.py``::

    @click.command()
    @state_option
    @json_option
    def heads(state: str, as_json: bool) -> None:
        async def work(log: EventLog) -> list[str]:
            return await log.list_sessions()

        echo_json({"heads": run_with_log(state, work)})
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import re
import shlex
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import click
from rich.console import Console

from lodger.errors import SessionNotFoundError, UsageError
from lodger.runtime.location import DEFAULT_STATE, StorageLocation
from lodger.storage import EventLog, Storage, check_session_id, open_log
from lodger.storage._storage import STORE_ENVVAR
from lodger.storage.branches import current_branch, names_a_branch, root_of

__all__ = [
    "DEFAULT_STATE",
    "JSON_VERSION",
    "STATE_ENVVAR",
    "Seconds",
    "document",
    "echo_json",
    "format_ts",
    "json_option",
    "location",
    "log_exists",
    "make_console",
    "refuse_empty",
    "remember_control",
    "require_log",
    "resolve_session",
    "retain_until_exit",
    "run_with_log",
    "session_argument",
    "state_option",
    "storage_flags",
    "store_url",
]


class Seconds(click.FloatRange):
    """A number of seconds within a range, and finite: ``FloatRange`` alone lets ``nan``
    through (every comparison with it is false) and ``inf`` where it has no maximum."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds


STATE_ENVVAR = "LODGER_STATE"

T = TypeVar("T")
_SESSION_HINT = "pass a session id, a unique prefix of one, or --last"
F = TypeVar("F", bound=Callable[..., Any])


def state_option(fn: F) -> F:
    """``--state DIR``: the state directory (default ``.lodger``, env ``LODGER_STATE``)."""
    option = click.option(
        "--state",
        "state",
        default=DEFAULT_STATE,
        envvar=STATE_ENVVAR,
        show_default=True,
        show_envvar=True,
        metavar="DIR",
        type=click.Path(file_okay=False, dir_okay=True, path_type=str),
        help="State directory that holds the event log.",
        callback=_remember_state,
    )
    store = click.option(
        "--store",
        "store",
        default=None,
        envvar=STORE_ENVVAR,
        show_envvar=True,
        metavar="URL",
        expose_value=False,
        help="Keep the sessions in an object store instead of --state: file:///path, "
        "memory:// or s3://bucket/prefix?endpoint=URL (credentials from the AWS_* variables).",
        callback=_remember_store,
    )
    return store(option(fn))


def _remember_store(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    ctx.find_root().meta["lodger.store"] = value or None


def store_url() -> str | None:
    """The ``--store`` URL (or ``$LODGER_STORE``) of the running command, if any."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and "lodger.store" in ctx.find_root().meta:
        value = ctx.find_root().meta["lodger.store"]
        return str(value) if value else None
    return os.environ.get(STORE_ENVVAR) or None


def remember_control(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A ``--control`` option's callback: hints then name the same control plane."""
    ctx.find_root().meta["lodger.storage.control"] = value or None
    return value


def location(meta: Mapping[str, Any] | None = None) -> StorageLocation:
    """Where the running command keeps its sessions: its ``--state``, ``--store`` (or
    ``$LODGER_STORE``) and ``--control`` (read from ``meta``, the root context's, when
    no command is running any more)."""
    if meta is None:
        ctx = click.get_current_context(silent=True)
        meta = ctx.find_root().meta if ctx is not None else {}
    store = meta["lodger.store"] if "lodger.store" in meta else os.environ.get(STORE_ENVVAR)
    return StorageLocation(
        state=str(meta.get("lodger.state") or DEFAULT_STATE),
        store=store or None,
        control=meta.get("lodger.storage.control") or None,
    )


def storage_flags(where: StorageLocation | None = None) -> str:
    """The flags that name ``where`` (default: the running command's), for hints and
    next steps: `` --state DIR`` unless the default, `` --store URL``, `` --control
    DSN`` (a password in it is never printed: it shows as ``PASSWORD``)."""
    where = where or location()
    flags = ""
    if where.state != DEFAULT_STATE:
        flags += f" --state {shlex.quote(where.state)}"
    if where.store:
        flags += f" --store {shlex.quote(where.store)}"
    if where.control:
        flags += f" --control {shlex.quote(_without_password(where.control))}"
    return flags


def _without_password(dsn: str) -> str:
    parts = urlsplit(dsn)
    if "://" not in dsn or parts.password is None:
        return re.sub(r"(password=)\S+", r"\1PASSWORD", dsn)
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:PASSWORD@{host}"))


def _remember_state(ctx: click.Context, param: click.Parameter, value: str) -> str:
    # errors name their next steps as commands, which need the same --state
    ctx.find_root().meta["lodger.state"] = value
    return value


def json_option(fn: F) -> F:
    """``--json``: print machine-readable JSON instead of the rich view (and errors as
    JSON on stderr)."""
    option = click.option(
        "--json",
        "as_json",
        is_flag=True,
        default=False,
        help="Print JSON for scripts (schema v1: the CLI guide); errors are JSON on stderr.",
        callback=_remember_json,
    )
    return option(fn)


def _remember_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.find_root().meta["lodger.json"] = True
    return value


#: what a command opened and no longer needs, kept from being freed before the process
#: leaves: a long session's fold is millions of objects, and freeing them one by one costs
#: 40-60 ms at 100k events after the answer is printed. The CLI leaves with ``os._exit``
#: (``lodger.cli``), which frees none; a process that exits as usual frees them then.
_RETAINED: list[object] = []


def retain_until_exit(value: object) -> None:
    """Keep ``value`` alive until the process leaves (see ``_RETAINED``)."""
    _RETAINED.append(value)


def run_with_log(
    state: str, work: Callable[[EventLog], Awaitable[T]], *, require_key: bool | None = None
) -> T:
    """Open the log in ``state``, run ``work`` on a fresh event loop, always close the log.

    The log key comes from ``$LODGER_LOG_KEY`` or ``$LODGER_LOG_KEY_FILE``;
    ``require_key`` (default ``$LODGER_LOG_KEY_REQUIRED``) refuses unkeyed sessions.
    """
    url = store_url()
    if url is not None:
        log = Storage.from_url(url).log
        if require_key is not None:
            log.require_key = require_key
    else:  # a bad key setting fails before any work
        log = open_log(state, require_key=require_key)

    async def main() -> T:
        try:
            return await work(log)
        finally:
            await log.close()

    return asyncio.run(main())


def log_exists(log: EventLog) -> bool:
    """Whether the log's storage exists, checked without creating it.

    Opening a SQLite store creates the file; read-only commands must not leave a fresh
    ``.lodger/`` behind when pointed at the wrong directory.
    """
    return log.store.present()


def require_log(log: EventLog, state: str, session_id: str) -> None:
    """Fail like an unknown session when ``state`` holds no log at all."""
    check_session_id(session_id)
    if not log_exists(log):
        raise SessionNotFoundError(
            f"no log for session {session_id!r}: {state!r} holds no event log",
            hint=f"check --state (or ${STATE_ENVVAR}); run `lodger sessions --state DIR` "
            "to list the sessions of a state directory",
            session_id=session_id,
        )


#: the version of every ``--json`` shape (documents, ``run --json`` lines, errors)
JSON_VERSION = 1


def document(fields: dict[str, Any]) -> dict[str, Any]:
    """A ``--json`` document: the version first, then the command's named fields."""
    return {"v": JSON_VERSION, **fields}


def echo_json(fields: dict[str, Any]) -> None:
    """Print a ``--json`` document: one object, ``{"v": 1, ...fields}`` (never a bare
    list, so fields can be added without breaking readers)."""
    click.echo(json.dumps(document(fields), indent=2, ensure_ascii=False))


def make_console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr) that honors ``NO_COLOR`` and never guesses markup.

    Highlighting is off: event text is data, and numbers in it must not change color.
    Piped into a file or another program, lines are not cut at 80 columns: session ids
    and paths in tables must stay whole to be copied.
    """
    console = Console(
        stderr=stderr,
        no_color=os.environ.get("NO_COLOR", "") != "",
        highlight=False,
        emoji=False,
    )
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 200
    return console


def _local(us: int) -> datetime:
    return datetime.fromtimestamp(us // 1_000_000, tz=UTC).replace(microsecond=us % 1_000_000)


def format_ts(us: int, *, date: bool = True) -> str:
    """A log ``ts`` (microseconds since the epoch) as local ISO time.

    ``date=False`` gives ``HH:MM:SS.mmm`` for timelines, where the day is in the header.
    """
    moment = _local(us).astimezone()
    if date:
        return moment.isoformat(timespec="seconds")
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def refuse_empty(
    value: str | None, what: str, *, hint: str, code: str = "invalid_session_id"
) -> None:
    """An id given as ``""`` (or blanks) is a usage error naming ``what``. Read as "not
    given" it silently became a new id (``fork --as ""``) or, beside ``--last``, the
    latest session."""
    if value is not None and not value.strip():
        raise UsageError(f"empty {what} {value!r}", hint=hint, code=code)


def session_argument(fn: F) -> F:
    """``SESSION`` (an id, or a prefix only one session's id starts with) or ``--last``
    (the session with the latest event). The command receives the full id."""

    @functools.wraps(fn)
    def wrapper(*args: Any, session_id: str | None, last: bool, **kwargs: Any) -> Any:
        if last and session_id is not None and kwargs.get("call_id", "") is None:
            # `decide --last CALL_ID`: the one positional given is the call, not the session
            session_id, kwargs["call_id"] = None, session_id
        refuse_empty(session_id, "SESSION", hint=_SESSION_HINT)
        kwargs["session_id"] = resolve_session(kwargs["state"], session_id, last=last)
        return fn(*args, **kwargs)

    with_last = click.option(
        "--last", is_flag=True, default=False, help="Use the session with the latest event."
    )(wrapper)
    return click.argument("session_id", metavar="SESSION", required=False)(with_last)  # type: ignore[return-value]


async def _names_a_session(log: EventLog, value: str) -> bool:
    """Whether ``value`` is the id of a session with a stored event (one indexed lookup)."""
    if not log_exists(log):
        return False
    try:
        return await log.exists(value)
    except UsageError:  # not a valid id: the listing decides, as for any other value
        return False


def resolve_session(state: str, value: str | None, *, last: bool = False) -> str:
    """The full session id ``value`` names (itself, or the one id it is a prefix of), or
    the latest session with ``last``. An id no session has is returned as it is: the
    command then reports it as not found, naming where to look."""
    if last and value:
        raise UsageError("give SESSION or --last, not both")
    if not last and not value:
        raise UsageError(
            "missing SESSION", hint="pass a session id, a unique prefix of one, or --last"
        )

    async def work(log: EventLog) -> str:
        if value is not None and names_a_branch(value):
            return await current_branch(log, value)  # that branch exactly (S..r0: S)
        found = await _find(log)
        if not log_exists(log) or not await _names_a_session(log, found):
            return found  # the command reports it as not found
        # a rewound session goes on in its current branch (lodger.storage.branches)
        return await current_branch(log, found)

    async def _find(log: EventLog) -> str:
        if not last and value is not None and await _names_a_session(log, value):
            return value  # the full id: listing every session (a scan) would say the same
        sessions = await log.list_sessions() if log_exists(log) else []
        if last:
            if not sessions:
                raise SessionNotFoundError(
                    f"{state!r} holds no sessions", hint="run a turn first (or check --state)"
                )
            latest: list[tuple[int, str]] = []
            for sid in sessions:
                try:
                    check_session_id(sid)
                except UsageError:  # written outside lodger: no command can name it
                    continue
                head = await log.head(sid)
                tail = await log.read(sid, start=max(head.high_water - 1, 0))
                latest.append((tail[-1].ts if tail else 0, sid))
            return max(latest)[1]
        assert value is not None
        if value in sessions:
            return value
        matches = [sid for sid in sessions if sid.startswith(value)]
        if len({root_of(sid) for sid in matches}) == 1 and len(matches) > 1:
            matches = [root_of(matches[0])]  # one session and its branches
        if len(matches) > 1:
            shown = ", ".join(matches[:5]) + (" ..." if len(matches) > 5 else "")
            raise UsageError(
                f"session prefix {value!r} matches {len(matches)} sessions: {shown}",
                hint="type more of the id",
                code="ambiguous_session",
            )
        return matches[0] if matches else value

    return run_with_log(state, work)

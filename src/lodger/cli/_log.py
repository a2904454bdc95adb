"""Commands that read the event log: ``lodger sessions``, ``lodger log show|verify``.

They only read. Every command verifies the whole log first: order, the digest chain over
every stored byte from offset 0 and the stored head (DESIGN L3, L8), so a timeline is never
printed from a log whose bytes fail to verify: a corrupt log ends the command with one
error line naming the session and the offset.

Decoding is what costs on a long log (about 10 us an event against 1 us for its digest),
so each command decodes what it uses: ``log show`` the page of turns it prints,
``sessions`` the last turn, and ``log verify`` every event, keeping none. An event that
the chain covers but this version cannot decode (an unknown kind or field: written by a
newer lodger, or rewritten under a plain chain) fails ``log verify`` and any page that
shows it; a page of other turns still prints, since nothing it prints depends on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import traceback
from collections.abc import Sequence

import click
from rich.console import Console
from rich.text import Text

from lodger._core.bulk import cycle_collector_paused
from lodger.cli._common import (
    DEFAULT_STATE,
    echo_json,
    format_ts,
    json_option,
    log_exists,
    make_console,
    require_log,
    run_with_log,
    session_argument,
    state_option,
    store_url,
)
from lodger.cli._render import (
    hidden_note,
    render_sessions,
    render_timeline,
    usage_of,
    visible_line,
)
from lodger.cli._subagents import ChildView, children_extra, load_children, render_family
from lodger.cli._timeline import (
    Page,
    SessionSummary,
    build_timeline,
    index_turns,
    page_events,
    select_page,
    summarize,
    summarize_verified,
)
from lodger.cli._timing import render_timings, step_timings
from lodger.errors import CorruptLogError, LogKeyError, UsageError
from lodger.events import Event, Prefix
from lodger.runtime.subagents.family import FamilyNode, family_tree
from lodger.storage import EventLog, SessionChain, check_session_id
from lodger.storage.eventlog import VerifiedRecords
from lodger.storage.logkey import KEY_REQUIRED_ENVVAR

__all__ = ["COMMANDS", "log_group", "sessions"]


# ---------------------------------------------------------------- lodger sessions


@dataclasses.dataclass(frozen=True, slots=True)
class _Row:
    summary: SessionSummary
    error: CorruptLogError | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = dataclasses.asdict(self.summary)
        out["last_activity"] = (
            None if self.summary.last_ts is None else format_ts(self.summary.last_ts)
        )
        if self.error is not None:
            out["error"] = self.error.to_dict()
        return out


def _summary(verified: VerifiedRecords) -> SessionSummary:
    return summarize_verified(verified, index_turns(verified))


async def _summarize_session(log: EventLog, session_id: str) -> _Row:
    try:
        check_session_id(session_id)
    except UsageError:
        # only written outside lodger (no command accepts the id): list it as damage
        # instead of failing the whole listing on it
        error = CorruptLogError(
            f"the log holds events under {session_id!r}, which is not a valid session id",
            hint="they were written outside lodger; no command reads them, and the other "
            "sessions are not affected",
            code="corrupt",
        )
        return _Row(dataclasses.replace(summarize(session_id, []), last_status="corrupt"), error)
    try:
        verified = await log.read_verified(session_id)
        return _Row(await asyncio.to_thread(_summary, verified))
    except CorruptLogError as exc:
        # Summarize the prefix that still verifies; the head comes from storage unverified.
        # Either may fail again (a duplicated offset inside the prefix, a row that does not
        # read): the row then shows what could be read, never stopping the whole listing.
        valid: list[Event] = []
        with contextlib.suppress(CorruptLogError):
            valid = await log.read(session_id, end=exc.offset) if exc.offset else []
        events = len(valid)
        with contextlib.suppress(CorruptLogError):
            events = (await log.head(session_id)).high_water
        # a key problem is not damage: the log may be fine, it just cannot be checked here
        status = "unverified" if isinstance(exc, LogKeyError) else "corrupt"
        summary = dataclasses.replace(
            summarize(session_id, valid), events=events, last_status=status
        )
        return _Row(summary, exc)


@click.command()
@state_option
@json_option
@click.option(
    "--tree",
    is_flag=True,
    default=False,
    help="Show families: subagents and forks under the session they came from.",
)
@click.option(
    "--control",
    default=None,
    metavar="DSN",
    help="List from the control plane's session index (postgresql://... or a SQLite "
    "file) without opening any log.",
)
def sessions(state: str, as_json: bool, tree: bool, control: str | None) -> None:
    """List the sessions in a state directory.

    One row per session: events in its log, turns, how the last turn ended (completed,
    failed, parked, interrupted: started but never ended, or corrupt), last activity
    and workspace. With --control, the rows come from the control plane's index instead.

    \b
    Example:
      lodger sessions --state .lodger
      lodger sessions --json | jq '.sessions[] | select(.last_status == "interrupted")'
      lodger sessions --tree
      lodger sessions --control postgresql://lodger@db/lodger
    """
    if control is not None:
        from lodger.cli._control import list_indexed_sessions, render_indexed

        render_indexed(list_indexed_sessions(control), as_json=as_json)
        return

    async def work(log: EventLog) -> tuple[list[_Row], list[FamilyNode]]:
        if not log_exists(log):
            return [], []
        ids = await log.list_sessions()
        rows = [await _summarize_session(log, sid) for sid in ids]
        return rows, (await _families(log, ids) if tree else [])

    rows, families = run_with_log(state, work)
    if as_json:
        out = [row.to_json() for row in rows]
        if tree:
            _add_family(out, families)
        echo_json({"state": state, "sessions": out})
        return
    if not rows:
        click.echo(f"no sessions in {state}")
        from lodger.cli._run import latest_demo_state  # the agent's imports, only here

        demo_state = latest_demo_state() if store_url() is None else None
        if demo_state is not None:
            click.echo(
                f"hint: the latest `lodger demo` kept its session in {demo_state}: "
                f"lodger sessions --state {demo_state}",
                err=True,
            )
        return
    if tree:
        summaries = {row.summary.session_id: row.summary for row in rows}
        print_lines(make_console(), render_family(families, summaries))
    else:
        make_console().print(render_sessions([row.summary for row in rows]))
    for row in rows:
        if row.error is not None:
            sid = row.summary.session_id
            verify = "" if row.error.session_id is None else f"; run `lodger log verify {sid}`"
            click.echo(f"warning: {row.error.message}{verify}", err=True)


async def _families(log: EventLog, ids: Sequence[str]) -> list[FamilyNode]:
    firsts: dict[str, Event | None] = {}
    for sid in ids:
        try:
            first = await log.read(sid, end=1)
        except (CorruptLogError, UsageError):  # damaged, or not a valid id: no family
            first = []
        firsts[sid] = first[0] if first else None
    return family_tree(firsts)


def _add_family(rows: list[dict[str, object]], roots: Sequence[FamilyNode]) -> None:
    """``parent`` and ``relation`` (root, subagent, fork) on each JSON row."""
    nodes = {node.session_id: node for root in roots for _, node in root.walk()}
    for row in rows:
        node = nodes.get(str(row["session_id"]))
        row["parent"] = node.parent if node is not None else None
        row["relation"] = node.relation if node is not None else "root"


# ---------------------------------------------------------------- lodger log ...


@click.group("log")
def log_group() -> None:
    """Inspect and verify session logs.

    \b
    Example:
      lodger log show SESSION
      lodger log verify SESSION --json
    """


# No generated repr: on Python 3.11, asyncio.run's exit formats its main task's result
# (restoring the SIGINT handler builds a message with the task's repr), which for a whole
# log's events took seconds.
@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class _Shown:
    """A page of a verified log: its events and the log's first and last events."""

    page: Page
    events: list[Event]
    first: Event
    last: Event
    children: dict[str, ChildView] = dataclasses.field(default_factory=dict)


def _read_page(
    verified: VerifiedRecords, turns: tuple[int, ...], last: int | None, every: bool
) -> _Shown:
    page = select_page(index_turns(verified), turns=turns, last=last, every=every)
    with cycle_collector_paused(len(verified)):
        events = page_events(verified, page)
    first = events[0] if events and events[0].offset == 0 else verified.decode(0, 1)[0]
    end = len(verified)
    final = events[-1] if events and events[-1].offset == end - 1 else verified.decode(end - 1)[0]
    return _Shown(page, events, first, final)


def _show_command(session_id: str, state: str) -> str:
    flag = "" if state == DEFAULT_STATE else f" --state {state}"
    return f"lodger log show {session_id}{flag}"


@log_group.command("show")
@session_argument
@state_option
@json_option
@click.option(
    "--turn",
    "turns",
    type=int,
    multiple=True,
    metavar="N",
    help="Show turn N (numbered from 1, as printed); repeat for more turns.",
)
@click.option(
    "--last-turns",
    "last_turns",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Show the last N turns.",
)
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    default=False,
    help="Show every turn, with text, reasoning, arguments and results in full.",
)
@click.option(
    "--full",
    is_flag=True,
    default=False,
    help="Show text, reasoning, arguments and results in full instead of clipped.",
)
@click.option(
    "--timing",
    is_flag=True,
    default=False,
    help="Show each batch's calls with their wait and run times and a time bar instead.",
)
@click.option(
    "--children",
    "unfold",
    is_flag=True,
    default=False,
    help="Unfold each delegation's subagent session under its call (one line by default).",
)
def show(
    session_id: str,
    state: str,
    as_json: bool,
    turns: tuple[int, ...],
    last_turns: int | None,
    show_all: bool,
    full: bool,
    timing: bool,
    unfold: bool,
) -> None:
    """Show a session's timeline of turns, runs, steps and calls, a page of turns at a time.

    By default the last turn is shown; --turn N, --last-turns N and --all pick others, and a
    line under the header names the turns left out. Each line starts with the event's
    offset and local time. Every call is followed by its facts (rejection, permission, T1
    dispatch, T2 response, recovery) and by the code-mode calls it made, indented; the
    call line shows T1 -> T2 times so overlapping calls stand out. Each turn ends with its
    token usage (with the prompt cache's reads, writes and hit rate when the provider
    reported them), and the page with the total of its turns (the session's with --all).

    The digest chain of the whole log (every stored byte, up to the stored head) is
    verified before anything is printed, whatever the page; the events shown are decoded
    in full. `lodger log verify` also decodes every event of the log.

    \b
    Example:
      lodger log show 0193a6c2-7f1e-7c3a-9d2b-5e8f1a2b3c4d
      lodger log show SESSION --last-turns 3
      lodger log show SESSION --turn 1 --turn 2 --full
      lodger log show SESSION --all | less -R
      lodger log show SESSION --json | jq '.events[] | select(.body.kind == "tool_responded")'
      lodger log show SESSION --timing
      lodger log show SESSION --children
    """
    if show_all and (turns or last_turns is not None):
        raise UsageError(
            "--all shows every turn; it does not combine with --turn or --last-turns",
            hint="pick turns with --turn N or --last-turns N, or drop them to see every turn",
            code="usage",
        )
    if turns and last_turns is not None:
        raise UsageError(
            "--turn and --last-turns both pick turns; use one of them",
            hint="--turn N shows turn N (repeat it for more), --last-turns N the last N turns",
            code="usage",
        )

    async def work(log: EventLog) -> _Shown:
        require_log(log, state, session_id)
        verified = await log.read_verified(session_id)
        shown = await asyncio.to_thread(_read_page, verified, turns, last_turns, show_all)
        if not (as_json or timing):
            shown.children.update(await load_children(log, shown.events, unfold=unfold))
        return shown

    shown = run_with_log(state, work)
    command = _show_command(session_id, state)
    note = hidden_note(shown.page, command)
    if (as_json or timing) and note is not None:  # stdout stays as it was: JSON or timings
        click.echo(f"note: {note}", err=True)
    # a tree, lines and JSON of a whole long log: hundreds of thousands of acyclic objects
    with cycle_collector_paused(len(shown.events)):
        _print_page(
            shown,
            session_id=session_id,
            as_json=as_json,
            timing=timing,
            full=full or show_all,
            command=command,
            unfold=unfold,
        )


def _page_fields(shown: _Shown, session_id: str) -> dict[str, object]:
    """What a ``--json`` page says about itself: which turns it shows out of how many."""
    used = usage_of(shown.events)
    return {
        "session_id": session_id,
        "turns": {"count": shown.page.index.count, "shown": list(shown.page.shown)},
        "high_water": shown.last.offset + 1,
        "usage": {
            "requests": len(used.requests),
            "input_tokens": used.input_tokens,
            "output_tokens": used.output_tokens,
            "cache_read_tokens": used.cache_read_tokens,
            "cache_write_tokens": used.cache_write_tokens,
            "cache_hit_rate": used.cache_hit_rate,
        },
    }


def _print_page(
    shown: _Shown,
    *,
    session_id: str,
    as_json: bool,
    timing: bool,
    full: bool,
    command: str,
    unfold: bool = False,
) -> None:
    if timing:
        steps = step_timings(shown.events)
        if as_json:
            echo_json({**_page_fields(shown, session_id), "steps": [s.to_json() for s in steps]})
            return
        timing_console = make_console()
        for line in render_timings(steps):
            timing_console.print(visible_line(line), soft_wrap=True)
        return
    if as_json:
        echo_json(
            {
                **_page_fields(shown, session_id),
                "events": [event.model_dump(mode="json") for event in shown.events],
            }
        )
        return
    lines = render_timeline(
        build_timeline(shown.events),
        full=full,
        page=shown.page,
        first=shown.first,
        last=shown.last,
        command=command,
        call_extra=children_extra(shown.children, full=full, unfold=unfold)
        if shown.children
        else None,
    )
    print_lines(make_console(), lines)


def _expanded(line: Text, tab_size: int = 8) -> str:
    plain = line.plain
    if "\t" not in plain:
        return plain
    copy = line.copy()
    copy.expand_tabs(tab_size)  # as rich prints it
    return copy.plain


def print_lines(console: Console, lines: Sequence[Text]) -> None:
    """Print whole lines, never wrapped. Without colors (piped, or a dumb terminal) rich
    would only strip the styles again, at about 40 us a line: write the plain text.
    Control characters from the log are shown as escapes, never sent (``visible_line``)."""
    lines = [visible_line(line) for line in lines]
    if console.color_system is None:
        console.file.write("".join(f"{_expanded(line, console.tab_size)}\n" for line in lines))
        console.file.flush()
        return
    for line in lines:
        console.print(line, soft_wrap=True)


def _chain_line(chain: SessionChain, configured_key_id: str | None) -> str:
    if chain.keyed:
        return f"chain: hmac-sha256 key {chain.key_id} (verified with the configured key)"
    if configured_key_id is None:
        return (
            "chain: sha256 (unkeyed): detects accidental damage, not a rewrite by someone "
            "who can write the state directory"
        )
    return (
        f"chain: sha256 (unkeyed): a log key ({configured_key_id}) is configured, but this "
        "session was not written with it"
    )


@log_group.command("verify")
@session_argument
@state_option
@json_option
@click.option(
    "--require-key",
    is_flag=True,
    default=False,
    envvar=KEY_REQUIRED_ENVVAR,
    show_envvar=True,
    help="Fail unless the session's chain is keyed with the configured log key.",
)
def verify(session_id: str, state: str, as_json: bool, require_key: bool) -> None:
    """Verify every event of a session against the digest chain.

    Exits 0 and prints the head (high-water mark and digest) and the chain when the log
    is intact; exits 1 with one line naming the first bad offset and what is wrong
    otherwise.

    A plain chain (sha256) detects accidental damage. With a log key ($LODGER_LOG_KEY,
    hex or base64, or $LODGER_LOG_KEY_FILE, a file outside the state directory) new
    sessions are keyed (hmac-sha256) and an edit made without the key is reported as
    forged. A session whose chain is plain is still read with a key configured, and
    reported as unkeyed; --require-key fails on it, since a log rewritten by someone
    without the key can only be plain.

    \b
    Example:
      lodger log verify SESSION
      lodger log verify SESSION --json
      LODGER_LOG_KEY_FILE=~/.config/lodger/log.key lodger log verify SESSION --require-key
    """

    async def work(log: EventLog) -> tuple[Prefix, SessionChain, str | None] | CorruptLogError:
        require_log(log, state, session_id)
        try:
            verified = await log.read_verified(session_id, decode_all=True)
        except CorruptLogError as exc:
            return exc
        last = verified.records[-1]
        prefix = Prefix(high_water=last.offset + 1, digest=last.digest)
        return prefix, verified.chain, log.key.key_id if log.key else None

    outcome = run_with_log(state, work, require_key=require_key)
    if isinstance(outcome, CorruptLogError):
        if click.get_current_context().meta.get("lodger.debug"):
            click.echo("".join(traceback.format_exception(outcome)).rstrip(), err=True)
        if as_json:
            echo_json({"ok": False, "error": outcome.to_dict()})
        else:
            click.echo(f"error: {outcome.message}", err=True)
        if outcome.hint and not as_json:
            click.echo(f"hint: {outcome.hint}", err=True)
        raise click.exceptions.Exit(1)
    prefix, chain, configured_key_id = outcome
    if as_json:
        echo_json(
            {
                "ok": True,
                "session_id": session_id,
                "high_water": prefix.high_water,
                "digest": prefix.digest,
                "chain": chain.kind,
                "key_id": chain.key_id,
                "configured_key_id": configured_key_id,
            }
        )
        return
    console = make_console()
    console.print(
        Text.assemble(
            ("ok", "bold green"),
            f": session {session_id} verified, {prefix.high_water} events, "
            f"head digest {prefix.digest}",
        ),
        soft_wrap=True,
    )
    console.print(_chain_line(chain, configured_key_id), soft_wrap=True)
    if not chain.keyed and configured_key_id is not None:
        click.echo(
            "warning: this session's chain is unkeyed, so anyone who can write the state "
            "directory could have rewritten it; --require-key refuses such sessions",
            err=True,
        )


COMMANDS: tuple[click.Command, ...] = (sessions, log_group)

"""``lodger recover``, ``decide``, ``resume`` and ``abandon``: after a crash."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click
from rich.text import Text

from lodger.cli._common import (
    echo_json,
    json_option,
    location,
    make_console,
    refuse_empty,
    remember_control,
    require_log,
    retain_until_exit,
    run_with_log,
    session_argument,
    state_option,
    storage_flags,
)
from lodger.cli._identity import cli_user
from lodger.cli._next import command_for
from lodger.cli._render import visible
from lodger.cli._run import (
    LiveView,
    budget_options,
    code_mode_option,
    exit_code_for,
    finish_turn,
    live_console,
    load_project,
    project_overrides,
    run_turn,
    subagents_option,
    trust_option,
)
from lodger.cli._settings import model_options
from lodger.cli._tools import mcp_option
from lodger.engine.budgets import describe
from lodger.engine.resume import Decision
from lodger.errors import (
    ConfigError,
    LodgerError,
    ResumeBlockedError,
    SessionLockedError,
    UsageError,
)
from lodger.events import BudgetReached, Event, RunEnded
from lodger.recovery import RecoveryPlan
from lodger.runtime.agent import TurnResult
from lodger.runtime.composition import compose, model_spec_for
from lodger.runtime.location import CONTROL_FILE
from lodger.runtime.sessions import Sessions, SessionWorkspace
from lodger.storage import EventLog, MemoryArtifactStore, Storage
from lodger.substrates.codemode import Language

if TYPE_CHECKING:
    from lodger.storage.control import ControlPlane

__all__ = ["COMMANDS", "abandon", "decide", "recover", "resume"]


def _control_option(fn: click.decorators.FC) -> click.decorators.FC:
    return click.option(
        "--control",
        metavar="DSN",
        default=None,
        envvar="LODGER_CONTROL",
        show_envvar=True,
        help="The control plane of the workers that run this session (default: "
        f"{CONTROL_FILE} in the state directory, when a worker made one): the fact is "
        "written under the session's lease (refused while a worker runs it), and wakes "
        "a worker held back for the turn are due at once.",
        callback=remember_control,
    )(fn)


@contextlib.asynccontextmanager
async def _outside_turns(dsn: str | None, session_id: str) -> AsyncIterator[ControlPlane | None]:
    """Hold the session's lease in the control plane ``dsn`` (if any) while a fact is
    appended outside a turn, as the host does: no worker runs the session meanwhile."""
    if dsn is None:
        yield None
        return
    from lodger.storage.control import open_control

    plane = open_control(dsn)
    try:
        await plane.start()
        lease = await plane.acquire_session(
            session_id=session_id,
            holder=f"lodger-cli:{socket.gethostname()}:{os.getpid()}",
            ttl_s=60.0,
        )
        if lease is None:
            raise SessionLockedError(
                f"session {session_id!r} is running in a worker of the control plane; "
                "nothing was written",
                hint="wait until its turn settles (`lodger sessions`), then try again",
                session_id=session_id,
            )
        try:
            yield plane
        finally:
            await plane.release_session(lease=lease)
    finally:
        await plane.close()


async def _tell_control(plane: ControlPlane, session_id: str, *, turn_over: bool) -> None:
    """After a fact outside a turn: withdraw the questions of a turn that is over (nobody
    will ask for their answers) and make the wakes held for the session due. The fact is
    committed already, so a failure here is a warning: the wakes are looked at later."""
    try:
        if turn_over:
            await plane.withdraw_approvals(session_id=session_id)
        await plane.release_held_wakes(session_id=session_id)
    except LodgerError as exc:
        click.echo(
            f"warning: the fact is recorded, but the control plane was not told: {exc.message}"
            " (its workers look at the session again within a minute)",
            err=True,
        )


_ACTIONS = {
    "none": "nothing to do",
    "tell_model": "tell the model it never ran",
    "ask_permission": "ask for its approval again (its answer may be waiting)",
    "redispatch": "run again under a linked T1 (idempotent)",
    "probe": "probe the world (queryable)",
    "poll": "poll its handle: the remote side runs it (long-running call)",
    "park": "park for an operator decision",
    "wait_operator": "waits for: lodger decide",
    "report": "never re-run: settle as interrupted, tell the model what its nested calls did",
}


def _parked_on(events: Sequence[Event]) -> BudgetReached | None:
    """The budget the open turn's last run parked on, if that is how it ended."""
    if len(events) < 2 or not isinstance(events[-2].body, BudgetReached):
        return None
    ended = events[-1].body
    return events[-2].body if isinstance(ended, RunEnded) and ended.status == "parked" else None


def _render_plan(
    plan: RecoveryPlan, workspace: SessionWorkspace, budget: BudgetReached | None = None
) -> None:
    console = make_console()
    console.soft_wrap = True
    if plan.turn_id is None:
        console.print(
            f"session {plan.session_id}: no interrupted turn "
            f"({plan.prefix.high_water} events, head {plan.prefix.digest[:16]})"
        )
        return
    console.print(
        Text(f"session {plan.session_id}: turn {plan.turn_id} is interrupted", style="bold")
    )
    console.print(
        f"prefix: {plan.prefix.high_water} events, digest {plan.prefix.digest[:16]}; "
        f"last run {plan.last_run_id} ({'still open' if plan.run_open else 'ended'})"
    )
    for c in plan.calls:
        indent = "  " if c.parent_call_id else ""
        console.print(
            Text(f"  {indent}{visible(c.call_id)}  {visible(c.tool)}  ")
            + Text(c.status, style="bold" if c.action != "none" else "")
            + Text(
                f"  ({visible(c.reason)})  -> {_ACTIONS[c.action]}",
                style="dim" if c.action == "none" else "",
            )
        )
    parks = [c for c in plan.calls if c.action == "park"]
    decide = f"`lodger decide {plan.session_id} CALL_ID --completed | --not-applied | --abandon`"
    if workspace.state in ("missing", "replaced"):
        why = "does not exist" if workspace.state == "missing" else "is another directory now"
        console.print(
            Text(f"blocked: the session's workspace {workspace.path} {why}; ", style="red")
            + Text(
                f"`lodger resume {plan.session_id} --workspace DIR --relocate` checks a new "
                f"directory against the log's hashes, or `lodger abandon {plan.session_id}` "
                "ends the turn"
            )
        )
    if plan.blocked:
        console.print(Text(f"blocked: {len(plan.blocked)} call(s) wait for {decide}", style="red"))
        abandon = f"`lodger abandon {plan.session_id} [--reason TEXT]`"
        console.print(Text(f"or end the turn: {abandon}", style="dim"))
    elif parks:
        console.print(
            Text(
                f"resume will park {len(parks)} call(s) it cannot prove; decide them with {decide}",
                style="yellow",
            )
        )
    elif budget is not None:
        console.print(Text(f"parked: {describe(budget)}", style="yellow"))
    elif workspace.state not in ("missing", "replaced"):
        console.print(
            Text(f"ready: `lodger resume {plan.session_id}` continues the turn", style="green")
        )


@click.command()
@session_argument
@state_option
@json_option
def recover(session_id: str, state: str, as_json: bool) -> None:
    """Show the recovery plan of a session: every call of its interrupted turn, its status
    (completed, not_dispatched, indeterminate, parked ...), a stable reason code, and what
    `lodger resume` will do with it, and whether its workspace is still there. Read-only;
    needs neither the workspace nor a model.

    \b
    Example:
      lodger recover SESSION
      lodger recover SESSION --json | jq '.calls[] | select(.action != "none")'
    """

    async def work(
        log: EventLog,
    ) -> tuple[RecoveryPlan, SessionWorkspace, BudgetReached | None]:
        require_log(log, state, session_id)
        sessions = Sessions(Storage(log=log, artifacts=MemoryArtifactStore()))
        folded = await sessions.state(session_id)
        retain_until_exit(sessions)
        budget = _parked_on(folded.events) if folded.open_turn else None
        return folded.plan(), await sessions.workspace(folded), budget

    plan, workspace, budget = run_with_log(state, work)
    if as_json:
        parked = budget.model_dump(mode="json") if budget else None
        echo_json({**plan.to_dict(), "workspace": workspace.to_dict(), "budget": parked})
    else:
        _render_plan(plan, workspace, budget)


@click.command()
@session_argument
@click.argument("call_id", metavar="CALL_ID", required=False)
@click.option("--completed", "decision", flag_value="completed", help="It happened.")
@click.option("--not-applied", "decision", flag_value="not_applied", help="It did not happen.")
@click.option("--abandon", "decision", flag_value="abandon", help="Abandon the whole turn.")
@click.option("--result", metavar="JSON", help="With --completed: the result the model sees.")
@state_option
@_control_option
def decide(
    session_id: str,
    call_id: str | None,
    decision: str | None,
    result: str | None,
    state: str,
    control: str | None,
) -> None:
    """Record an operator decision on a parked or indeterminate call, as a new fact.

    \b
    Example:
      lodger decide SESSION call-2-1 --completed --result '"charged 5 EUR"'
      lodger decide SESSION call-2-1 --not-applied
      lodger decide SESSION call-2-1 --abandon
      lodger decide --last call-2-1 --not-applied
    """
    if call_id is None:
        raise UsageError("missing CALL_ID", hint="`lodger recover SESSION` lists the calls")
    refuse_empty(call_id, "CALL_ID", hint="`lodger recover SESSION` lists the calls", code="usage")
    if decision is None:
        raise ConfigError(
            "say what happened", hint="pass one of --completed, --not-applied, --abandon"
        )
    if result is not None:
        if decision != "completed":
            raise ConfigError("--result goes with --completed only")
        try:
            parsed = json.loads(result)
        except RecursionError:  # nested past the parser's depth: not a result to record
            raise ConfigError(
                "--result is nested too deeply to be recorded",
                hint="pass a flatter JSON value, or a string",
            ) from None
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"--result is not JSON: {exc.msg}", hint="quote a string: --result '\"done\"'"
            ) from None
        result = parsed if isinstance(parsed, str) else json.dumps(parsed, ensure_ascii=False)

    dsn = location().control_dsn(create=False)

    async def work(log: EventLog) -> list[Event]:
        require_log(log, state, session_id)
        sessions = Sessions(Storage(log=log, artifacts=MemoryArtifactStore()))
        async with _outside_turns(dsn, session_id) as plane:
            made = await sessions.decide(
                session_id, call_id, cast(Decision, decision), result=result, who=cli_user()
            )
            if plane is not None:
                await _tell_control(plane, session_id, turn_over=decision == "abandon")
        return made

    events = run_with_log(state, work)
    click.echo(
        f"recorded: {call_id} {decision} at offset {events[0].offset}"
        + ("; the turn is abandoned" if decision == "abandon" else "")
    )


@click.command()
@model_options
@session_argument
@click.option("--model", "model_spec", metavar="SPEC", help="Default: the last run's model.")
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Default: the session's workspace.",
)
@click.option(
    "--relocate",
    is_flag=True,
    help="Move the session to --workspace (its workspace was moved or recreated) once "
    "every file the log's hashes cover matches there.",
)
@click.option("--tools", "tools_files", multiple=True, metavar="FILE.py")
@mcp_option
@click.option("--yes", is_flag=True, help="Approve every call that asks for approval.")
@trust_option
@click.option("--max-steps", type=click.IntRange(min=1), default=None)
@budget_options
@code_mode_option
@subagents_option
@state_option
def resume(
    session_id: str,
    model_spec: str | None,
    workspace: Path | None,
    relocate: bool,
    tools_files: tuple[str, ...],
    mcp_specs: tuple[str, ...],
    yes: bool,
    trust: bool,
    max_steps: int | None,
    code_mode: Language | None,
    subagent_depth: int | None,
    state: str,
    **budget_flags: Any,
) -> None:
    """Resume an interrupted turn as a new run from its verified prefix.

    The run asks the model with the settings the turn was asked with (recorded with each
    step), with the project's [model_settings] and the model flags over them.

    Completed calls are replayed from the log, never re-run; indeterminate ones follow
    their tool's recovery policy. If anything is parked, resume stops and names it.
    A session whose workspace was moved or recreated resumes only with --relocate, which
    first checks every file the session wrote against the hashes in its log.

    \b
    Example:
      lodger recover SESSION && lodger resume SESSION
      lodger resume SESSION --model openai:gpt-4.1 --tools mytools.py
      lodger resume SESSION --workspace ../moved-project --relocate
    """
    if relocate and workspace is None:
        raise ConfigError(
            "--relocate needs the directory to move to",
            hint="pass --workspace DIR: the directory that now holds the session's files",
        )
    console = live_console()
    view = LiveView(console)

    async def work() -> TurnResult:
        async with Sessions(location().open()) as sessions:
            retain_until_exit(sessions)
            # The log is read and verified once: the defaults' fold is what resume uses.
            recorded = None if model_spec and workspace else await sessions.defaults(session_id)
            known = recorded.workspace if recorded else None
            root = workspace or (Path(known) if known else None)
            # the same project the session ran with: lodger.toml in its workspace
            project = load_project(root, trust=trust)
            overrides = project_overrides(
                view,
                workspace=root,
                model=model_spec,
                recorded_model=recorded.model if recorded else None,
                tools_files=tools_files,
                mcp_specs=mcp_specs,
                approve_all=yes,
                interactive=sys.stdin.isatty(),
                max_steps=max_steps,
                code_mode=code_mode,
                subagent_depth=subagent_depth,
                budget_flags=budget_flags,
            )
            if model_spec_for(project, overrides) is None:
                raise ConfigError("no model to resume with", hint="pass --model SPEC")
            binding = compose(project, overrides)
            try:
                return await sessions.resume(session_id, binding=binding, relocate=relocate)
            finally:
                if not isinstance(binding.model, str):  # compose made a Model
                    await binding.model.aclose()

    try:
        result = run_turn(work(), view)
    except ResumeBlockedError as exc:
        _report_blocked(exc)
        sys.exit(3)
    finish_turn(console, result)
    sys.exit(exit_code_for(result))


def _report_blocked(exc: ResumeBlockedError) -> None:
    """What blocks a resume, each blocker on its line, and the commands to take next."""
    click.echo(f"blocked: {exc.message}", err=True)
    for line in exc.blockers:
        click.echo(f"  - {line}", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)
    for step in exc.next_steps:
        click.echo(f"next: {command_for(step)}", err=True)


@click.command()
@session_argument
@click.option("--reason", metavar="TEXT", help="Why, recorded with the fact.")
@state_option
@_control_option
@json_option
def abandon(
    session_id: str, reason: str | None, state: str, control: str | None, as_json: bool
) -> None:
    """End the session's open turn as abandoned, as facts in its log.

    For a turn no command can finish: its calls wait for decisions, its workspace is
    gone, or it cannot resume for another reason. Calls whose outcome is unknown are
    recorded as abandoned (nothing runs again), and the next `lodger run --session`
    starts a fresh turn. Needs neither the workspace nor a model.

    \b
    Example:
      lodger abandon SESSION --reason "workspace deleted"
    """

    dsn = location().control_dsn(create=False)

    async def work(log: EventLog) -> list[Event]:
        require_log(log, state, session_id)
        sessions = Sessions(Storage(log=log, artifacts=MemoryArtifactStore()))
        async with _outside_turns(dsn, session_id) as plane:
            made = await sessions.abandon(session_id, reason=reason, who=cli_user())
            if plane is not None:
                await _tell_control(plane, session_id, turn_over=True)
        return made

    events = run_with_log(state, work)
    if as_json:
        echo_json(
            {
                "session_id": session_id,
                "turn_id": events[-1].turn_id,
                "offsets": [e.offset for e in events],
                "reason": reason,
            }
        )
        return
    flag = storage_flags()
    click.echo(
        f"abandoned: turn {events[-1].turn_id} of {session_id} at offset {events[-1].offset}; "
        f'a new turn: lodger run "TASK" --session {session_id}{flag}'
    )


COMMANDS = (recover, decide, resume, abandon)

"""``lodger worker``, ``lodger send``, ``lodger schedule``: sessions run by workers.

The control plane is ``--control DSN`` (env ``LODGER_CONTROL``): ``postgresql://...`` for
workers on many machines, or a SQLite file; by default ``control.sqlite3`` in the state
directory, beside the embedded store.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.table import Table

from lodger.cli._common import (
    Seconds,
    echo_json,
    json_option,
    location,
    make_console,
    remember_control,
    state_option,
)
from lodger.cli._run import budget_options, budget_overrides, subagent_policy, subagents_option
from lodger.cli._toolsfile import load_tools_file
from lodger.errors import ConfigError, UsageError
from lodger.events import Event
from lodger.providers import make_model
from lodger.runtime.approvals import (
    DEFAULT_APPROVAL_EXPIRY_S,
    ControlApprovals,
    ParkingApprovals,
)
from lodger.runtime.composition import MODEL_ENVVAR, Overrides, compose, model_spec_for
from lodger.runtime.location import StorageLocation
from lodger.runtime.project import Project
from lodger.runtime.sessions import Binding
from lodger.runtime.subagents.policy import SubagentPolicy
from lodger.runtime.worker import Worker, WorkerConfig
from lodger.storage import check_session_id
from lodger.storage.control import CONTROL_ENVVAR, ControlPlane, SessionRow, open_control
from lodger.storage.control.schedule import check_cron, parse_at
from lodger.storage.snapshots import snapshot_workspace
from lodger.tools._mcp_credentials import CredentialStore, SealedCredentialStore
from lodger.tools.spec import Tool

if TYPE_CHECKING:
    from lodger.host.telemetry import SpanBuilder

__all__ = ["COMMANDS", "control_dsn", "list_indexed_sessions", "render_indexed"]

T = TypeVar("T")


def control_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--control",
        "control",
        default=None,
        envvar=CONTROL_ENVVAR,
        show_envvar=True,
        metavar="DSN",
        help="The control plane: postgresql://user@host:port/db, or a SQLite file "
        "(default: control.sqlite3 in the state directory).",
        callback=remember_control,
    )(fn)


def control_dsn(control: str | None, state: str) -> str:
    """The control plane named, else the state directory's own (made on first use)."""
    dsn = StorageLocation(state=state, control=control).control_dsn()
    assert dsn is not None  # create=True always names one
    return dsn


def _with_control(dsn: str, work: Callable[[ControlPlane], Awaitable[T]]) -> T:
    async def main() -> T:
        plane = open_control(dsn)
        try:
            await plane.start()
            return await work(plane)
        finally:
            await plane.close()

    return asyncio.run(main())


@click.command()
@click.argument("session")
@click.argument("message")
@click.option(
    "--idempotency-key",
    "key",
    default=None,
    metavar="K",
    help="Deliver at most once: a message with a key seen before wakes nothing.",
)
@click.option("--at", "at", default=None, metavar="TIME",
              help="Deliver later: +30s, +5m, +2h, +1d, an ISO time (UTC by default) "
                   "or epoch seconds.")  # fmt: skip
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="For a new session: the directory its workspace starts as (snapshotted into "
    "the store; a worker restores it, its lodger.toml included).",
)
@state_option
@control_option
@json_option
def send(
    session: str,
    message: str,
    key: str | None,
    at: str | None,
    workspace: Path | None,
    state: str,
    control: str | None,
    as_json: bool,
) -> None:
    """Send MESSAGE to SESSION: a worker wakes it and runs it as a new turn.

    SESSION may be new (the first worker to take it starts it; --workspace gives it a
    starting workspace). Nothing runs here: the message waits in the control plane's
    queue until it is due and a worker claims it.

    \b
    Example:
      lodger send s1 "summarize the new issues" --control postgresql://lodger@db/lodger
      lodger send s1 "nightly report" --at 2026-12-01T02:00:00Z --idempotency-key report-1201
      lodger send s2 "fix the tests" --workspace ./project --store s3://bucket/lodger
    """
    check_session_id(session)

    async def work(plane: ControlPlane) -> int | None:
        due = parse_at(at, now=await plane.now()) if at is not None else None
        if workspace is not None:
            await _start_workspace(plane, session, workspace)
        return await plane.send(
            session_id=session, message=message, due_at=due, idempotency_key=key
        )

    wake = _with_control(control_dsn(control, state), work)
    if as_json:
        echo_json({"session_id": session, "wake_id": wake, "duplicate": wake is None})
    elif wake is None:
        click.echo(f"already sent: idempotency key {key!r} was seen before; nothing enqueued")
    else:
        click.echo(f"queued wake {wake} for session {session}")


async def _start_workspace(plane: ControlPlane, session: str, workspace: Path) -> None:
    """Snapshot ``workspace`` as the new session's first workspace, in its index row."""
    storage = location().open()
    try:
        if await storage.log.exists(session) or await plane.get_session(session_id=session):
            raise UsageError(
                f"session {session!r} exists already: --workspace starts a new one",
                hint="send without --workspace (a worker restores the session's own "
                "workspace), or fork the session",
                code="usage",
                session_id=session,
            )
        taken = await snapshot_workspace(workspace, storage.artifacts)
        await plane.record_session(
            row=SessionRow(
                session_id=session,
                status="new",
                last_activity=await plane.now(),
                events=0,
                snapshot=taken.ref,
            )
        )
    finally:
        await storage.close()


@click.command()
@click.argument("session")
@click.argument("message")
@click.option("--cron", "cron", required=True, metavar="EXPR",
              help="Five fields, UTC: minute hour day-of-month month day-of-week.")  # fmt: skip
@state_option
@control_option
@json_option
def schedule(
    session: str, message: str, cron: str, state: str, control: str | None, as_json: bool
) -> None:
    """Send MESSAGE to SESSION on a cron schedule (UTC).

    Runs missed while no worker was up fire once when a worker is back, not once per miss.

    \b
    Example:
      lodger schedule s1 --cron "0 9 * * 1-5" "triage the inbox"
    """
    check_session_id(session)
    check_cron(cron)

    async def work(plane: ControlPlane) -> dict[str, Any]:
        made = await plane.add_schedule(session_id=session, cron=cron, message=message)
        return {"schedule_id": made.id, "session_id": session, "cron": cron,
                "next_at": made.next_at}  # fmt: skip

    out = _with_control(control_dsn(control, state), work)
    if as_json:
        echo_json(out)
    else:
        nxt = datetime.fromtimestamp(out["next_at"], tz=UTC).isoformat(timespec="seconds")
        click.echo(f"schedule {out['schedule_id']} for session {session}: next at {nxt}")


@click.command()
@state_option
@control_option
@click.option(
    "--concurrency",
    default=1,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Turns this worker runs at once.",
)
@click.option(
    "--model",
    "model_spec",
    default=None,
    envvar=MODEL_ENVVAR,
    metavar="SPEC",
    help="Model for sessions that recorded none (new sessions); see lodger run.",
)
@click.option(
    "--tools",
    "tools_files",
    multiple=True,
    metavar="FILE.py",
    help="Bind the @tool functions of a Python file (repeatable).",
)
@click.option(
    "--lease-ttl",
    default=15.0,
    show_default=True,
    type=Seconds(0.5),
    help="Seconds a session lease lasts unless renewed (a dead worker's sessions "
    "are taken over after this).",
)
@click.option(
    "--grace",
    default=20.0,
    show_default=True,
    type=Seconds(0),
    help="On SIGTERM, seconds a running turn may take to settle before it is handed back.",
)
@click.option(
    "--poll",
    default=0.5,
    show_default=True,
    type=Seconds(0.01),
    help="Seconds between looks at an empty queue without wake notifications (SQLite, "
    "or PostgreSQL's listening connection down); while they arrive, every 5 s.",
)
@click.option(
    "--max-attempts",
    default=5,
    show_default=True,
    type=click.IntRange(1),
    help="Attempts of a wake whose turn keeps failing with an error before it is "
    "dropped (the index then says error:CODE).",
)
@click.option("--workdir", default=None, type=click.Path(file_okay=False),
              help="Where fresh workspaces are made (default: the system temp dir).")  # fmt: skip
@subagents_option
@click.option(
    "--subagent-model",
    "subagent_spec",
    default=None,
    metavar="SPEC",
    help="Model for subagents (default: the model of the session that delegates).",
)
@click.option(
    "--approval-wait",
    default=0.0,
    show_default=True,
    type=Seconds(0),
    help="Seconds a call that needs approval waits for an answer through the control "
    "plane (lodger serve --control answers it); the worker stays up meanwhile, and the "
    "call is denied when nobody answers. 0: deny such calls at once.",
)
@click.option(
    "--approval-park",
    is_flag=True,
    help="A call that needs approval parks instead: it is not dispatched, the question "
    "goes to the control plane, the worker releases the session (dormant, no process "
    "waits) and an answer wakes it; the call then runs or is denied. Not with "
    "--approval-wait.",
)
@click.option(
    "--approval-expiry",
    default=DEFAULT_APPROVAL_EXPIRY_S,
    show_default=True,
    type=Seconds(1, 366 * 24 * 3600),
    metavar="SECONDS",
    help="With --approval-park: how long a parked question stays answerable; then the "
    "session is woken and the call is denied.",
)
@click.option(
    "--subagent-tree-steps",
    "tree_steps",
    default=None,
    type=click.IntRange(0),
    metavar="N",
    help="Model steps every subagent of one root session may spend together "
    "(default: 200); read from the logs, so it holds across workers and restarts.",
)
@click.option(
    "--trust-projects",
    is_flag=True,
    help="Apply the whole lodger.toml of each session's restored workspace: its MCP "
    "servers, allow rules, model and sandbox network. Without it a worker applies only "
    "what narrows (deny and ask rules, stricter sandbox limits, fewer steps), since a "
    "sandboxed command of the session may have written that file.",
)
@click.option(
    "--mcp-key-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The key (32 bytes, mode 600) sealing MCP OAuth logins in the control plane's "
    "secret table (lodger mcp login --control); also $LODGER_MCP_KEY or "
    "$LODGER_MCP_KEY_FILE. Without one, logins come from this machine's keyring or "
    "config directory.",
)
@budget_options
def worker(
    state: str,
    control: str | None,
    concurrency: int,
    model_spec: str | None,
    tools_files: tuple[str, ...],
    lease_ttl: float,
    grace: float,
    poll: float,
    max_attempts: int,
    workdir: str | None,
    subagent_depth: int | None,
    subagent_spec: str | None,
    approval_wait: float,
    approval_park: bool,
    approval_expiry: float,
    tree_steps: int | None,
    trust_projects: bool,
    mcp_key_file: str | None,
    **budget_flags: Any,
) -> None:
    """Run turns of the sessions whose messages and timers are due.

    Claims due wakes, takes each session's lease, restores its workspace snapshot into a
    fresh directory, resumes an interrupted turn, runs the message, snapshots, releases.
    SIGTERM: take no more work; running turns get --grace seconds, then are handed back.
    The model is the one the session last ran with, else --model.
    With --subagents, a delegation's child runs on any worker while the session that
    delegated waits dormant; the child's end wakes it. With --approval-park, a call that
    needs approval leaves its session dormant until the question is answered (lodger
    serve --control answers it) or expires.

    \b
    Example:
      lodger worker --store s3://bucket/lodger --control postgresql://lodger@db/lodger \\
        --concurrency 4 --model openai:gpt-4.1
    """
    logging.basicConfig(level=logging.WARNING, format="worker: %(message)s")
    if approval_park and approval_wait > 0:
        raise click.UsageError(
            "--approval-park and --approval-wait are two ways to ask; choose one "
            "(--approval-park leaves the session dormant while a person decides, "
            "--approval-wait keeps the worker waiting up to SECONDS)"
        )
    extra: list[Tool] = []
    for path in tools_files:
        extra.extend(load_tools_file(path))
    policy = subagent_policy(subagent_depth)
    if policy is not None and subagent_spec:
        policy = dataclasses.replace(policy, model=make_model(subagent_spec))
    if policy is not None and tree_steps is not None:
        policy = dataclasses.replace(policy, tree_steps=tree_steps)
    binder = _Binder(
        trust_projects=trust_projects, model_spec=model_spec, tools=extra, subagents=policy,
        spans=worker_spans(), budgets=budget_overrides(budget_flags),
    )  # fmt: skip
    config = WorkerConfig(
        concurrency=concurrency,
        lease_ttl_s=lease_ttl,
        grace_s=grace,
        poll_s=poll,
        max_attempts=max_attempts,
        approval_expiry_s=approval_expiry,
    )
    dsn = control_dsn(control, state)
    binder.mcp_key = _mcp_key(mcp_key_file)
    asyncio.run(
        _work(dsn, binder, config, workdir=workdir, approval_wait=approval_wait,
              approval_park=approval_park)
    )  # fmt: skip


def _mcp_key(path: str | None) -> bytes | None:
    """The key sealing MCP logins in the control plane, when one is given."""
    from lodger.tools._mcp_credentials import KEY_ENVVAR, KEY_FILE_ENVVAR, load_key

    if path is None and not (os.environ.get(KEY_ENVVAR) or os.environ.get(KEY_FILE_ENVVAR)):
        return None
    return load_key(key_file=path)


@dataclasses.dataclass(kw_only=True)
class _Binder:
    """What a worker binds for each session it wakes: the project found in the
    session's restored workspace (lodger.runtime), then this worker's flags."""

    trust_projects: bool
    model_spec: str | None
    tools: list[Tool]
    subagents: SubagentPolicy | None
    spans: SpanBuilder | None
    #: how a call that needs approval asks (set once the control plane is open)
    approvals: ControlApprovals | ParkingApprovals | None = None
    #: ``usage`` and ``budgets`` of ``Overrides`` from the budget flags
    budgets: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the key of MCP logins sealed in the control plane, and their store once it is open
    mcp_key: bytes | None = dataclasses.field(default=None, repr=False)
    mcp_logins: CredentialStore | None = None

    def __call__(self, session_id: str, recorded: str | None, workspace: Path) -> Binding:
        project = Project.load(workspace, trusted=self.trust_projects)
        approvals = self.approvals
        observers = [approvals.observer()] if isinstance(approvals, ControlApprovals) else []
        if self.spans is not None:
            observers.append(self.spans.observe)
        overrides = Overrides(
            recorded_model=recorded,
            fallback_model=self.model_spec,
            tools=self.tools,
            subagents=self.subagents,
            approver=approvals.approver(session_id) if approvals else None,
            on_event=_fan_out(observers),
            mcp_logins=self.mcp_logins,
            **self.budgets,
        )
        if model_spec_for(project, overrides) is None:
            raise ConfigError(
                f"session {session_id!r} recorded no model and the worker has none",
                hint=f"start the worker with --model SPEC (or {MODEL_ENVVAR})",
                code="worker_model",
                session_id=session_id,
            )
        if project.ignored:
            logging.getLogger("lodger.worker").warning(
                "session %s: its lodger.toml is not trusted on this worker; ignored: %s "
                "(--trust-projects applies it)",
                session_id,
                "; ".join(project.ignored),
            )
        return compose(project, overrides)


async def _work(
    dsn: str,
    binder: _Binder,
    config: WorkerConfig,
    *,
    workdir: str | None,
    approval_wait: float,
    approval_park: bool,
) -> None:
    """Run a worker until SIGTERM or SIGINT, then close what it opened."""
    plane = open_control(dsn)
    storage = location().open()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await plane.start()
        made = Worker(
            control=plane,
            storage=storage,
            bind=binder,
            config=config,
            workdir=Path(workdir) if workdir else None,
        )
        if binder.mcp_key is not None:
            binder.mcp_logins = SealedCredentialStore(plane, binder.mcp_key)
        if approval_wait > 0:
            binder.approvals = ControlApprovals(plane, holder=made.holder, wait_s=approval_wait)
        elif approval_park:
            binder.approvals = ParkingApprovals(plane)
        await made.run(stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):
                loop.remove_signal_handler(signum)
        await storage.close()
        await plane.close()
        if binder.spans is not None:
            binder.spans.shutdown()  # exports what is still buffered


def worker_spans() -> SpanBuilder | None:
    """Spans of the turns this worker runs, when ``OTEL_TRACES_EXPORTER`` asks for them
    (the same builder ``lodger serve`` uses, fed the facts the worker commits)."""
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() in ("", "none"):
        return None
    try:
        from lodger.host.telemetry import tracer_from_env
    except ImportError as exc:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER is set but OpenTelemetry is not installed ({exc})",
            hint="pip install 'lodger[host]', or unset OTEL_TRACES_EXPORTER",
            code="tracing_unavailable",
        ) from None
    return tracer_from_env()


def _fan_out(observers: list[Callable[[Event], None]]) -> Callable[[Event], None] | None:
    if not observers:
        return None
    if len(observers) == 1:
        return observers[0]

    def observe(event: Event) -> None:
        for observer in observers:
            observer(event)

    return observe


# ---------------------------------------------------------------- lodger sessions --control


def list_indexed_sessions(dsn: str) -> list[SessionRow]:
    """The session index, read from the control plane only (no log is opened)."""

    async def work(plane: ControlPlane) -> list[SessionRow]:
        return await plane.list_sessions()

    return _with_control(dsn, work)


def render_indexed(rows: list[SessionRow], *, as_json: bool) -> None:
    if as_json:
        echo_json({"source": "control", "sessions": [
            {"session_id": r.session_id, "status": r.status, "events": r.events,
             "last_activity": r.last_activity, "snapshot": r.snapshot, "model": r.model}
            for r in rows
        ]})  # fmt: skip
        return
    if not rows:
        click.echo("no sessions in the control plane's index")
        return
    table = Table("session", "status", "events", "last activity", "model", "snapshot")
    for r in rows:
        when = datetime.fromtimestamp(r.last_activity, tz=UTC).isoformat(timespec="seconds")
        table.add_row(r.session_id, r.status, str(r.events), when, r.model or "",
                      (r.snapshot or "")[:16])  # fmt: skip
    make_console().print(table)


COMMANDS = [worker, send, schedule]

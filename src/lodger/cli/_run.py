"""``lodger run`` and ``lodger demo``: run a turn and watch it in the terminal."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, get_args

import click
from rich.console import Console
from rich.text import Text

from lodger.cli._common import (
    document,
    json_option,
    location,
    make_console,
    refuse_empty,
    resolve_session,
    state_option,
    storage_flags,
)
from lodger.cli._interrupts import Interrupted, run_interruptibly
from lodger.cli._jsonl import JsonlView, echo_error, json_notice
from lodger.cli._live import Terminal, TurnWatcher, interactive_approver
from lodger.cli._render import visible
from lodger.cli._settings import model_options
from lodger.cli._tools import mcp_option
from lodger.cli._toolsfile import load_tools_file
from lodger.cli._trust import untrusted_notice
from lodger.engine.budgets import Budgets, UsageLimits
from lodger.engine.permissions import ALWAYS_REASON, Approver
from lodger.events import (
    CallRejected,
    Event,
    ModelOutput,
    ModelSwitched,
    PermissionDecided,
    PermissionMode,
    ProviderRetried,
    ToolDispatched,
    ToolResponded,
)
from lodger.media import BinaryContent, UserInput
from lodger.providers import ScriptedModel
from lodger.providers.base import Model, ModelSettings, OutputMode
from lodger.runtime.agent import TurnResult
from lodger.runtime.composition import DEFAULT_MAX_STEPS, MODEL_ENVVAR, Overrides, compose
from lodger.runtime.config import CONFIG_FILE, parse_mcp_option
from lodger.runtime.location import StorageLocation
from lodger.runtime.project import Project
from lodger.runtime.sessions import Binding, Sessions
from lodger.runtime.subagents import SubagentPolicy
from lodger.substrates.codemode import Language
from lodger.substrates.sandbox.policy import SandboxPolicy
from lodger.tools._mcp_content import parse_ref
from lodger.tools.mcp import McpInput, PromptRef, ResourceRef
from lodger.tools.spec import Elicitor, Tool

__all__ = ["COMMANDS", "demo", "run"]


class LiveView(TurnWatcher):
    """Prints a turn as it happens: streamed text, calls, results, rejections, retries;
    on a terminal, a spinner names the running tool and its elapsed time."""

    def __init__(self, console: Console, *, spinner: bool | None = None) -> None:
        super().__init__()
        self.console = console
        self.terminal = Terminal(
            console, spinner=console.is_terminal if spinner is None else spinner
        )
        self._streaming = False
        self._names: dict[str, str] = {}

    def start(self) -> None:
        self.terminal.start()

    def stop(self) -> None:
        self.terminal.stop()

    def on_text(self, delta: str) -> None:
        if not self._streaming:
            self.terminal.print(Text("model ", style="bold cyan"), end="")
            self._streaming = True
        self.terminal.print(Text(visible(delta)), end="")

    def _end_stream(self) -> bool:
        if self._streaming:
            self.terminal.print(Text(""))
            self._streaming = False
            return True
        return False

    def on_event(self, event: Event) -> None:
        self.track(event)
        body = event.body
        out = self.terminal
        if isinstance(body, ModelOutput):
            streamed = self._end_stream()
            if body.text and not streamed:
                out.print(Text("model ", style="bold cyan") + Text(visible(body.text)))
            for call in body.calls:
                self._names[call.call_id] = call.name
            out.model_answered()
        elif isinstance(body, ToolDispatched):
            args = json.dumps(body.arguments, ensure_ascii=False)
            if len(args) > 100:
                args = args[:97] + "..."
            out.print(Text(f"  -> {body.tool} ", style="yellow") + Text(visible(args)))
            if event.call_id is not None:
                out.call_started(event.call_id, body.tool)
        elif isinstance(body, ToolResponded):
            name = self._names.get(event.call_id or "", "")
            first = body.content.strip().splitlines()[0] if body.content.strip() else ""
            if len(first) > 100:
                first = first[:97] + "..."
            style = "green" if body.status == "ok" else "red"
            out.print(Text(f"  <- {name} {body.status} ", style=style) + Text(visible(first)))
            if event.call_id is not None:
                out.call_finished(event.call_id)
        elif isinstance(body, CallRejected):
            out.print(
                Text(f"  x  {body.tool} rejected ({body.reason}) ", style="red")
                + Text(visible(body.message))
            )
        elif isinstance(body, PermissionDecided) and body.decision == "deny":
            out.print(Text(f"  !  {body.tool} denied by {body.by}", style="red"))
        elif isinstance(body, PermissionDecided) and body.decision == "park":
            out.print(Text(f"  ?  {body.tool} waits for approval", style="yellow"))
        elif isinstance(body, PermissionDecided) and body.by == "user":
            out.print(Text(f"  +  {body.tool} allowed", style="green") + _reason(body.reason))
        elif isinstance(body, ProviderRetried):
            out.print(Text(retry_line(body), style="yellow"))
        elif isinstance(body, ModelSwitched):
            out.print(Text(f"  >  {body.from_model} failed; {body.to_model} takes over", "yellow"))


def _reason(reason: str) -> Text:
    if reason == ALWAYS_REASON:
        return Text(" (always, for this session)", style="dim")
    if reason:
        return Text(f" ({reason})", style="dim")
    return Text("")


def retry_line(body: ProviderRetried) -> str:
    """One short line per provider retry: the attempt, the wait and why."""
    error = " ".join(body.error.split())
    asked = ""
    if (found := _RETRY_AFTER.search(error)) is not None:
        asked = f" ({found.group(1)})"
        error = error[: found.start()]
    if (status := error.find("HTTP ")) > 0:
        error = error[status:]  # the model spec before it is on the run's first line
    if len(error) > 80:
        error = error[:77] + "..."
    return f"  ~  retry {body.attempt} in {body.delay_ms / 1000:.1f} s{asked}: {error}"


_RETRY_AFTER = re.compile(r" \((Retry-After [^)]*)\)$")


def live_console() -> Console:
    console = make_console()
    console.soft_wrap = True  # long lines stay whole (commands must copy-paste)
    return console


mode_option = click.option(
    "--mode",
    "permission_mode",
    type=click.Choice(get_args(PermissionMode)),
    default=None,
    help="The permission mode the turn starts in (plan, ask, accept_edits, full_auto; "
    "`lodger mode` switches it while it runs). Deny rules hold in every mode.",
)

code_mode_option = click.option(
    "--code-mode",
    type=click.Choice(["javascript", "python"]),
    is_flag=False,
    flag_value="javascript",
    default=None,
    help="Bind the exec tool: the model writes cells (JavaScript, or Python in Monty) that "
    "call the nestable tools; every nested call is durable and hidden. Resume a session "
    "that used it with the same flag.",
)


def usage_line(result: TurnResult) -> str:
    """Tokens and durable commits of a turn, for the end of a run on a terminal."""
    usage = result.usage
    calls = len(usage.requests)
    cache = ""
    if usage.cache_read_tokens:
        cache = f", {usage.cache_read_tokens:,} from cache: {usage.cache_hit_rate or 0:.0%} hit"
    return (
        f"usage: {usage.total_tokens:,} tokens ({usage.input_tokens:,} in{cache}, "
        f"{usage.output_tokens:,} out) over {calls} model call{'s' if calls != 1 else ''}; "
        f"{result.commits} durable commit{'s' if result.commits != 1 else ''}"
    )


subagents_option = click.option(
    "--subagents",
    "subagent_depth",
    type=click.IntRange(min=1),
    is_flag=False,
    flag_value=1,
    default=None,
    metavar="[DEPTH]",
    help="Bind the delegate tool: the model hands tasks to subagents, child sessions in "
    "the same state and workspace (DEPTH levels of them, default 1). Resume a session "
    "that used it with the same flag.",
)


def subagent_policy(depth: int | None) -> SubagentPolicy | None:
    return None if depth is None else SubagentPolicy(max_depth=depth)


def finish_turn(console: Console, result: TurnResult, flags: str | None = None) -> None:
    if console.is_terminal:
        console.print(Text(usage_line(result), style="dim"))
    style = "bold green" if result.status == "completed" else "bold red"
    console.print(Text(f"turn {result.status}", style=style), end="")
    if result.error:
        console.print(Text(f": {result.error}"), end="")
    console.print()
    state_flag = storage_flags() if flags is None else flags
    if result.status == "parked":
        console.print(
            Text(f"raise it, then: lodger resume {result.session_id}{state_flag}", style="dim"),
            soft_wrap=True,
        )
    console.print(
        Text(f"inspect: lodger log show {result.session_id}{state_flag}", style="dim"),
        soft_wrap=True,
    )


async def _run_turn(
    *,
    binding: Binding,
    task: UserInput | McpInput,
    session: str | None,
    where: StorageLocation,
    view: TurnWatcher | None = None,
) -> TurnResult:
    """Run the turn; in a live ``view`` on a terminal, lines typed meanwhile steer it
    (``lodger.cli._steer_input``)."""
    steer = view if isinstance(view, LiveView) and sys.stdin.isatty() else None
    try:
        async with Sessions(where.open()) as sessions:
            turn = sessions.run(task, binding=binding, session=session)
            if steer is None:
                return await turn
            from lodger.cli._steer_input import with_steering  # only at a terminal

            return await with_steering(turn, sessions, steer, steer.terminal, fd=sys.stdin.fileno())
    finally:
        if not isinstance(binding.model, str):  # compose made a Model
            await binding.model.aclose()  # the CLI made the model: it closes its connections


trust_option = click.option(
    "--trust",
    is_flag=True,
    help=f"Apply the workspace's {CONFIG_FILE} whole for this run (its MCP servers, allow "
    "rules, model, sandbox network) without recording trust; see `lodger trust`.",
)


def load_project(workspace: Path | None, *, trust: bool, as_json: bool = False) -> Project:
    """The workspace's project, trusted if the user said so (``--trust``, or a record
    ``lodger trust`` made); an untrusted file that asked for more says so in one line."""
    if workspace is None:
        return Project.none()
    project = Project.load(workspace, trusted=True if trust else None)
    notice = untrusted_notice(project)
    if notice is not None:
        if as_json:
            json_notice(notice)
        else:
            click.echo(f"note: {notice}", err=True)
    return project


def project_overrides(
    view: TurnWatcher,
    *,
    workspace: Path | None,
    model: str | Model | None,
    tools_files: Sequence[str] = (),
    mcp_specs: Sequence[str] = (),
    approve_all: bool = False,
    interactive: bool = False,
    max_steps: int | None = None,
    code_mode: Language | None = None,
    subagent_depth: int | None = None,
    recorded_model: str | None = None,
    budget_flags: Mapping[str, Any] | None = None,
) -> Overrides:
    """What ``run`` and ``resume`` set on top of the project: their flags and the view.
    ``budget_flags`` are the flags click gave the command beyond its own parameters: the
    budget flags and ``model_settings``/``output_mode`` (``lodger.cli._settings``)."""
    flags = dict(budget_flags or {})
    model_settings: ModelSettings | None = flags.pop("model_settings", None)
    output_mode: OutputMode | None = flags.pop("output_mode", None)
    permission_mode: str | None = flags.pop("permission_mode", None)
    tools: list[Tool] = []
    for path in tools_files:
        tools.extend(load_tools_file(path))
    base = (workspace or Path.cwd()).resolve()
    return Overrides(
        model=model,
        recorded_model=recorded_model,
        tools=tools,
        mcp=[parse_mcp_option(spec, base=base) for spec in mcp_specs],
        approve_all=approve_all,
        approver=approver_for(view, interactive=interactive and not approve_all),
        elicitor=elicitor_for(view, interactive=interactive),
        max_steps=max_steps,
        **budget_overrides(flags),
        code_mode=code_mode,
        subagents=subagent_policy(subagent_depth),
        model_settings=model_settings,
        output_mode=output_mode,
        permission_mode=permission_mode,
        on_event=view.on_event,
        on_text=view.on_text,
    )


def approver_for(view: TurnWatcher, *, interactive: bool) -> Approver | None:
    """The terminal's approval prompt, for a live view on an interactive terminal."""
    if interactive and isinstance(view, LiveView):
        return interactive_approver(view.terminal)
    return None


def elicitor_for(view: TurnWatcher, *, interactive: bool) -> Elicitor | None:
    """The terminal's answers to MCP servers' questions, for a live interactive view."""
    if interactive and isinstance(view, LiveView):
        from lodger.cli._elicit import terminal_elicitor

        return terminal_elicitor(view.terminal)
    return None


def run_turn(main: Coroutine[Any, Any, TurnResult], view: TurnWatcher) -> TurnResult:
    """Run a turn in the terminal; a stop signal settles it and exits naming the resume."""
    view.start()
    try:
        if isinstance(view, JsonlView):
            return run_interruptibly(main, left_running=view.left_running, say=json_notice)
        return run_interruptibly(main, left_running=view.left_running)
    except Interrupted as stopped:
        view.stop()
        session = view.session_id
        flag = storage_flags()
        if isinstance(view, JsonlView):
            resume = f"lodger resume {session}{flag}" if session else None
            echo_error(
                document(
                    {
                        "error": {
                            "code": "interrupted",  # in ERROR_CODES
                            "message": "the turn was stopped; every running call settled "
                            "and was recorded",
                            "session_id": session,
                            "next_steps": [
                                {"action": "resume", "session_id": session, "command": resume}
                            ]
                            if session
                            else [],
                        }
                    }
                )
            )
            sys.exit(stopped.exit_code)
        if session is not None:
            click.echo(
                f"interrupted: session {session} stopped with every running call settled "
                f"and recorded; continue it with `lodger resume {session}{flag}`",
                err=True,
            )
        else:
            click.echo("interrupted before the session started", err=True)
        sys.exit(stopped.exit_code)
    finally:
        view.stop()


def exit_code_for(result: TurnResult) -> int:
    # parked on a budget: 3, as a blocked resume (lodger.cli.EXIT_BLOCKED): it waits for
    # someone to raise a limit
    return {"completed": 0, "cancelled": 130, "parked": 3}.get(result.status, 1)


_USAGE_FLAGS = (
    "request_limit",
    "input_tokens_limit",
    "output_tokens_limit",
    "total_tokens_limit",
    "tool_calls_limit",
)
_MONEY_FLAGS = ("session_usd", "tree_usd", "daily_usd")
_MONEY_WORDS = {
    "session_usd": "the session",
    "tree_usd": "the subagent tree",
    "daily_usd": "every session today (UTC)",
}
_USAGE_WORDS = dict(
    zip(
        _USAGE_FLAGS,
        ("model requests", "input tokens", "output tokens", "tokens", "tool calls"),
        strict=True,
    )
)


def budget_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--request-limit`` ... ``--daily-usd``: the usage limits and money budgets of
    ``run`` and ``resume`` (over ``[limits]`` and ``[budgets]`` of the project)."""
    for name in reversed(_MONEY_FLAGS):
        flag = "--" + name.replace("_", "-")
        command = click.option(
            flag,
            name,
            type=click.FloatRange(min=0),
            default=None,
            metavar="USD",
            help=f"Park the turn once {_MONEY_WORDS[name]} spent USD (over [budgets] {name}).",
        )(command)
    for name in reversed(_USAGE_FLAGS):
        flag = "--" + name.replace("_", "-")
        command = click.option(
            flag,
            name,
            type=click.IntRange(min=0),
            default=None,
            metavar="N",
            help=f"Park the turn at N {_USAGE_WORDS[name]} (over [limits] {name}).",
        )(command)
    return command


def budget_overrides(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Overrides`` fields the budget flags set (none when no flag was given)."""
    out: dict[str, Any] = {}
    usage = {k: flags[k] for k in _USAGE_FLAGS if flags.get(k) is not None}
    if usage:
        out["usage"] = UsageLimits(**usage)
    money: dict[str, Any] = {k: str(flags[k]) for k in _MONEY_FLAGS if flags.get(k) is not None}
    if money:
        out["budgets"] = Budgets(**money)
    return out


@click.command()
@model_options
@click.argument("task", required=False, default="")
@click.option(
    "--model",
    "model_spec",
    envvar=MODEL_ENVVAR,
    metavar="SPEC",
    help="script:PATH, openai:MODEL, openai-compatible:URL#MODEL, responses:MODEL, "
    f"anthropic:MODEL; 'A|B' falls back from A to B (env {MODEL_ENVVAR}).",
)
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=".",
    show_default=True,
    help="Directory the file and shell tools work in.",
)
@click.option(
    "--session",
    metavar="ID",
    help="Continue this session (an id, or a unique prefix of one; default: a new one).",
)
@click.option(
    "--last", is_flag=True, default=False, help="Continue the session with the latest event."
)
@click.option(
    "--tools",
    "tools_files",
    multiple=True,
    metavar="FILE.py",
    help="Bind the @tool functions of a Python file (repeatable).",
)
@click.option("--yes", is_flag=True, help="Approve every call that asks for approval.")
@click.option(
    "--attach",
    "attach",
    multiple=True,
    metavar="FILE",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Give the model an image or a document with TASK (png, jpeg, gif, webp, pdf, "
    "text; repeatable). It is stored with the session and read again on resume.",
)
@trust_option
@click.option(
    "--max-steps",
    type=click.IntRange(min=1),
    default=None,
    help=f"Stop the turn after N steps (default: [limits] max_steps of {CONFIG_FILE}, "
    f"else {DEFAULT_MAX_STEPS}).",
)
@budget_options
@code_mode_option
@subagents_option
@mcp_option
@click.option(
    "--resource",
    "resources",
    multiple=True,
    metavar="SERVER:URI",
    help="Give the model this resource of an MCP server with TASK (repeatable).",
)
@click.option(
    "--prompt",
    "prompt",
    metavar="SERVER:NAME",
    help="Start the turn from this prompt of an MCP server (TASK, if given, follows it).",
)
@click.option(
    "--arg",
    "prompt_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="An argument of --prompt (repeatable).",
)
@mode_option
@state_option
@json_option
def run(
    task: str,
    model_spec: str | None,
    workspace: Path,
    session: str | None,
    last: bool,
    tools_files: tuple[str, ...],
    yes: bool,
    attach: tuple[Path, ...],
    trust: bool,
    max_steps: int | None,
    code_mode: Language | None,
    subagent_depth: int | None,
    mcp_specs: tuple[str, ...],
    resources: tuple[str, ...],
    prompt: str | None,
    prompt_args: tuple[str, ...],
    state: str,
    as_json: bool,
    **budget_flags: Any,
) -> None:
    """Run one turn of TASK with a model and the workspace tools.

    The turn streams to the terminal: model text, each call with its arguments, each
    result, rejections and approval prompts (allow once, always for this tool in this
    session, or deny). On a terminal a spinner names the running tool and its time, and
    the turn ends with its token usage and durable commits. Every fact is committed to
    the session log in --state before anything acts on it.

    With --json, stdout is JSON Lines (schema v1: the CLI guide, "JSON output"): a "text" line per
    streamed delta, a "fact" line per committed event, and a last "result" line; errors
    are JSON on stderr. Nobody is asked for approval: --yes approves, otherwise calls
    that ask are denied.

    \b
    Example:
      lodger run "add a --verbose flag to cli.py" --model openai:gpt-4.1
      lodger run "summarize README.md" --model openai-compatible:http://localhost:11434/v1#qwen3
      lodger run "fix the failing test" --model script:steps.json --yes --tools mytools.py
      lodger run "what changed today?" --model openai:gpt-4.1 --mcp 'git=mcp-server-git'
      lodger run "sum up" --resource docs:file:///README.md --prompt git:review --arg n=3
      lodger run "which deps are outdated?" --model openai:gpt-4.1 --code-mode
      lodger run "list the files" --model test --json | jq -c 'select(.type == "result")'
      lodger run "review each module" --model openai:gpt-4.1 --subagents
      lodger run "name three colours" --model openai:gpt-4.1 --temperature 0.2 --max-tokens 200
      lodger run "what does this chart show?" --attach chart.png --model openai:gpt-4.1
      lodger run "tidy the tests" --model openai:gpt-4.1 --session-usd 0.50 --request-limit 30

    A turn that reaches a usage limit or a budget parks (exit 3): raise it (a flag, or
    [limits] / [budgets] in lodger.toml) and `lodger resume SESSION --session-usd 5`
    (say) continues it.
    """
    refuse_empty(
        session, "--session", hint="give a session id or a unique prefix of one, or --last"
    )
    if session is not None or last:
        session = resolve_session(state, session, last=last)
    turn_input = _turn_input(task, attach, resources, prompt, prompt_args)
    project = load_project(workspace, trust=trust, as_json=as_json)
    console = live_console()
    view: TurnWatcher = JsonlView() if as_json else LiveView(console)
    binding = compose(
        project,
        project_overrides(
            view,
            workspace=workspace,
            model=model_spec,
            tools_files=tools_files,
            mcp_specs=mcp_specs,
            approve_all=yes,
            interactive=sys.stdin.isatty() and not as_json,
            max_steps=max_steps,
            code_mode=code_mode,
            subagent_depth=subagent_depth,
            budget_flags=budget_flags,
        ),
    )
    where = location()
    turn = _run_turn(binding=binding, task=turn_input, session=session, where=where, view=view)
    _finish(view, console, run_turn(turn, view))


def _turn_input(
    task: str,
    attach: Sequence[Path],
    resources: Sequence[str],
    prompt: str | None,
    prompt_args: Sequence[str],
) -> UserInput | McpInput:
    """TASK with its attachments (read now: a file that cannot go is refused before
    anything runs), or the MCP resources and prompt the turn starts from."""
    media = [BinaryContent.from_path(path) for path in attach]
    if resources or prompt is not None or prompt_args:
        return mcp_input(task, resources, prompt, prompt_args, media)
    if not task.strip():
        raise click.UsageError("give a TASK (or --prompt SERVER:NAME)")
    return [task, *media] if media else task


def mcp_input(
    task: str,
    resources: Sequence[str],
    prompt: str | None,
    prompt_args: Sequence[str],
    media: Sequence[BinaryContent],
) -> McpInput:
    """``--resource``, ``--prompt`` and ``--arg`` as a turn's input, read when it starts."""
    if prompt_args and prompt is None:
        raise click.UsageError("--arg goes with --prompt SERVER:NAME")
    arguments: dict[str, str] = {}
    for pair in prompt_args:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.UsageError(f"--arg {pair!r} is not KEY=VALUE")
        arguments[key] = value
    refs = [
        ResourceRef(server=s, uri=u) for s, u in (parse_ref(r, "--resource") for r in resources)
    ]
    ref = None
    if prompt is not None:
        server, name = parse_ref(prompt, "--prompt")
        ref = PromptRef(server=server, name=name, arguments=arguments)
    return McpInput(text=task, resources=refs, prompt=ref, media=media)


def _finish(view: TurnWatcher, console: Console, result: TurnResult) -> NoReturn:
    """Show how the turn ended (a JSON result line, or the terminal's summary) and exit
    with its code."""
    code = exit_code_for(result)
    if isinstance(view, JsonlView):
        view.finish(result, code)
    else:
        finish_turn(console, result)
    sys.exit(code)


# ---------------------------------------------------------------- demo

DEMO_FILES = {
    "README.md": "# tiny service\n\nServes the API on port 3000.\n",
    "app/config.py": 'HOST = "127.0.0.1"\nPORT = 3000\nDEBUG = False\n',
    "app/server.py": "from app.config import HOST, PORT\n\n\ndef address():\n"
    '    return f"{HOST}:{PORT}"\n',
}

DEMO_SCRIPT: list[dict[str, Any]] = [
    {
        "text": "I'll look at the project first.",
        "calls": [
            {"name": "list_files", "args": {"pattern": "**/*"}},
            {"name": "read_file", "args": {"path": "app/config.py"}},
            {"name": "grep", "args": {"pattern": "3000"}},
        ],
    },
    {
        "text": "The port is set in app/config.py and mentioned in the README; "
        "I'll change both in one batch.",
        "calls": [
            {
                "name": "edit_file",
                "args": {
                    "path": "app/config.py",
                    "old_string": "PORT = 3000",
                    "new_string": "PORT = 4000",
                },
            },
            {
                "name": "edit_file",
                "args": {
                    "path": "README.md",
                    "old_string": "port 3000",
                    "new_string": "port 4000",
                },
            },
        ],
    },
    {
        "text": "Let me try to clean up with a shell command.",
        "calls": [{"name": "shell", "args": {"command": "rm -rf app/__pycache__"}}],
    },
    {
        "text": "Changed the port from 3000 to 4000 in app/config.py and README.md. "
        "The cleanup command needs approval, so I left it alone.",
    },
]


DEMO_PREFIX = "lodger-demo-"


def latest_demo_state() -> Path | None:
    """The state directory of the newest ``lodger demo`` run that kept its session in a
    temporary directory (one this user owns), so ``lodger sessions`` can point at it."""
    found: list[tuple[float, Path]] = []
    for root in Path(tempfile.gettempdir()).glob(f"{DEMO_PREFIX}*"):
        log = root / "state" / "log.sqlite3"
        try:
            info = log.stat()
            owner = root.stat().st_uid
        except OSError:
            continue
        if owner == os.getuid():
            found.append((info.st_mtime, root / "state"))
    return max(found)[1] if found else None


@click.command()
@click.option(
    "--state",
    metavar="DIR",
    default=None,
    help="State directory (default: a fresh temporary directory, printed at the end).",
)
def demo(state: str | None) -> None:
    """Run a built-in scripted session offline in a temporary workspace.

    It reads files in a parallel batch, edits two files, has a shell call denied (it
    needs approval and the demo approves nothing), and answers. Nothing leaves the
    machine; no API key is needed.

    \b
    Example:
      lodger demo
      lodger demo --state .lodger && lodger log show SESSION
    """
    root = Path(tempfile.mkdtemp(prefix=DEMO_PREFIX))
    workspace = root / "workspace"
    for rel, content in DEMO_FILES.items():
        path = workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    state_dir = state or str(root / "state")
    console = live_console()
    console.print(Text(f"workspace: {workspace}", style="dim"))
    view = LiveView(console)
    binding = compose(
        Project.load(workspace),
        Overrides(
            model=ScriptedModel(DEMO_SCRIPT, name="demo"),
            # The demo's shell call asks for approval (and is denied) even though it is
            # sandboxed: a policy may ask, and the demo shows a denial.
            sandbox=SandboxPolicy(approval=True),
            max_steps=10,
            on_event=view.on_event,
            on_text=view.on_text,
        ),
    )
    where = StorageLocation(state=state_dir)
    result = run_turn(
        _run_turn(
            binding=binding,
            task="Move the service from port 3000 to 4000.",
            session=None,
            where=where,
        ),
        view,
    )
    finish_turn(console, result, storage_flags(where))
    console.print(
        Text(f"verify:  lodger log verify {result.session_id} --state {state_dir}", style="dim"),
        soft_wrap=True,
    )
    if state is None:  # the state is in a temporary directory: say how to find it again
        console.print(
            Text(
                f"list:    lodger sessions --state {state_dir}  (or export "
                f"LODGER_STATE={state_dir}; `lodger demo --state .lodger` keeps it here)",
                style="dim",
            ),
            soft_wrap=True,
        )
    sys.exit(exit_code_for(result))


COMMANDS = (run, demo)

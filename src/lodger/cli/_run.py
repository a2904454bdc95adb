"""``lodger run`` and ``lodger demo``: run a turn and watch it in the terminal."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import tempfile
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from lodger.agent import TurnResult
from lodger.cli._common import make_console, state_option, store_url
from lodger.cli._interrupts import Interrupted, run_interruptibly
from lodger.cli._tools import mcp_option, mcp_servers_for
from lodger.codemode import Language
from lodger.engine.permissions import PermissionPolicy
from lodger.errors import ConfigError
from lodger.events import (
    CallRejected,
    Event,
    ModelOutput,
    PermissionDecided,
    ProviderRetried,
    ToolDispatched,
    ToolResponded,
)
from lodger.providers import ScriptedModel, make_model
from lodger.providers.base import Model
from lodger.sandbox.policy import SandboxPolicy
from lodger.sessions import Binding, Sessions
from lodger.storage import Storage
from lodger.subagents import SubagentPolicy, current_subagent
from lodger.tools.builtin import workspace_tools
from lodger.tools.config import CONFIG_FILE, load_project_config, load_sandbox_policy
from lodger.tools.mcp import McpServerConfig
from lodger.tools.spec import Tool

__all__ = ["COMMANDS", "demo", "run"]

MODEL_ENVVAR = "LODGER_MODEL"


def load_tools_file(path: str) -> list[Tool]:
    """Every ``Tool`` defined at module level in a Python file (``--tools FILE.py``)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"tools file {path} does not exist", hint="pass a .py file")
    spec = importlib.util.spec_from_file_location(f"lodger_user_tools_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import tools file {path}", hint="pass a .py file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # user code: report it as one clear line
        # A MemoryError from the compiler (a file nested too deeply) has no message.
        detail = str(exc) or "the file is too large or nested too deeply to compile"
        raise ConfigError(
            f"importing tools file {path} failed: {type(exc).__name__}: {detail}",
            hint="run the file with python to see the full error",
        ) from exc
    tools = [value for value in vars(module).values() if isinstance(value, Tool)]
    if not tools:
        raise ConfigError(
            f"tools file {path} defines no tools",
            hint="decorate functions with @lodger.tool at module level",
        )
    return tools


class LiveView:
    """Prints a turn as it happens: streamed text, calls, results, rejections."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._streaming = False
        self._names: dict[str, str] = {}
        self.session_id: str | None = None
        #: calls past T1 without a T2 yet: what a hard exit would leave indeterminate
        self.in_flight: dict[str, str] = {}

    def left_running(self) -> str:
        session = self.session_id or "SESSION"
        if not self.in_flight:
            return f"no call was running; `lodger resume {session}` continues the turn"
        calls = ", ".join(f"{name} ({call})" for call, name in self.in_flight.items())
        return (
            f"left without an outcome: {calls}; `lodger recover {session}` shows what "
            "resume will do with them"
        )

    def on_text(self, delta: str) -> None:
        if not self._streaming:
            self.console.print(Text("model ", style="bold cyan"), end="")
            self._streaming = True
        self.console.print(Text(delta), end="")

    def _end_stream(self) -> bool:
        if self._streaming:
            self.console.print()
            self._streaming = False
            return True
        return False

    def on_event(self, event: Event) -> None:
        self.session_id = event.session_id
        body = event.body
        if isinstance(body, ToolDispatched) and event.call_id is not None:
            self.in_flight[event.call_id] = body.tool
        elif isinstance(body, ToolResponded) and event.call_id is not None:
            self.in_flight.pop(event.call_id, None)
        if isinstance(body, ModelOutput):
            streamed = self._end_stream()
            if body.text and not streamed:
                self.console.print(Text("model ", style="bold cyan") + Text(body.text))
            for call in body.calls:
                self._names[call.call_id] = call.name
        elif isinstance(body, ToolDispatched):
            args = json.dumps(body.arguments, ensure_ascii=False)
            if len(args) > 100:
                args = args[:97] + "..."
            self.console.print(Text(f"  -> {body.tool} ", style="yellow") + Text(args))
        elif isinstance(body, ToolResponded):
            name = self._names.get(event.call_id or "", "")
            first = body.content.strip().splitlines()[0] if body.content.strip() else ""
            if len(first) > 100:
                first = first[:97] + "..."
            style = "green" if body.status == "ok" else "red"
            self.console.print(Text(f"  <- {name} {body.status} ", style=style) + Text(first))
        elif isinstance(body, CallRejected):
            self.console.print(
                Text(f"  x  {body.tool} rejected ({body.reason}) ", style="red")
                + Text(body.message)
            )
        elif isinstance(body, PermissionDecided) and body.decision == "deny":
            self.console.print(Text(f"  !  {body.tool} denied by {body.by}", style="red"))
        elif isinstance(body, ProviderRetried):
            self.console.print(
                Text(f"  ~  provider error, retry {body.attempt} in {body.delay_ms} ms: ")
                + Text(body.error),
                style="dim",
            )


def live_console() -> Console:
    console = make_console()
    console.soft_wrap = True  # long lines stay whole (commands must copy-paste)
    return console


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


def _interactive_approver(console: Console) -> Any:
    async def approve(t: Tool, arguments: dict[str, Any]) -> bool:
        summary = json.dumps(arguments, ensure_ascii=False)
        child = current_subagent()
        who = f"subagent {child.session_id}: " if child is not None else ""
        console.print(
            Text(f"  ?  {who}{t.name} wants to run: ", style="bold magenta") + Text(summary)
        )
        return await asyncio.to_thread(click.confirm, "     allow?", default=False)

    return approve


def finish_turn(console: Console, result: TurnResult, state: str) -> None:
    style = "bold green" if result.status == "completed" else "bold red"
    console.print(Text(f"turn {result.status}", style=style), end="")
    if result.error:
        console.print(Text(f": {result.error}"), end="")
    console.print()
    state_flag = "" if state == ".lodger" else f" --state {state}"
    console.print(
        Text(f"inspect: lodger log show {result.session_id}{state_flag}", style="dim"),
        soft_wrap=True,
    )


async def _run_turn(
    *,
    model: Model,
    task: str,
    workspace: Path,
    state: str,
    session: str | None,
    tools: list[Tool],
    approve_all: bool,
    interactive: bool,
    max_steps: int,
    view: LiveView,
    mcp: Sequence[McpServerConfig] = (),
    code_mode: Language | None = None,
    subagents: SubagentPolicy | None = None,
) -> TurnResult:
    binding = Binding(
        code_mode=code_mode,
        subagents=subagents,
        model=model,
        tools=tools,
        mcp=mcp,
        workspace=workspace,
        permissions=PermissionPolicy(
            load_project_config(workspace / CONFIG_FILE).permissions.rules(),
            approve_all=approve_all,
        ),
        approver=_interactive_approver(view.console) if interactive and not approve_all else None,
        max_steps=max_steps,
        on_event=view.on_event,
        on_text=view.on_text,
    )
    try:
        async with Sessions(Storage.open(state, store=store_url())) as sessions:
            return await sessions.run(task, binding=binding, session=session)
    finally:
        await model.aclose()  # the CLI made the model: it closes its connections


def run_turn(main: Coroutine[Any, Any, TurnResult], view: LiveView, state: str) -> TurnResult:
    """Run a turn in the terminal; a stop signal settles it and exits naming the resume."""
    try:
        return run_interruptibly(main, left_running=view.left_running)
    except Interrupted as stopped:
        session = view.session_id
        flag = "" if state == ".lodger" else f" --state {state}"
        if session is not None:
            click.echo(
                f"interrupted: session {session} stopped with every running call settled "
                f"and recorded; continue it with `lodger resume {session}{flag}`",
                err=True,
            )
        else:
            click.echo("interrupted before the session started", err=True)
        sys.exit(stopped.exit_code)


def exit_code_for(result: TurnResult) -> int:
    return {"completed": 0, "cancelled": 130}.get(result.status, 1)


@click.command()
@click.argument("task")
@click.option(
    "--model",
    "model_spec",
    envvar=MODEL_ENVVAR,
    metavar="SPEC",
    help="script:PATH, openai:MODEL, openai-compatible:URL#MODEL, responses:MODEL, "
    f"anthropic:MODEL (env {MODEL_ENVVAR}).",
)
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=".",
    show_default=True,
    help="Directory the file and shell tools work in.",
)
@click.option("--session", metavar="ID", help="Continue this session (default: a new one).")
@click.option(
    "--tools",
    "tools_files",
    multiple=True,
    metavar="FILE.py",
    help="Bind the @tool functions of a Python file (repeatable).",
)
@click.option("--yes", is_flag=True, help="Approve every call that asks for approval.")
@click.option("--max-steps", default=50, show_default=True, help="Stop the turn after N steps.")
@code_mode_option
@subagents_option
@mcp_option
@state_option
def run(
    task: str,
    model_spec: str | None,
    workspace: Path,
    session: str | None,
    tools_files: tuple[str, ...],
    yes: bool,
    max_steps: int,
    code_mode: Language | None,
    subagent_depth: int | None,
    mcp_specs: tuple[str, ...],
    state: str,
) -> None:
    """Run one turn of TASK with a model and the workspace tools.

    The turn streams to the terminal: model text, each call with its arguments, each
    result, rejections and approval prompts. Every fact is committed to the session log
    in --state before anything acts on it.

    \b
    Example:
      lodger run "add a --verbose flag to cli.py" --model openai:gpt-4.1
      lodger run "summarize README.md" --model openai-compatible:http://localhost:11434/v1#qwen3
      lodger run "fix the failing test" --model script:steps.json --yes --tools mytools.py
      lodger run "what changed today?" --model openai:gpt-4.1 --mcp 'git=mcp-server-git'
      lodger run "which deps are outdated?" --model openai:gpt-4.1 --code-mode
      lodger run "review each module" --model openai:gpt-4.1 --subagents
    """
    model_spec = model_spec or load_project_config(workspace / CONFIG_FILE).model
    if not model_spec:
        raise ConfigError(
            "no model given",
            hint=f'pass --model SPEC, set {MODEL_ENVVAR}, or set model = "..." in '
            f"{CONFIG_FILE}; `lodger demo` runs offline",
        )
    model = make_model(model_spec)
    tools = workspace_tools(sandbox=load_sandbox_policy(workspace))
    for path in tools_files:
        tools.extend(load_tools_file(path))
    mcp = mcp_servers_for(workspace, mcp_specs)  # lodger.toml in the workspace, then --mcp
    console = live_console()
    view = LiveView(console)
    result = run_turn(
        _run_turn(
            model=model,
            task=task,
            workspace=workspace.resolve(),
            state=state,
            session=session,
            tools=tools,
            approve_all=yes,
            interactive=sys.stdin.isatty(),
            max_steps=max_steps,
            view=view,
            mcp=mcp,
            code_mode=code_mode,
            subagents=subagent_policy(subagent_depth),
        ),
        view,
        state,
    )
    finish_turn(console, result, state)
    sys.exit(exit_code_for(result))


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
    root = Path(tempfile.mkdtemp(prefix="lodger-demo-"))
    workspace = root / "workspace"
    for rel, content in DEMO_FILES.items():
        path = workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    state_dir = state or str(root / "state")
    console = live_console()
    console.print(Text(f"workspace: {workspace}", style="dim"))
    view = LiveView(console)
    result = run_turn(
        _run_turn(
            model=ScriptedModel(DEMO_SCRIPT, name="demo"),
            task="Move the service from port 3000 to 4000.",
            workspace=workspace,
            state=state_dir,
            session=None,
            # The demo's shell call asks for approval (and is denied) even though it is
            # sandboxed: a policy may ask, and the demo shows a denial.
            tools=workspace_tools(sandbox=SandboxPolicy(approval=True)),
            approve_all=False,
            interactive=False,
            max_steps=10,
            view=view,
        ),
        view,
        state_dir,
    )
    finish_turn(console, result, state_dir)
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

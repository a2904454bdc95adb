"""``lodger serve``: the HTTP host over a state directory or an object store.

Embedded (``--state DIR`` or ``--store URL`` alone): the host runs the turns itself.
Distributed (``--store URL --control DSN``): the host runs none; sends become wakes in the
control plane that ``lodger worker`` processes run (``lodger.host.distributed``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from lodger.cli._common import Seconds, state_option, store_url
from lodger.cli._run import budget_options, budget_overrides, code_mode_option
from lodger.cli._toolsfile import load_tools_file
from lodger.substrates.codemode import Language
from lodger.tools.spec import Tool

__all__ = ["COMMANDS", "serve"]


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8470, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="SPEC",
    help="A model sessions may use (repeatable; the first is the default; default: test).",
)
@click.option(
    "--tools", "tools_files", multiple=True, metavar="FILE.py", help="Bind @tool functions."
)
@click.option(
    "--workspaces",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Give each session a workspace DIR/<session> and the workspace tools.",
)
@click.option(
    "--control",
    "control_dsn",
    metavar="DSN",
    default=None,
    help="Distributed mode: the control plane workers share (postgresql://... or a SQLite "
    "file, as lodger worker takes it). The host then runs no turns: lodger worker "
    "processes run them (start them with --approval-wait to let calls wait for answers).",
)
@click.option(
    "--host-index",
    "control_path",
    metavar="PATH",
    default=None,
    help="The host's own index (tokens, webhook deliveries; in embedded mode also "
    "messages and approvals): a SQLite file (default: <state>/host.sqlite3).",
)
@click.option(
    "--poll",
    default=None,
    type=Seconds(0.01),
    help="Seconds between looks at the log for facts committed by other processes "
    "(default: 1 embedded, 0.25 distributed).",
)
@click.option(
    "--hooks",
    "hooks_file",
    metavar="FILE.toml",
    default=None,
    help='Webhooks: [hooks.NAME] secret_env = ..., session = ID | "new".',
)
@click.option("--max-steps", default=50, show_default=True, help="Stop a turn after N steps.")
@click.option("--access-log", is_flag=True, help="Log each request (never its token).")
@click.option(
    "--trust-projects",
    is_flag=True,
    help="Apply the whole lodger.toml of each session's workspace (MCP servers, allow "
    "rules, sandbox network); without it only what narrows applies.",
)
@code_mode_option
@budget_options
@state_option
def serve(
    host: str,
    port: int,
    models: tuple[str, ...],
    tools_files: tuple[str, ...],
    workspaces: Path | None,
    control_dsn: str | None,
    control_path: str | None,
    poll: float | None,
    hooks_file: str | None,
    max_steps: int,
    access_log: bool,
    trust_projects: bool,
    code_mode: Language | None,
    state: str,
    **budget_flags: Any,
) -> None:
    """Serve sessions over HTTP: create, send, stream live facts, approve, recover.

    Prints an admin token (or takes it from $LODGER_HOST_TOKEN); every request needs a
    token (Authorization: Bearer ...). The API contract is /openapi.json; the operator
    console is /console#token=TOKEN, a session's timeline /timeline/SESSION#token=TOKEN.

    \b
    Example:
      lodger serve --state .lodger --model script:steps.json --port 8470
      curl -H "Authorization: Bearer $TOKEN" localhost:8470/v1/sessions
      lodger serve --store s3://bucket/lodger --control postgresql://lodger@db/lodger
    """
    from lodger.host.hub import HostConfig
    from lodger.host.server import serve as run_server
    from lodger.host.webhooks import load_hooks

    tools: list[Tool] = []
    for path in tools_files:
        tools.extend(load_tools_file(path))
    config = HostConfig(
        models=models or ("test",),
        tools=tuple(tools),
        workspaces=workspaces.resolve() if workspaces is not None else None,
        code_mode=code_mode,
        max_steps=max_steps,
        trust_projects=trust_projects,
        **budget_overrides(budget_flags),
    )
    hooks = load_hooks(hooks_file) if hooks_file else {}

    def say(line: str) -> None:
        click.echo(line)

    asyncio.run(
        run_server(
            state=state,
            store=store_url(),
            control_path=control_path,
            control_dsn=control_dsn,
            poll_s=poll,
            host=host,
            port=port,
            config=config,
            hooks=hooks,
            access_log=access_log,
            say=say,
        )
    )


COMMANDS = (serve,)

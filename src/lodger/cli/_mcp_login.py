"""``lodger mcp login | logout | status``: OAuth logins to a project's MCP servers.

The servers are the ones a run in the workspace binds (the one composition): those of a
trusted ``lodger.toml`` with ``oauth`` in their table. A login is kept host-side (the
OS keyring, else ``~/.config/lodger/mcp-logins``, mode 600), or with ``--control`` in a
control plane's secret table sealed with ``$LODGER_MCP_KEY`` / ``--key-file``, for
workers. No command prints a token.
"""

from __future__ import annotations

import asyncio
import json
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from lodger.cli._common import echo_json, json_option
from lodger.cli._trust import untrusted_notice
from lodger.runtime.composition import Overrides, bound_tools
from lodger.runtime.mcp_logins import McpLogins
from lodger.runtime.project import Project

__all__ = ["COMMANDS", "mcp"]

F = TypeVar("F", bound=Callable[..., Any])


def _where(fn: F) -> F:
    fn = click.option(
        "--workspace",
        "-w",
        default=".",
        show_default=True,
        type=click.Path(file_okay=False, exists=True, path_type=Path),
        help="The workspace whose lodger.toml names the servers.",
    )(fn)
    fn = click.option(
        "--trust", is_flag=True, help="Apply the workspace's lodger.toml whole for this command."
    )(fn)
    fn = click.option(
        "--control",
        metavar="DSN",
        default=None,
        help="Keep the login in this control plane's secret table (for workers), sealed "
        "with $LODGER_MCP_KEY or --key-file.",
    )(fn)
    fn = click.option(
        "--key-file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="The 32-byte key sealing logins in the control plane (mode 600).",
    )(fn)
    return json_option(fn)


async def _run(
    workspace: Path,
    trust: bool,
    control: str | None,
    key_file: Path | None,
    work: Callable[[McpLogins], Any],
) -> Any:
    project = await asyncio.to_thread(Project.load, workspace, trusted=True if trust else None)
    notice = untrusted_notice(project)
    if notice is not None:
        click.echo(notice, err=True)
    _, servers = bound_tools(project, Overrides(builtin_tools=False))
    if control is None:
        return await work(McpLogins(servers))
    from lodger.storage.control import open_control
    from lodger.tools._mcp_credentials import SealedCredentialStore, load_key

    key = load_key(key_file=key_file)
    plane = open_control(control)
    await plane.start()
    try:
        return await work(McpLogins(servers, store=SealedCredentialStore(plane, key)))
    finally:
        await plane.close()


@click.group()
def mcp() -> None:
    """OAuth logins to MCP servers over HTTP (servers with `oauth` in lodger.toml).

    \b
    Example:
      lodger mcp login linear        # opens the authorization page, waits for it
      lodger mcp status
      lodger mcp logout linear
    """


@mcp.command()
@click.argument("name")
@click.option("--no-browser", is_flag=True, help="Print the URL only; do not open a browser.")
@click.option(
    "--timeout", "timeout_s", type=float, default=600.0, show_default=True,
    help="Seconds to wait for the authorization page to send you back.",
)  # fmt: skip
@_where
def login(
    name: str,
    no_browser: bool,
    timeout_s: float,
    workspace: Path,
    trust: bool,
    control: str | None,
    key_file: Path | None,
    as_json: bool,
) -> None:
    """Log in to MCP server NAME: open its authorization page, take the code it sends
    back to a listener on 127.0.0.1, and keep the tokens.

    \b
    Example:
      lodger mcp login linear
      lodger mcp login docs --no-browser --control postgresql://lodger@db/lodger
    """

    def show(url: str) -> None:
        if as_json:  # one line, before the command waits: a program reads it at once
            click.echo(json.dumps({"authorization_url": url}))
        else:
            click.echo(f"Open this URL to log in to {name!r}:\n  {url}", err=True)
        if not no_browser:
            webbrowser.open(url)

    async def work(logins: McpLogins) -> Any:
        return await logins.login_loopback(name, show=show, timeout_s=timeout_s)

    done = asyncio.run(_run(workspace, trust, control, key_file, work))
    view = done.public()
    if as_json:
        echo_json({"logged_in": True, **view})
    else:
        until = _until(view.get("expires_at"))
        click.echo(f"logged in to {name!r} at {view['issuer']} (client {view['client_id']}{until})")


@mcp.command()
@click.argument("name")
@_where
def logout(
    name: str, workspace: Path, trust: bool, control: str | None, key_file: Path | None,
    as_json: bool,
) -> None:  # fmt: skip
    """Revoke NAME's tokens where its server offers revocation, then forget them.

    \b
    Example:
      lodger mcp logout linear
    """

    async def work(logins: McpLogins) -> Any:
        return await logins.logout(name)

    done = asyncio.run(_run(workspace, trust, control, key_file, work))
    if as_json:
        echo_json(done)
        return
    if not done.get("deleted"):
        click.echo(f"{name!r} was not logged in")
        return
    revoked = " and ".join(k.replace("_", " ") for k in done["revoked"]) or "nothing (not offered)"
    click.echo(f"logged out of {name!r}; revoked: {revoked}")
    if "problem" in done:
        click.echo(f"warning: {done['problem']}", err=True)


@mcp.command()
@_where
def status(
    workspace: Path, trust: bool, control: str | None, key_file: Path | None, as_json: bool
) -> None:
    """Who is logged in to each OAuth MCP server, and until when (never a token).

    \b
    Example:
      lodger mcp status --json
    """

    async def work(logins: McpLogins) -> Any:
        return await logins.status()

    rows = asyncio.run(_run(workspace, trust, control, key_file, work))
    if as_json:
        echo_json({"servers": rows})
        return
    if not rows:
        click.echo("no MCP server with OAuth in this project")
    for row in rows:
        if row.get("logged_in"):
            state = "expired (refreshable)" if row["expired"] and row["refreshable"] else (
                "expired" if row["expired"] else "logged in"
            )  # fmt: skip
            click.echo(f"{row['server']}: {state} at {row['issuer']}{_until(row['expires_at'])}")
        else:
            why = f" ({row['problem']})" if "problem" in row else ""
            click.echo(f"{row['server']}: not logged in{why}")


def _until(expires_at: float | None) -> str:
    if expires_at is None:
        return ""
    import datetime

    moment = datetime.datetime.fromtimestamp(expires_at, tz=datetime.UTC)
    return f", token until {moment:%Y-%m-%d %H:%M} UTC"


COMMANDS = (mcp,)

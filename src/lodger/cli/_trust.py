"""``lodger trust``: apply a workspace's ``lodger.toml`` whole, once you have read it.

Until then lodger reads only what narrows from the file (deny and ask rules, stricter
sandbox limits): it starts none of its MCP servers, adds none of its allow rules, opens
none of its network and uses none of its model (``lodger.runtime.trust``).
"""

from __future__ import annotations

from pathlib import Path

import click

from lodger.cli._common import echo_json, json_option
from lodger.runtime.config import CONFIG_FILE
from lodger.runtime.project import Project
from lodger.runtime.trust import TrustStore

__all__ = ["COMMANDS", "trust", "untrusted_notice"]


@click.command()
@click.argument(
    "workspace",
    required=False,
    default=".",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
)
@click.option("--revoke", is_flag=True, help="Forget the record: the file only narrows again.")
@json_option
def trust(workspace: Path, revoke: bool, as_json: bool) -> None:
    """Trust WORKSPACE's lodger.toml as it is now (default: the current directory).

    The record (the file's path and the SHA-256 of its bytes) is kept in your config
    directory ($LODGER_CONFIG_DIR, else ~/.config/lodger), never in the workspace: a file
    a sandboxed command planted or changed is not trusted until you trust it again.

    \b
    Example:
      cat lodger.toml && lodger trust
      lodger trust ../other-project --revoke
    """
    store = TrustStore.default()
    path = workspace.resolve() / CONFIG_FILE
    if revoke:
        dropped = store.revoke(path)
        if as_json:
            echo_json({"path": str(path), "trusted": False, "revoked": dropped})
        else:
            click.echo(f"{'revoked' if dropped else 'was not trusted'}: {path}")
        return
    Project.load(workspace, trusted=True)  # a file with a bad key is refused, not trusted
    digest = store.trust(path)
    if as_json:
        echo_json({"path": str(path), "trusted": True, "sha256": digest})
    else:
        click.echo(f"trusted: {path} (sha256 {digest[:16]}); a change needs `lodger trust` again")


def untrusted_notice(project: Project) -> str | None:
    """One line saying what an untrusted file asked for and did not get, if anything."""
    if project.trusted or not project.ignored or project.workspace is None:
        return None
    where = project.workspace
    return (
        f"{where / CONFIG_FILE} is not trusted, so only what narrows applies; ignored: "
        f"{'; '.join(project.ignored)} (`lodger trust {where}` after reading it, or --trust)"
    )


COMMANDS = (trust,)

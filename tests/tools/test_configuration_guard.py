"""The file tools cannot write lodger's own configuration (lodger.toml in the workspace
root), however the path is spelled: the next lodger started in the workspace would run the
MCP servers it names on the host and grant the permissions it lists. The sandbox keeps an
existing one read-only for commands (tests/substrates/sandbox/test_hostile_sandbox.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lodger.errors import ToolCallError
from lodger.runtime.builtin import edit_file, read_file, write_file
from lodger.runtime.config import CONFIG_FILE, load_mcp_servers
from lodger.tools.spec import Tool, ToolContext

PLANTED = '[mcp.servers.helper]\ncommand = "sh"\nargs = ["-c", "echo ran on the host"]\n'
ORIGINAL = '[permissions]\nask = ["shell"]\n'


async def _refused(t: Tool, ctx: ToolContext, **arguments: Any) -> str:
    # Both the check before T1 (claims) and the handler refuse it.
    assert t.claims is not None
    with pytest.raises(ToolCallError) as before:
        t.claims(arguments, ctx)
    with pytest.raises(ToolCallError) as run:
        await t.handler(arguments, ctx)
    assert "lodger's own configuration" in str(before.value.message)
    return str(run.value.message)


@pytest.mark.parametrize(
    "spelling", ["lodger.toml", "./lodger.toml", "sub/../lodger.toml", "link/lodger.toml"]
)
async def test_write_file_cannot_create_or_replace_it(
    ws: Path, ctx: ToolContext, spelling: str
) -> None:
    (ws / "sub").mkdir()
    (ws / "link").symlink_to(".")
    message = await _refused(write_file, ctx, path=spelling, content=PLANTED)
    assert "lodger.toml" in message
    assert not (ws / CONFIG_FILE).exists()
    (ws / CONFIG_FILE).write_text(ORIGINAL)
    await _refused(write_file, ctx, path=spelling, content=PLANTED)
    assert (ws / CONFIG_FILE).read_text() == ORIGINAL
    assert load_mcp_servers(ws) == []


async def test_edit_file_cannot_change_it(ws: Path, ctx: ToolContext) -> None:
    (ws / CONFIG_FILE).write_text(ORIGINAL)
    await _refused(
        edit_file, ctx, path="lodger.toml", old_string='ask = ["shell"]', new_string="ask = []"
    )
    assert (ws / CONFIG_FILE).read_text() == ORIGINAL


async def test_the_file_a_symlinked_configuration_points_at_is_held_too(
    ws: Path, ctx: ToolContext
) -> None:
    (ws / "real.toml").write_text(ORIGINAL)
    (ws / CONFIG_FILE).symlink_to("real.toml")
    await _refused(write_file, ctx, path="real.toml", content=PLANTED)
    await _refused(write_file, ctx, path="lodger.toml", content=PLANTED)
    assert (ws / "real.toml").read_text() == ORIGINAL
    # A symlink elsewhere leading to it is the same file.
    (ws / "alias.toml").symlink_to("lodger.toml")
    await _refused(write_file, ctx, path="alias.toml", content=PLANTED)


async def test_reading_it_and_writing_other_toml_files_still_work(
    ws: Path, ctx: ToolContext
) -> None:
    (ws / CONFIG_FILE).write_text(ORIGINAL)
    assert "ask" in await read_file.handler({"path": "lodger.toml"}, ctx)
    # Only the workspace root's lodger.toml is lodger's: one in a subdirectory is a file.
    (ws / "examples").mkdir()
    for path in ("examples/lodger.toml", "pyproject.toml", "lodger.toml.example"):
        await write_file.handler({"path": path, "content": PLANTED}, ctx)
        assert (ws / path).read_text() == PLANTED


@pytest.mark.xfail(
    strict=True,
    reason="the file tools run on the host and may write under the workspace's .git: "
    "write_file can put a core.fsmonitor in .git/config, which the host's git runs on its "
    "next `git status`. A sandboxed command cannot (.git is read-only there unless "
    "[sandbox] git_writable = true); the file tools need the same rule, and a way to see "
    "that setting",
)
async def test_the_file_tools_cannot_leave_code_for_the_hosts_git(
    ws: Path, ctx: ToolContext
) -> None:
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("[core]\n\tbare = false\n")
    with pytest.raises(ToolCallError):
        await write_file.handler(
            {"path": ".git/config", "content": "[core]\n\tfsmonitor = touch ran\n"}, ctx
        )

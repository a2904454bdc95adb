"""The file tools cannot write lodger's own configuration (lodger.toml in the workspace
root), however the path is spelled: the next lodger started in the workspace would run the
MCP servers it names on the host and grant the permissions it lists. The sandbox keeps an
existing one read-only for commands (tests/substrates/sandbox/test_hostile_sandbox.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lodger.errors import ToolCallError
from lodger.runtime.builtin import edit_file, read_file, workspace_tools, write_file
from lodger.runtime.config import CONFIG_FILE, load_mcp_servers
from lodger.substrates.sandbox import SandboxPolicy
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


async def test_the_file_tools_cannot_leave_code_for_the_hosts_git(
    ws: Path, ctx: ToolContext
) -> None:
    """Broke: the file tools run on the host and wrote under the workspace's .git:
    write_file could put a core.fsmonitor in .git/config, which the host's git runs on
    its next `git status`. As in the sandbox, .git is read-only unless
    ``[sandbox] git_writable = true``, however the path is spelled."""
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (ws / "sub").mkdir()
    (ws / "sub" / ".git").write_text("gitdir: ../.git/modules/sub\n")
    (ws / "link").symlink_to(".git")
    planted = "[core]\n\tfsmonitor = touch ran\n"
    for path in (
        ".git/config",
        "./.git/hooks/pre-commit",
        "sub/../.git/config",
        "link/config",
        ".GIT/config",
        "sub/.git",
        ".git/modules/sub/config",
        "elsewhere/.git/config",  # a repository of the model's own, for the host to find
    ):
        message = await _refused_write(ctx, path, planted)
        assert "git repository's own directory" in message and "git_writable" in message
    await _refused_edit(ctx, ".git/config", "bare = false", "fsmonitor = touch ran")
    assert (ws / ".git" / "config").read_text() == "[core]\n\tbare = false\n"
    assert sorted(p.name for p in (ws / ".git").iterdir()) == ["config"]
    assert (ws / "sub" / ".git").read_text() == "gitdir: ../.git/modules/sub\n"
    assert not (ws / "elsewhere").exists()
    # Files that merely look like it are files.
    for path in (".gitignore", "git/config", "sub/.github/x", ".git.txt"):
        await write_file.handler({"path": path, "content": "x"}, ctx)
        assert (ws / path).read_text() == "x"


async def _refused_write(ctx: ToolContext, path: str, content: str) -> str:
    arguments = {"path": path, "content": content}
    assert write_file.claims is not None
    with pytest.raises(ToolCallError) as before:
        write_file.claims(arguments, ctx)
    with pytest.raises(ToolCallError) as run:
        await write_file.handler(arguments, ctx)
    assert before.value.message == run.value.message
    return f"{run.value.message} {run.value.hint}"


async def _refused_edit(ctx: ToolContext, path: str, old: str, new: str) -> None:
    arguments = {"path": path, "old_string": old, "new_string": new}
    assert edit_file.claims is not None
    with pytest.raises(ToolCallError):
        edit_file.claims(arguments, ctx)
    with pytest.raises(ToolCallError, match="git repository's own directory"):
        await edit_file.handler(arguments, ctx)


async def test_a_root_without_git_cannot_be_made_a_bare_repository(
    ws: Path, ctx: ToolContext
) -> None:
    """HEAD beside objects/ and refs/ makes the root a bare repository whose config the
    host's git reads; without a .git of its own, the root's HEAD is git's too."""
    for path in ("objects/info/x", "refs/heads/x", "config"):
        await write_file.handler({"path": path, "content": "x"}, ctx)
    message = await _refused_write(ctx, "HEAD", "ref: refs/heads/main\n")
    assert "git_writable" in message and not (ws / "HEAD").exists()
    (ws / ".git").mkdir()  # an empty one, as the sandbox's placeholder: still no repository
    await _refused_write(ctx, "HEAD", "ref: refs/heads/main\n")
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")  # git finds this one first
    await write_file.handler({"path": "HEAD", "content": "a file\n"}, ctx)
    assert (ws / "HEAD").read_text() == "a file\n"


async def test_a_linked_worktrees_git_directory_inside_the_workspace_is_held_too(
    ws: Path, ctx: ToolContext
) -> None:
    (ws / "gitdata").mkdir()
    (ws / ".git").write_text("gitdir: gitdata\n")
    await _refused_write(ctx, "gitdata/config", "[core]\n\tfsmonitor = touch ran\n")
    assert list((ws / "gitdata").iterdir()) == []


async def test_git_writable_lets_the_file_tools_write_it(ws: Path, ctx: ToolContext) -> None:
    """``[sandbox] git_writable = true``: the file tools may, as commands may."""
    (ws / ".git").mkdir()
    tools = {t.name: t for t in workspace_tools(sandbox=SandboxPolicy(git_writable=True))}
    arguments = {"path": ".git/info/exclude", "content": "build/\n"}
    claims = tools["write_file"].claims
    assert claims is not None
    claims(arguments, ctx)
    await tools["write_file"].handler(arguments, ctx)
    assert (ws / ".git" / "info" / "exclude").read_text() == "build/\n"
    await tools["edit_file"].handler(
        {"path": ".git/info/exclude", "old_string": "build", "new_string": "dist"}, ctx
    )
    assert (ws / ".git" / "info" / "exclude").read_text() == "dist/\n"
    # The default policy keeps it read-only.
    default = {t.name: t for t in workspace_tools(sandbox=SandboxPolicy())}
    with pytest.raises(ToolCallError, match="git_writable"):
        await default["write_file"].handler(arguments, ctx)

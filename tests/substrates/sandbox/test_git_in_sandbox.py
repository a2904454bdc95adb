"""The workspace's .git inside a sandbox: read-only by default, whatever shape it has
(a directory, a gitdir file, none at all), and writable only when the policy says so.

The attacks on a repository's own .git (hooks, core.fsmonitor, core.pager...) are in
test_hostile_sandbox.py; these are the other shapes, and what still works.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hostgit import host_git, make_repository, tree

from lodger.errors import ConfigError
from lodger.substrates.sandbox import BubblewrapSandbox, Limits, Sandbox
from lodger.substrates.sandbox._git import protected_git

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
LIMITS = Limits(wall_time_s=60)
AS_AUTHOR = "git -c user.name=m -c user.email=m@example.com"


def _absent(path: Path) -> bool:
    return not os.path.lexists(path)


async def _run(box: Sandbox, ws: Path, command: str, *, git_writable: bool = False) -> str:
    result = await box.run(
        ["bash", "-c", command], workspace=ws, env=ENV, limits=LIMITS, git_writable=git_writable
    )
    return result.output.decode(errors="replace") + f"[exit {result.exit_code}]"


async def test_git_reads_the_repository_in_the_sandbox(box: Sandbox, tmp_path: Path) -> None:
    ws = make_repository(tmp_path / "ws")
    before = tree(ws / ".git")
    out = await _run(
        box,
        ws,
        "git status --short && git log --oneline && git diff && git blame a.txt | head -1"
        " && git show --stat HEAD | tail -1",
    )
    assert out.endswith("[exit 0]"), out
    assert " M a.txt\n" in out and "the first commit" in out and "+two" in out
    assert "1 file changed" in out
    # And what would write it fails, saying why, with the repository as it was.
    out = await _run(box, ws, f"{AS_AUTHOR} commit -qam change")
    assert "Read-only file system" in out and not out.endswith("[exit 0]"), out
    assert tree(ws / ".git") == before


async def test_git_writable_lets_a_command_commit(box: Sandbox, tmp_path: Path) -> None:
    """``[sandbox] git_writable = true``: what every command could do before."""
    ws = make_repository(tmp_path / "ws")
    out = await _run(
        box, ws, f"{AS_AUTHOR} commit -qam change && git config lodger.test yes", git_writable=True
    )
    assert out.endswith("[exit 0]"), out
    assert host_git("log", "--format=%s", "-1", cwd=ws).stdout == "change\n"
    assert host_git("config", "lodger.test", cwd=ws).stdout == "yes\n"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    out = await _run(box, fresh, "git init -q . && echo made", git_writable=True)
    assert "made" in out and (fresh / ".git" / "HEAD").is_file()


async def test_a_command_cannot_make_a_repository_where_there_is_none(
    box: Sandbox, tmp_path: Path
) -> None:
    """A fresh ``git init`` would be the command's repository, hooks and config and all,
    which the host's git would trust the next time someone commits there. An empty
    read-only placeholder holds the name for the run, and is gone after it."""
    ws = tmp_path / "ws"
    ws.mkdir()
    attempts = [
        "git init -q .",
        "git init -q --separate-git-dir=elsewhere .",
        "printf 'gitdir: elsewhere\\n' > .git",
        "mkdir .git/hooks",
        "rmdir .git && mkdir .git",
        "mv .git old",
        "ln -s elsewhere .git",
    ]
    for attempt in attempts:
        out = await _run(box, ws, f"{attempt} && echo MADE")
        assert "MADE" not in out, (attempt, out)
        assert _absent(ws / ".git"), attempt
    assert list(ws.iterdir()) == []
    out = await _run(box, ws, "ls -A; git status")
    assert out.startswith(".git\n") and "not a git repository" in out, out


async def test_an_empty_git_left_by_a_killed_run_is_held_and_removed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)  # what a run killed with lodger leaves
    out = await _run(BubblewrapSandbox(), ws, "git init -q . && echo MADE")
    assert "MADE" not in out
    assert _absent(ws / ".git")


async def _started(flag: Path) -> None:
    for _ in range(1200):
        if not _absent(flag):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{flag} never appeared")


async def test_the_placeholder_stays_while_another_run_holds_it(tmp_path: Path) -> None:
    """Two commands at once in a workspace without .git: the one that ends first must
    not remove the placeholder from under the other (which could then make a .git)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    box = BubblewrapSandbox()
    first = asyncio.create_task(
        _run(
            box,
            ws,
            "touch started; while [ ! -e go ]; do sleep 0.05; done;"
            " git init -q . && echo MADE; rm -f started go",
        )
    )
    try:
        await _started(ws / "started")
        second = await _run(box, ws, "git init -q . && echo MADE")
        assert "MADE" not in second
        assert (ws / ".git").is_dir(), "the second run removed the first one's placeholder"
        (ws / "go").touch()
        assert "MADE" not in await first
    finally:
        (ws / "go").touch()
        await asyncio.wait({first})
    assert _absent(ws / ".git")


async def test_a_cancelled_run_removes_its_placeholder(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    running = asyncio.create_task(_run(BubblewrapSandbox(), ws, "touch started; exec sleep 600"))
    await _started(ws / "started")
    assert (ws / ".git").is_dir()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert _absent(ws / ".git")


async def test_a_gitfile_cannot_be_pointed_elsewhere(box: Sandbox, tmp_path: Path) -> None:
    """A linked worktree (as a submodule checked out alone): .git is a file naming a git
    directory outside the workspace, which is not mounted at all. The file is read-only,
    so no command can point it at a repository of its own."""
    main = make_repository(tmp_path / "main")
    ws = tmp_path / "ws"
    host_git("worktree", "add", "-q", str(ws), cwd=main, check=True)
    gitfile = (ws / ".git").read_text()
    assert gitfile.startswith("gitdir: ")
    marker = tmp_path / "ran-on-the-host"
    plant = f"git init -q --bare planted && git -C planted config core.fsmonitor 'touch {marker}'"
    attempts = [
        f"{plant} && printf 'gitdir: planted\\n' > .git",
        f"{plant} && rm -f .git && printf 'gitdir: planted\\n' > .git",
        "mv .git old",
        "rm -f .git && git init -q .",
    ]
    for attempt in attempts:
        out = await _run(box, ws, f"{attempt} && echo CHANGED")
        assert "CHANGED" not in out, (attempt, out)
        assert (ws / ".git").read_text() == gitfile, attempt
    out = await _run(box, ws, "git status")
    assert "not a git repository" in out, out  # its git directory is not in the sandbox
    # The host's git still uses the worktree's own directory: the plant is just a folder.
    assert host_git("status", "--short", cwd=ws).stdout == "?? planted/\n"
    assert not marker.exists()


async def test_a_gitdir_inside_the_workspace_is_read_only_and_pinned(
    box: Sandbox, tmp_path: Path
) -> None:
    """.git names a git directory inside the workspace (``git init --separate-git-dir``):
    that directory is read-only too, and the directories on the way to it cannot be
    renamed to make room for another one."""
    ws = tmp_path / "ws"
    (ws / "meta").mkdir(parents=True)
    make_repository(ws, f"--separate-git-dir={ws / 'meta' / 'repo'}")
    assert (ws / ".git").is_file()
    marker = tmp_path / "ran-on-the-host"
    before = tree(ws / "meta" / "repo")
    attempts = [
        f"git config core.fsmonitor 'touch {marker}'",
        "touch meta/repo/hooks/pre-commit",
        "mv meta/repo meta/old",
        "rm -rf meta/repo",
        f"mv meta old && git init -q --bare meta/repo && git -C meta/repo config"
        f" core.fsmonitor 'touch {marker}'",
    ]
    for attempt in attempts:
        out = await _run(box, ws, f"{attempt} && echo CHANGED")
        assert "CHANGED" not in out, (attempt, out)
        assert tree(ws / "meta" / "repo") == before, attempt
    assert sorted(p.name for p in ws.iterdir()) == [".git", "a.txt", "meta"]
    out = await _run(box, ws, "git status --short")
    assert out == " M a.txt\n?? meta/\n[exit 0]", out  # git inside reads it where it is
    assert host_git("status", "--short", cwd=ws).stdout == " M a.txt\n?? meta/\n"
    assert not marker.exists()


def test_a_git_no_mount_can_hold_in_place_is_refused(tmp_path: Path) -> None:
    """What a command could swap for a repository of its own is refused before it runs:
    a symlinked .git, a gitdir file leading through a symlink in the workspace, or
    naming a directory there that does not exist (or the workspace itself)."""
    outside = make_repository(tmp_path / "outside")
    ws = tmp_path / "ws"
    ws.mkdir()
    git = ws / ".git"
    git.symlink_to(outside / ".git")
    with pytest.raises(ConfigError, match="is a symlink"):
        protected_git(ws)
    git.unlink()
    (ws / "link").symlink_to(outside)
    git.write_text("gitdir: link/.git\n")
    with pytest.raises(ConfigError, match="a symlink inside the workspace"):
        protected_git(ws)
    git.write_text(f"gitdir: {ws / 'missing'}\n")
    with pytest.raises(ConfigError, match="not a directory"):
        protected_git(ws)
    git.write_text("gitdir: .\n")
    with pytest.raises(ConfigError, match="the workspace itself"):
        protected_git(ws)
    git.unlink()
    os.mkfifo(git)
    with pytest.raises(ConfigError, match="not a directory or a file"):
        protected_git(ws)
    git.unlink()
    # A symlink outside the workspace is the host's own: followed, not mounted.
    (tmp_path / "away").symlink_to(outside)
    git.write_text(f"gitdir: {tmp_path / 'away' / '.git'}\n")
    protection = protected_git(ws)
    assert protection.read_only == (str(git),) and protection.inner == ()


async def test_a_refused_git_runs_nothing_unless_it_may_be_written(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".git").symlink_to(tmp_path)
    box = BubblewrapSandbox()
    with pytest.raises(ConfigError, match="git_writable = true"):
        await _run(box, ws, "touch ran")
    assert not (ws / "ran").exists()
    assert (await _run(box, ws, "touch ran", git_writable=True)).endswith("[exit 0]")
    assert (ws / "ran").exists()


async def test_a_command_cannot_plant_a_repository_in_a_submodule(tmp_path: Path) -> None:
    module = make_repository(tmp_path / "module")
    host_git("commit", "-qam", "change", cwd=module, check=True)
    ws = make_repository(tmp_path / "ws")
    add = ("-c", "protocol.file.allow=always", "submodule", "add", "-q", str(module), "sub")
    host_git(*add, cwd=ws, check=True)
    host_git("commit", "-qm", "with a submodule", cwd=ws, check=True)
    marker = tmp_path / "ran-on-the-host"
    await _run(
        BubblewrapSandbox(),
        ws,
        f"rm sub/.git && git init -q sub && git -C sub config core.fsmonitor 'touch {marker}'",
    )
    host_git("status", cwd=ws)
    assert not marker.exists()


async def test_a_command_cannot_make_the_workspace_a_bare_repository(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    await _run(BubblewrapSandbox(), ws, "git init -q --bare . && git config -f config a.b c")
    assert host_git("config", "a.b", cwd=ws).stdout == ""

"""Beyond the root's own .git: submodules (checked out or not, nested) and a workspace
that a command could turn into a bare repository. Real git on the host (``host_git``,
with none of this machine's config), real sandboxes on both backends."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hostgit import host_git, make_repository

from lodger.errors import ConfigError
from lodger.substrates.sandbox import BubblewrapSandbox, Limits, Sandbox
from lodger.substrates.sandbox._git import _gitlinks, placeholders, protected_git

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
ADD = ("-c", "protocol.file.allow=always", "submodule", "add", "-q")


async def _run(box: Sandbox, ws: Path, command: str) -> str:
    result = await box.run(
        ["bash", "-c", command], workspace=ws, env=ENV, limits=Limits(wall_time_s=60)
    )
    return result.output.decode(errors="replace") + f"[exit {result.exit_code}]"


def _with_submodules(tmp_path: Path, *paths: str) -> Path:
    """A workspace whose repository has a submodule at each of ``paths``."""
    module = make_repository(tmp_path / "module")
    host_git("commit", "-qam", "change", cwd=module, check=True)
    ws = make_repository(tmp_path / "ws")
    for path in paths:
        host_git(*ADD, str(module), path, cwd=ws, check=True)
    host_git("commit", "-qm", "with submodules", cwd=ws, check=True)
    return ws


def _entries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".git" not in p.parts)


async def test_a_submodule_not_checked_out_cannot_be_given_a_repository(
    box: Sandbox, tmp_path: Path
) -> None:
    """A gitlink whose directory is empty (not initialised), missing, or under a missing
    directory: a placeholder stands where its path first goes missing, read-only, for
    the run, and is gone after it."""
    ws = _with_submodules(tmp_path, "empty", "gone", "libs/deep")
    for path in ("empty", "gone", "libs/deep"):
        (ws / path / ".git").unlink()
        shutil.rmtree(ws / ".git" / "modules" / path)
    shutil.rmtree(ws / "gone")
    shutil.rmtree(ws / "libs")
    assert sorted(placeholders(ws)) == [ws / "empty" / ".git", ws / "gone", ws / "libs"]
    before = _entries(ws)
    marker = tmp_path / "ran-on-the-host"
    for path in ("empty", "gone", "libs/deep"):
        out = await _run(
            box,
            ws,
            f"mkdir -p {path}; git init -q {path} && git -C {path} config core.fsmonitor"
            f" 'touch {marker}' && echo PLANTED",
        )
        assert "PLANTED" not in out, (path, out)
    host_git("status", cwd=ws)
    assert not marker.exists()
    assert _entries(ws) == before  # every placeholder removed
    assert not (ws / "empty" / ".git").exists()


async def test_a_nested_submodules_git_is_held_too(tmp_path: Path) -> None:
    """The gitlinks of a submodule's own index: the host's `git status` recurses into
    them as well."""
    inner = make_repository(tmp_path / "inner")
    host_git("commit", "-qam", "change", cwd=inner, check=True)
    outer = make_repository(tmp_path / "outer")
    host_git(*ADD, str(inner), "inner", cwd=outer, check=True)
    host_git("commit", "-qm", "nested", cwd=outer, check=True)
    ws = make_repository(tmp_path / "ws")
    host_git(*ADD, str(outer), "outer", cwd=ws, check=True)
    update = ("-c", "protocol.file.allow=always", "submodule", "update", "--init", "-q")
    host_git(*update, "--recursive", cwd=ws, check=True)
    host_git("commit", "-qm", "with a nested submodule", cwd=ws, check=True)
    assert (ws / "outer" / "inner" / ".git").is_file()
    protection = protected_git(ws)
    assert str(ws / "outer" / "inner" / ".git") in protection.read_only
    marker = tmp_path / "ran-on-the-host"
    out = await _run(
        BubblewrapSandbox(),
        ws,
        f"rm -f outer/inner/.git; git init -q outer/inner && git -C outer/inner config"
        f" core.fsmonitor 'touch {marker}' && echo PLANTED",
    )
    assert "PLANTED" not in out, out
    host_git("status", "--recurse-submodules", cwd=ws)
    assert not marker.exists()


async def test_git_still_reads_a_repository_with_submodules(tmp_path: Path) -> None:
    ws = _with_submodules(tmp_path, "sub")
    (ws / "sub" / "a.txt").write_text("changed in the submodule\n")
    out = await _run(BubblewrapSandbox(), ws, "git status --short && git -C sub log --oneline")
    assert out.endswith("[exit 0]"), out
    assert " M a.txt" in out and " m sub" in out and "the first commit" in out


@pytest.mark.parametrize("version", ["2", "3", "4"])
def test_the_gitlinks_read_from_the_index_are_gits_own(tmp_path: Path, version: str) -> None:
    """The index is read here, not by running git in the workspace (whose config a
    command may have shaped): each index version gives what `git ls-files` does."""
    ws = _with_submodules(tmp_path, "sub", "a/b/c", "a/b/d-with-a-longer-name")
    for n in range(40):  # names sharing prefixes, for version 4's compression
        (ws / "a" / f"file-{n:03}.txt").write_text(str(n))
    host_git("add", "-A", cwd=ws, check=True)
    host_git("update-index", f"--index-version={version}", cwd=ws, check=True)
    if version == "3":  # an entry with extended flags (intent-to-add)
        (ws / "new.txt").write_text("new\n")
        host_git("add", "-N", "new.txt", cwd=ws, check=True)
    listed = host_git("ls-files", "--stage", cwd=ws, check=True).stdout.splitlines()
    expected = [line.split("\t", 1)[1] for line in listed if line.startswith("160000 ")]
    assert (
        sorted(_gitlinks(ws / ".git"))
        == sorted(expected)
        == [
            "a/b/c",
            "a/b/d-with-a-longer-name",
            "sub",
        ]
    )


def test_a_submodule_path_through_a_symlink_is_refused(tmp_path: Path) -> None:
    ws = _with_submodules(tmp_path, "libs/sub")
    shutil.rmtree(ws / "libs")
    (ws / "libs").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match="symlink"):
        protected_git(ws)


async def test_a_command_cannot_write_a_bare_repository_by_hand(
    box: Sandbox, tmp_path: Path
) -> None:
    """The files git needs at the root to read it as bare: HEAD cannot be made (a
    read-only placeholder stands there for the run), and the rest is only files."""
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await _run(
        box,
        ws,
        "mkdir -p objects refs/heads && printf '[core]\\n\\tbare = true\\n[a]\\n\\tb = c\\n'"
        " > config; printf 'ref: refs/heads/main\\n' > HEAD && echo MADE-HEAD; ls -A",
    )
    assert "MADE-HEAD" not in out and "HEAD" in out, out
    assert sorted(p.name for p in ws.iterdir()) == ["config", "objects", "refs"]
    assert host_git("config", "a.b", cwd=ws).stdout == ""
    assert "not a git repository" in host_git("status", cwd=ws).stderr


async def test_a_file_named_head_at_a_root_without_git_is_held(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "HEAD").write_text("notes\n")
    out = await _run(
        BubblewrapSandbox(),
        ws,
        "cat HEAD; printf 'ref: refs/heads/main\\n' > HEAD && echo CHANGED; rm HEAD && echo GONE",
    )
    assert out.startswith("notes\n") and "CHANGED" not in out and "GONE" not in out, out
    assert (ws / "HEAD").read_text() == "notes\n"
    os.remove(ws / "HEAD")
    (ws / "HEAD").symlink_to("refs/heads/main")
    with pytest.raises(ConfigError, match="HEAD"):
        await _run(BubblewrapSandbox(), ws, "true")
    # With a repository of its own at the root, HEAD there is a file like any other.
    os.remove(ws / "HEAD")
    make_repository(ws)
    (ws / "HEAD").write_text("notes\n")
    out = await _run(BubblewrapSandbox(), ws, "echo edited > HEAD && echo CHANGED")
    assert "CHANGED" in out and (ws / "HEAD").read_text() == "edited\n"

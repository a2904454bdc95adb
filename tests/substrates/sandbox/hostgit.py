"""The host's git, as a person looking at the project after the agent: what the tests
of a read-only ``.git`` run outside the sandbox, with none of this machine's config."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

ENV = {
    "PATH": os.environ.get("PATH", os.defpath),
    "HOME": "/nonexistent",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


def host_git(*args: str, cwd: Path, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``git ARGS`` on the host in ``cwd``."""
    return subprocess.run(
        ["git", *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=30, check=check
    )


def make_repository(ws: Path, *args: str) -> Path:
    """``ws`` as a repository (``git init ARGS``): one commit of ``a.txt``, then a change."""
    ws.mkdir(parents=True, exist_ok=True)
    host_git("init", "-q", "-b", "main", *args, str(ws), cwd=ws.parent, check=True)
    (ws / "a.txt").write_text("one\n")
    host_git("add", "a.txt", cwd=ws, check=True)
    host_git("commit", "-qm", "the first commit", cwd=ws, check=True)
    (ws / "a.txt").write_text("one\ntwo\n")
    return ws


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every entry under ``root`` (``root`` itself included): its mode and its bytes (a
    symlink's target), to show that nothing there changed."""
    found: dict[str, tuple[int, bytes]] = {}
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        if stat.S_ISREG(st.st_mode):
            body = path.read_bytes()
        elif stat.S_ISLNK(st.st_mode):
            body = os.readlink(path).encode()
        else:
            body = b""
        found[str(path.relative_to(root))] = (st.st_mode, body)
    return found

"""SIGKILL during a rewind's restore: a real child process rewinds a real session and is
killed at every blob read (planning, then each file put back), after each append (the
branch left behind's snapshot, the new branch), and at random moments. Whatever the
point, every log verifies, and once the session is opened again (as every door does) its
workspace is exactly one branch's: the old one (killed before the rewind's intent was
recorded) or the new one, and the session's name leads to that branch."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lodger.storage import Storage

CHILD = Path(__file__).with_name("rewind_child.py")
pytestmark = pytest.mark.slow

OLD = {
    **{f"f{i}.txt": f"f{i}.txt v2\n" for i in range(6)},
    "new/n0.txt": "new/n0.txt v2\n",
    "n1.txt": "n1.txt v2\n",
}
NEW = {f"f{i}.txt": f"f{i}.txt v1\n" for i in range(6)}


def child(ws: Path, phase: str, kill: str = "none") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, str(CHILD), str(ws), phase, kill],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def files(ws: Path) -> dict[str, str]:
    return {
        p.relative_to(ws).as_posix(): p.read_text()
        for p in sorted(ws.rglob("*"))
        if p.is_file() and ".lodger" not in p.relative_to(ws).parts
    }


async def verify_all(state: Path) -> list[str]:
    storage = Storage.local(state)
    try:
        sessions = await storage.log.list_sessions()
        for sid in sessions:
            await storage.log.verify(sid)  # raises on any broken chain or lost tail
        return sessions
    finally:
        await storage.close()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """A workspace after two turns (kept aside as a pristine copy) and how many blobs
    an uninterrupted rewind reads."""
    root = tmp_path_factory.mktemp("rewind-crash")
    ws, pristine = root / "ws", root / "pristine"
    ws.mkdir()
    made = child(ws, "setup")
    assert made.returncode == 0, made.stderr
    assert files(ws) == OLD
    shutil.copytree(ws, pristine, symlinks=True)
    done = child(ws, "rewind")
    assert done.returncode == 0, done.stderr
    assert files(ws) == NEW
    return ws, pristine, int(json.loads(done.stdout)["gets"])


def reset(ws: Path, pristine: Path) -> None:
    shutil.rmtree(ws)
    shutil.copytree(pristine, ws, symlinks=True)  # the same path: the log names it


def check_after(ws: Path, killed: subprocess.CompletedProcess[str]) -> str:
    """Reopen, and check the logs and the workspace; the branch the session is on."""
    sessions = asyncio.run(verify_all(ws / ".lodger"))
    opened = child(ws, "open")
    assert opened.returncode == 0, opened.stderr
    branch = json.loads(opened.stdout)["branch"]
    expected = {"s": OLD, "s..r1": NEW}[branch]
    assert files(ws) == expected, (killed.returncode, branch)
    assert not list(ws.rglob("*.lodger-rewind")), "a staged file was left behind"
    assert not (ws / ".lodger" / "rewinds" / "s.json").exists()
    assert set(asyncio.run(verify_all(ws / ".lodger"))) >= set(sessions)
    return branch


def test_sigkill_at_every_blob_read_and_append_of_a_rewind(
    prepared: tuple[Path, Path, int],
) -> None:
    ws, pristine, gets = prepared
    landed: dict[str, str] = {}
    points = [f"get:{n}" for n in range(1, gets + 1)] + ["append:1", "append:2"]
    for point in points:
        reset(ws, pristine)
        killed = child(ws, "rewind", point)
        assert killed.returncode == -9, (point, killed.returncode, killed.stderr)
        landed[point] = check_after(ws, killed)
    # the early kills leave the old branch, the late ones finish the new one
    assert landed["get:1"] == "s"
    assert landed[f"get:{gets}"] == "s..r1"
    assert landed["append:1"] == "s"  # the snapshot of the branch left: no intent yet
    assert landed["append:2"] == "s..r1"
    assert "s" in landed.values() and "s..r1" in landed.values()


def test_sigkill_at_random_moments_of_a_rewind(prepared: tuple[Path, Path, int]) -> None:
    ws, pristine, _ = prepared
    rng = random.Random(32)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for _ in range(4):
        reset(ws, pristine)
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(ws), "rewind", "none"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            proc.wait(timeout=rng.uniform(0.3, 1.5))
        except subprocess.TimeoutExpired:
            proc.kill()
        out, err = proc.communicate()
        check_after(ws, subprocess.CompletedProcess(proc.args, proc.returncode, out, err))

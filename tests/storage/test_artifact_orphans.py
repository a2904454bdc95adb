"""A write to the file artifact store killed between its temporary file and the rename
leaves an orphan ``.lodger-*.tmp``: nothing reads it, and the next store removes it, but
never a temporary file a live writer still holds."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lodger.storage import FileArtifactStore

# Stores one artifact and is SIGKILLed right before the rename (after the fsync), the
# widest window a crash can hit.
KILLED_PUT = """
import asyncio, os, signal, sys
from lodger.storage import FileArtifactStore

def crash(*args):
    os.kill(os.getpid(), signal.SIGKILL)

os.replace = crash
asyncio.run(FileArtifactStore(sys.argv[1]).put(b"half-stored payload"))
"""


def make_old(path: Path) -> None:
    old = time.time() - 60
    os.utime(path, (old, old))


async def test_orphan_of_a_killed_put_is_swept_and_never_read(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", KILLED_PUT, str(root)],
        capture_output=True,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    (orphan,) = root.glob("*/.lodger-*.tmp")
    assert orphan.read_bytes() == b"half-stored payload"
    make_old(orphan)

    # a temporary file that a live writer holds is left alone, however old it is
    live = orphan.parent / ".lodger-live.tmp"
    live.write_bytes(b"in flight")
    make_old(live)
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        store = FileArtifactStore(root)
        ref = await store.put(b"next run")
        assert await store.get(ref.sha256) == b"next run"
        assert not orphan.exists()
        assert live.exists()
    finally:
        os.close(fd)
    # the killed payload was never stored under its hash: a put stores it whole
    again = await FileArtifactStore(root).put(b"half-stored payload")
    assert await FileArtifactStore(root).get(again.sha256) == b"half-stored payload"


def test_fresh_unlocked_temporary_file_is_not_swept(tmp_path: Path) -> None:
    # between mkstemp and flock a writer's file is briefly unlocked: only old ones go
    root = tmp_path / "artifacts"
    (root / "ab").mkdir(parents=True)
    fresh = root / "ab" / ".lodger-fresh.tmp"
    fresh.write_bytes(b"just created")
    old = root / "ab" / ".lodger-old.tmp"
    old.write_bytes(b"left behind")
    make_old(old)
    assert FileArtifactStore(root).sweep_orphans() == [old]
    assert fresh.exists()

"""The workspace's watcher outlives one command (``lodger.substrates.sandbox._sizes``):
walked once, kept up to date between commands, so a command's disk count starts from
what the workspace holds when it starts, at a cost independent of the workspace's size."""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path

from lodger import Agent, TestModel
from lodger.storage import Storage
from lodger.substrates.sandbox import BubblewrapSandbox, Limits, _sizes
from lodger.substrates.sandbox._disk import DiskWatch, warm
from lodger.substrates.shell import shell_tool

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
MiB = 1 << 20
LIMIT = 32 * MiB


def _prepared(root: Path) -> tuple[DiskWatch, float]:
    watch = DiskWatch(root, limit=LIMIT, private_tmp=False)
    started = time.perf_counter()
    watch.prepare()
    return watch, time.perf_counter() - started


def _tree(root: Path, dirs: int, files: int) -> None:
    """``dirs`` directories of ``files`` files each, all hard links of one (made faster)."""
    one = root / "one"
    one.write_bytes(b"x")
    for d in range(dirs):
        here = root / f"d{d}"
        here.mkdir()
        for f in range(files):
            os.link(one, here / f"f{f}")


def test_a_second_command_prepares_without_walking_the_workspace(tmp_path: Path) -> None:
    """20,000 files in 200 directories: the first command waits for the walk; the second
    starts from the map the watcher kept, at least 20 times faster (a ratio: robust to
    load; measured about 0.1 ms against 300 ms), and still counts what it writes."""
    _tree(tmp_path, 200, 100)
    (tmp_path / "d9" / "own").write_bytes(b"o")
    first, first_s = _prepared(tmp_path)
    first.close()
    second, second_s = _prepared(tmp_path)
    try:
        assert second_s < first_s / 20, (first_s, second_s)
        (tmp_path / "d7" / "new").write_bytes(b"n" * MiB)
        (tmp_path / "d9" / "own").write_bytes(b"y" * (2 * MiB))  # 1 byte before
        second.look()
        assert second.written == 3 * MiB - 1
    finally:
        second.close()


def test_a_host_change_between_two_commands_is_not_counted(tmp_path: Path) -> None:
    """The host grows a file past the limit between two commands; its events are still
    queued when the second command prepares (the watcher's thread is held off): they are
    read into the baseline first, so only what the command itself writes counts."""
    (tmp_path / "data").write_bytes(b"d" * MiB)
    first, _ = _prepared(tmp_path)
    first.close()
    sizes = _sizes.sizes_of(str(tmp_path.resolve()), frozenset())
    with sizes.lock:  # the watcher's thread cannot read the events meanwhile
        with open(tmp_path / "data", "ab") as grown:
            grown.write(b"h" * (LIMIT + MiB))
        second, _ = _prepared(tmp_path)
    try:
        with open(tmp_path / "data", "ab") as more:
            more.write(b"c" * MiB)
        second.look()
        assert (second.written, second.over) == (MiB, False)
    finally:
        second.close()


def test_a_file_the_host_removed_counts_whole_when_written_again(tmp_path: Path) -> None:
    """What the host deleted or moved away between commands is gone from the map: a
    command that writes it again is counted for all of it, not for its growth over the
    size it had before the host removed it."""
    (tmp_path / "old").write_bytes(b"o" * (20 * MiB))
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "inner").write_bytes(b"i" * (20 * MiB))
    first, _ = _prepared(tmp_path)
    first.close()
    (tmp_path / "old").unlink()
    (tmp_path / "dir").rename(tmp_path.parent / f"{tmp_path.name}-away")
    second, _ = _prepared(tmp_path)
    try:
        (tmp_path / "old").write_bytes(b"n" * (20 * MiB))
        (tmp_path / "dir").mkdir()
        (tmp_path / "dir" / "inner").write_bytes(b"n" * (20 * MiB))
        second.look()
        assert second.written == 40 * MiB and second.over
    finally:
        second.close()


def test_events_lost_in_an_overflow_are_caught_up_by_a_walk(tmp_path: Path) -> None:
    """More events than inotify queues (16,384 by default) while the watcher's thread is
    held off: the queue overflows and the file written meanwhile is found by a walk."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    watch, _ = _prepared(tmp_path)
    sizes = watch._sizes
    assert sizes is not None
    try:
        with sizes.lock:
            fds = [os.open(tmp_path / name, os.O_WRONLY | os.O_CREAT) for name in ("a", "b")]
            try:
                for i in range(limit // 2 + 10):  # alternating: not merged into one
                    for fd in fds:
                        os.pwrite(fd, b"x", i)
            finally:
                for fd in fds:
                    os.close(fd)
            (tmp_path / "big").write_bytes(b"b" * LIMIT)
        watch.look()
        assert watch.over and watch.written >= LIMIT
    finally:
        watch.close()


def test_watchers_are_bounded_and_the_least_recently_used_closes(tmp_path: Path) -> None:
    """At most ``KEPT`` workspaces are watched in one process: the least recently used
    one that no command uses is closed (its watches and descriptor released)."""
    roots = [tmp_path / f"w{i}" for i in range(_sizes.KEPT + 2)]
    watchers = []
    for root in roots:
        root.mkdir()
        watch, _ = _prepared(root)
        watchers.append(watch._sizes)
        watch.close()
    known = {s.root for s in _sizes._KNOWN.values()}
    assert str(roots[0]) not in known and str(roots[1]) not in known
    assert str(roots[-1]) in known and len(_sizes._KNOWN) <= _sizes.KEPT
    first = watchers[0]
    assert first is not None and first._fd == -1  # closed
    # a command there again gets a new watcher, which counts as it should
    again, _ = _prepared(roots[0])
    try:
        assert again._sizes is not first
        (roots[0] / "f").write_bytes(b"f" * MiB)
        again.look()
        assert again.written == MiB
    finally:
        again.close()


async def test_commands_in_a_sandbox_count_from_the_workspace_as_it_is(tmp_path: Path) -> None:
    """End to end, in bubblewrap: the workspace is watched before the first command
    (``warm``); the host writes more than the limit between two commands, which is no
    obstacle to the second; a third that writes more than the limit is still stopped."""
    limits = Limits(wall_time_s=60, memory_bytes=256 * MiB, output_bytes=MiB, disk_bytes=LIMIT)
    box = BubblewrapSandbox()
    warm(tmp_path)
    first = await box.run(["true"], workspace=tmp_path, env=ENV, limits=limits)
    assert first.ok, first
    (tmp_path / "host.bin").write_bytes(b"h" * (LIMIT + MiB))
    second = await box.run(
        ["bash", "-c", "head -c 1M /dev/zero >> host.bin && echo fine"],
        workspace=tmp_path,
        env=ENV,
        limits=limits,
    )
    assert second.ok and second.limit is None and second.output == b"fine\n", second
    third = await box.run(
        ["bash", "-c", "for i in $(seq 64); do head -c 1M /dev/zero > f$i; done; echo all"],
        workspace=tmp_path,
        env=ENV,
        limits=limits,
    )
    assert third.limit == "disk" and b"all" not in third.output, third


async def test_an_agent_with_a_shell_watches_its_workspace_from_the_first_command(
    tmp_path: Path,
) -> None:
    """Building an agent, even with a sandboxed tool, starts no watcher (a worker builds
    one per wake, in a fresh workspace, most of them running no command): the first
    command's count starts it (its walk), and the next command's count uses that one."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "old.bin").write_bytes(b"o" * 4096)
    storage = Storage.local(workspace / ".lodger")
    key = (str(workspace.resolve()), frozenset(str(p.resolve()) for p in storage.hidden_paths()))
    threads = {t.name for t in threading.enumerate()}
    try:
        Agent(model=TestModel(), storage=storage, workspace=workspace, tools=[shell_tool()])
        assert key not in _sizes._KNOWN
        assert "lodger-disk-sizes" not in {t.name for t in threading.enumerate()} - threads
        first = DiskWatch(workspace, limit=LIMIT, exclude=storage.hidden_paths())
        first.prepare()
        watcher = _sizes._KNOWN[key]
        assert first._sizes is watcher and watcher.sizes == {
            str(workspace.resolve() / "old.bin"): 4096
        }
        first.close()
        second = DiskWatch(workspace, limit=LIMIT, exclude=storage.hidden_paths())
        second.prepare()
        second.close()
        assert second._sizes is watcher
    finally:
        await storage.close()


def test_a_count_dropped_unclosed_does_not_keep_the_watcher_busy(tmp_path: Path) -> None:
    """A command's count whose caller never closed it (its task failed between
    ``prepare`` and the run) is not told of changes for ever: the watcher holds it
    weakly, so it can still be closed when idle or pushed out."""
    watch, _ = _prepared(tmp_path)
    sizes = watch._sizes
    assert sizes is not None and sizes.busy()
    del watch
    gc.collect()
    assert not sizes.busy()

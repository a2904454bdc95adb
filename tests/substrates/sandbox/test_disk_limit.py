"""The disk limit (``[sandbox] disk_mb``, ``Limits.disk_bytes``): what one command writes
into the workspace and its private /tmp is bounded, a command past it is stopped and its
result names the limit, within 10% of it (``lodger.substrates.sandbox._disk``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lodger.runtime.project import Project
from lodger.substrates.sandbox import BubblewrapSandbox, Limits, Sandbox, SandboxPolicy
from lodger.substrates.sandbox._disk import DiskWatch
from lodger.substrates.sandbox.policy import policy_from_config
from lodger.substrates.shell import shell_tool
from lodger.tools.spec import ToolContext, ToolOutput

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
MiB = 1 << 20
LIMIT = 32 * MiB
#: what a stopped command may have written: the limit and 10%
BOUND = LIMIT * 11 // 10


def _limits() -> Limits:
    return Limits(wall_time_s=60, memory_bytes=256 * MiB, output_bytes=1 * MiB, disk_bytes=LIMIT)


def _written(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


async def test_one_fast_writer_is_stopped_at_the_limit(box: Sandbox, tmp_path: Path) -> None:
    """96 MiB from /dev/zero at GB/s: RLIMIT_FSIZE stops the file at the limit, and the
    result names the limit though the shell went on after it (the watcher kills it, or
    the last count after it ended finds the limit reached)."""
    result = await box.run(
        ["bash", "-c", "head -c 96M /dev/zero > big; echo WROTE $?"],
        workspace=tmp_path,
        env=ENV,
        limits=_limits(),
    )
    assert result.limit == "disk", result
    assert (tmp_path / "big").stat().st_size <= BOUND
    assert "disk" in result.enforcement


async def test_many_files_each_under_the_limit_are_stopped(box: Sandbox, tmp_path: Path) -> None:
    """No single file reaches the limit, so RLIMIT_FSIZE never fires: the watcher counts
    them together, some in a directory made (and renamed) while the command runs."""
    command = (
        "mkdir -p made/deeper && mv made moved && "  # its watch now names moved/: counted
        "for i in $(seq 400); do where=.; [ $((i % 2)) = 1 ] && where=moved/deeper; "
        "head -c 256K /dev/zero > $where/f$i; done; echo all written"
    )
    result = await box.run(["bash", "-c", command], workspace=tmp_path, env=ENV, limits=_limits())
    assert result.limit == "disk", result
    assert b"all written" not in result.output
    assert LIMIT <= _written(tmp_path) <= BOUND
    assert len(list((tmp_path / "moved" / "deeper").iterdir())) > 10  # counted there too


@pytest.mark.parametrize(
    "command",
    [
        pytest.param("head -c 96M /dev/zero > /tmp/big; echo WROTE", id="one-file"),
        pytest.param(
            "for i in $(seq 100); do head -c 1M /dev/zero > /tmp/f$i || break; done; echo WROTE",
            id="many-files",
        ),
        pytest.param(
            "head -c 20M /dev/zero > here; head -c 20M /dev/zero > /tmp/there; echo WROTE",
            id="workspace-and-tmp",
        ),
    ],
)
async def test_the_private_tmp_counts_too(tmp_path: Path, command: str) -> None:
    """/tmp is a tmpfs of the limit's size (it cannot grow past it), and what it holds is
    added to what the workspace gained: 20 MiB in each is over 32 MiB."""
    result = await BubblewrapSandbox().run(
        ["bash", "-c", command], workspace=tmp_path, env=ENV, limits=_limits()
    )
    assert result.limit == "disk", result
    assert _written(tmp_path) <= BOUND


async def test_a_command_under_the_limit_is_unaffected(box: Sandbox, tmp_path: Path) -> None:
    """Files that were there before count only by what they grow: a workspace holding
    more than the limit already is no obstacle, nor is a rewrite of the same size."""
    (tmp_path / "data.bin").write_bytes(b"\1" * (LIMIT + MiB))
    (tmp_path / "notes.txt").write_bytes(b"a" * MiB)
    command = (
        "head -c 10M /dev/zero > new.bin && head -c 4M /dev/zero >> data.bin && "
        "head -c 1M /dev/zero > notes.txt && head -c 8M /dev/zero > /tmp/scratch && "
        "rm new.bin && head -c 10M /dev/zero > again.bin && echo fine"
    )
    result = await box.run(["bash", "-c", command], workspace=tmp_path, env=ENV, limits=_limits())
    assert result.ok and result.limit is None, result
    assert result.output == b"fine\n"
    assert (tmp_path / "data.bin").stat().st_size == LIMIT + 5 * MiB
    assert (tmp_path / "again.bin").stat().st_size == 10 * MiB


async def test_lodgers_hidden_paths_do_not_count(tmp_path: Path) -> None:
    """The state directory inside the workspace (hidden from the command) is lodger's
    own: what lodger writes there while a command runs is not the command's."""
    state = tmp_path / ".lodger"
    state.mkdir()
    watch = DiskWatch(tmp_path, limit=LIMIT, exclude=[state], private_tmp=False)
    watch.prepare()
    try:
        (state / "log.db").write_bytes(b"x" * (LIMIT + MiB))
        (tmp_path / "mine").write_bytes(b"y" * MiB)
        watch.look()
    finally:
        watch.close()
    assert (watch.written, watch.over) == (MiB, False)


async def test_a_watcher_out_of_watches_counts_by_walking(tmp_path: Path) -> None:
    """Where inotify cannot watch (its limit reached, events lost), the whole workspace
    is walked instead: the limit still holds."""
    (tmp_path / "old").write_bytes(b"o" * MiB)
    watch = DiskWatch(tmp_path, limit=LIMIT, private_tmp=False)
    watch.prepare()
    assert watch._sizes is not None
    watch._sizes.walking = True  # as when out of watches
    try:
        (tmp_path / "sub").mkdir()
        for i in range(40):
            (tmp_path / "sub" / f"f{i}").write_bytes(b"z" * MiB)
        (tmp_path / "old").unlink()
        watch.look()
    finally:
        watch.close()
    assert watch.written == 40 * MiB and watch.over


def test_disk_mb_is_read_from_the_sandbox_table() -> None:
    assert SandboxPolicy().limits.disk_bytes == 1024 * MiB  # the default
    assert policy_from_config({"disk_mb": 64}).limits.disk_bytes == 64 * MiB
    assert "disk 64MiB" in policy_from_config({"disk_mb": 64}).describe()
    for bad in (0, -1, "big", True, float("nan")):
        with pytest.raises(Exception, match="disk_mb"):
            policy_from_config({"disk_mb": bad})


@pytest.mark.parametrize(("asked", "applied"), [(64, 64 * MiB), (99999, 1024 * MiB)])
def test_an_untrusted_lodger_toml_may_lower_the_disk_limit_not_raise_it(
    tmp_path: Path, asked: int, applied: int
) -> None:
    (tmp_path / "lodger.toml").write_text(f"[sandbox]\ndisk_mb = {asked}\n")
    untrusted = Project.load(tmp_path, trusted=False)
    assert untrusted.sandbox is not None
    assert untrusted.sandbox.limits.disk_bytes == applied
    assert ("disk_bytes" in "; ".join(untrusted.ignored)) == (asked > 1024)
    trusted = Project.load(tmp_path, trusted=True)
    assert trusted.sandbox is not None and trusted.sandbox.limits.disk_bytes == asked * MiB


async def test_the_project_disk_limit_stops_the_shell_tool(tmp_path: Path) -> None:
    """End to end through the shell tool: a lodger.toml's disk_mb is what stops it, and
    the model is told which limit."""
    (tmp_path / "lodger.toml").write_text("[sandbox]\ndisk_mb = 8\n")
    policy = Project.load(tmp_path, trusted=False).sandbox
    assert policy is not None
    ctx = ToolContext(
        session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o",
        workspace=tmp_path, hidden=(),
    )  # fmt: skip
    out = await shell_tool(policy).handler(
        {"command": "head -c 64M /dev/zero > big; echo WROTE"}, ctx
    )
    assert isinstance(out, ToolOutput) and out.is_error, out
    assert "[stopped: disk limit reached" in out.content, out.content
    assert (tmp_path / "big").stat().st_size <= 8 * MiB * 11 // 10

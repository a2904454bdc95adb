"""The walk for private configuration entries is kept only while nothing there changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lodger.substrates.sandbox import _private
from lodger.substrates.sandbox._private import PrivateEntries


@pytest.fixture
def root(tmp_path: Path) -> Path:
    etc = tmp_path / "etc"
    (etc / "ssl" / "certs").mkdir(parents=True)
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (etc / "ssl" / "certs" / "ca.pem").write_text("cert")
    secret = etc / "ssl" / "key.pem"
    secret.write_text("key")
    secret.chmod(0o600)
    return etc


def test_the_walk_is_kept_while_nothing_changes(root: Path) -> None:
    entries = PrivateEntries([str(root)])
    first = entries.get()
    assert first == [str(root / "ssl" / "key.pem")]
    assert entries.get() == first
    assert entries.walks == 1


@pytest.mark.parametrize(
    "change",
    ["chmod_file", "chmod_dir", "create_private", "rename_dir", "opened"],
)
def test_a_change_under_the_roots_is_seen_by_the_next_command(root: Path, change: str) -> None:
    entries = PrivateEntries([str(root)])
    assert entries.get() == [str(root / "ssl" / "key.pem")]
    certs = root / "ssl" / "certs"
    if change == "chmod_file":
        (root / "hosts").chmod(0o640)
        expected = {root / "hosts", root / "ssl" / "key.pem"}
    elif change == "chmod_dir":
        certs.chmod(0o700)
        expected = {certs, root / "ssl" / "key.pem"}
    elif change == "create_private":
        fd = os.open(certs / "new.key", os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
        expected = {certs / "new.key", root / "ssl" / "key.pem"}
    elif change == "rename_dir":
        (root / "ssl").rename(root / "tls")
        expected = {root / "tls" / "key.pem"}
    else:  # a private file handed to another group and opened to it: no longer private
        (root / "ssl" / "key.pem").chmod(0o644)
        expected = set()
    assert {Path(p) for p in entries.get()} == expected
    assert entries.walks == 2
    assert {Path(p) for p in entries.get()} == expected  # and kept again
    assert entries.walks == 2


def test_without_inotify_every_command_walks(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_private, "_LIBC", None)
    entries = PrivateEntries([str(root)])
    for _ in range(3):
        assert entries.get() == [str(root / "ssl" / "key.pem")]
    assert entries.walks == 3


def test_a_forked_child_walks_for_itself(root: Path) -> None:
    entries = PrivateEntries([str(root)])
    entries.get()
    pid = os.fork()
    if pid == 0:  # the child: its copy of the parent's watch is not its own
        try:
            entries.get()
            os._exit(0 if entries.walks == 2 else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    entries.get()
    assert entries.walks == 1  # the parent's is still good

"""Fixtures for the authority suites: a real directory tree with aliases."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A real tree: a.txt, sub/b.txt, link-to-a -> a.txt, dir-link -> sub."""
    base = (tmp_path / "w").resolve()
    (base / "sub").mkdir(parents=True)
    (base / "a.txt").write_text("a\n")
    (base / "sub" / "b.txt").write_text("b\n")
    (base / "link-to-a").symlink_to(base / "a.txt")
    (base / "dir-link").symlink_to(base / "sub", target_is_directory=True)
    return base

"""Fixtures for the workspace tools: a real workspace directory and a real directory outside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from lodger.tools.spec import ToolContext


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """The workspace root, as its real path."""
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace holding a file no tool may reach."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "secret.txt").write_text("TOP SECRET\n")
    return directory.resolve()


@pytest.fixture
def ctx(ws: Path) -> ToolContext:
    return ToolContext(
        session_id="s-1",
        turn_id="t-1",
        run_id="r-1",
        call_id="c-1",
        operation_id="o-1",
        workspace=ws,
    )

"""Fixtures of the browser tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def gates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Files the host tests' ``gate`` and ``charge`` tools wait for."""
    root = tmp_path / "gates"
    root.mkdir()
    monkeypatch.setenv("HOST_TEST_GATES", str(root))
    return root

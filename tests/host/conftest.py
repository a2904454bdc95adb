"""Fixtures of the host tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def gates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "gates"
    root.mkdir()
    monkeypatch.setenv("HOST_TEST_GATES", str(root))
    return root

"""Fixtures of the host tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lodger.testing.postgres import PostgresServer


@pytest.fixture
def gates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "gates"
    root.mkdir()
    monkeypatch.setenv("HOST_TEST_GATES", str(root))
    return root


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for one test module (the distributed-mode tests)."""
    server = PostgresServer()
    try:
        server.init()
        yield server
    finally:
        server.destroy()

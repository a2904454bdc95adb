"""Every log backend through the one conformance suite (``conformance.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lodger.testing.log_conformance import (
    LogBackend,
    LogConformance,
    MemoryBackend,
    SqliteBackend,
    TamperConformance,
)


@pytest.fixture(params=["memory", "sqlite"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LogBackend]:
    chosen: LogBackend = (
        MemoryBackend() if request.param == "memory" else SqliteBackend(tmp_path / "state")
    )
    yield chosen
    await chosen.aclose()


class TestLogBackends(LogConformance):
    pass


class TestTamperedLogs(TamperConformance):
    pass

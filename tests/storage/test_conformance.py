"""Every log backend through the one conformance suite (``conformance.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lodger.storage.objectstore import open_object_store
from lodger.testing.log_conformance import (
    LogBackend,
    LogConformance,
    MemoryBackend,
    ObjectStoreBackend,
    SqliteBackend,
    TamperConformance,
)

from ._s3server import S3Server


# the S3 server (moto) is the slowest backend: the fast lane leaves it to the full run
@pytest.fixture(
    params=["memory", "sqlite", "objects-file", pytest.param("objects-s3", marks=pytest.mark.slow)]
)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LogBackend]:
    chosen: LogBackend
    if request.param == "memory":
        chosen = MemoryBackend()
    elif request.param == "sqlite":
        chosen = SqliteBackend(tmp_path / "state")
    elif request.param == "objects-file":
        url = f"file://{tmp_path / 'objects'}"
        chosen = ObjectStoreBackend(lambda: open_object_store(url).store)
    else:
        server: S3Server = request.getfixturevalue("s3")
        url = server.url()
        chosen = ObjectStoreBackend(lambda: open_object_store(url).store)
    yield chosen
    await chosen.aclose()


class TestLogBackends(LogConformance):
    pass


class TestTamperedLogs(TamperConformance):
    pass

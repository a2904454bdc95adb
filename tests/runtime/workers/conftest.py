"""Fixtures: one real PostgreSQL server per test session, a fresh database per test, and
``plane``: a started SQL control plane, once on SQLite and once on PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from lodger.storage.control import SqliteControlPlane
from lodger.storage.control._sql import SqlControlPlane
from lodger.storage.control.postgres import PostgresControlPlane
from lodger.testing.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.init()
        yield server
    finally:
        server.destroy()


@pytest.fixture(params=["sqlite", "postgres"])
async def plane(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqlControlPlane]:
    control: SqlControlPlane
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres")
        control = PostgresControlPlane(server.new_database())
    else:
        control = SqliteControlPlane(tmp_path / "control.sqlite3")
    await control.start()
    try:
        yield control
    finally:
        await control.close()

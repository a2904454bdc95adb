"""Both control planes through the one conformance suite, PostgreSQL on a real server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lodger.storage.control import ControlPlane, SqliteControlPlane
from lodger.storage.control.postgres import PostgresControlPlane
from lodger.testing.control_conformance import ControlConformance, MakeControl
from lodger.testing.postgres import PostgresServer


@pytest.fixture(params=["sqlite", "postgres"])
async def make_control(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[MakeControl]:
    made: list[ControlPlane] = []
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres")
        dsn = server.new_database()

    async def make() -> ControlPlane:
        control: ControlPlane
        if request.param == "postgres":
            control = PostgresControlPlane(dsn)
        else:
            control = SqliteControlPlane(tmp_path / "control.sqlite3")
        made.append(control)
        await control.start()
        return control

    yield make
    for control in made:
        await control.close()


class TestControlPlanes(ControlConformance):
    pass

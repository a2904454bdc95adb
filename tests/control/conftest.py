"""Fixtures: one real PostgreSQL server per test session, a fresh database per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lodger.testing.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.init()
        yield server
    finally:
        server.destroy()

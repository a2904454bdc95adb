"""Fixtures shared by the storage tests: a real S3-compatible server on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ._s3server import CREDENTIALS, S3Server, running_s3_server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with running_s3_server() as server:
        yield server


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server, with its credentials in the environment (as AWS tools read them)."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    return s3_server

"""``SESSION`` on the command line: a full id is confirmed with one lookup, and what the
listing decided before is decided the same way (an exact id before a longer one it is a
prefix of, a unique prefix, an ambiguous one refused, an unknown or invalid value passed on
for the command to report)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lodger.cli._common import resolve_session
from lodger.errors import UsageError
from lodger.storage import EventLog, SqliteLogStore
from lodger.testing.log_conformance import seed


@pytest.fixture
def state(tmp_path: Path) -> Path:
    async def make() -> None:
        log = EventLog(SqliteLogStore(tmp_path))
        try:
            for sid in ("s1", "s10", "t-7"):
                await seed(log, sid, 3)
        finally:
            await log.close()

    asyncio.run(make())
    return tmp_path


def test_a_full_id_names_itself_before_a_longer_id_it_begins(state: Path) -> None:
    assert resolve_session(str(state), "s1") == "s1"
    assert resolve_session(str(state), "s10") == "s10"
    assert resolve_session(str(state), "t") == "t-7"  # a unique prefix


def test_an_ambiguous_prefix_is_refused(state: Path) -> None:
    with pytest.raises(UsageError) as caught:
        resolve_session(str(state), "s")
    assert caught.value.code == "ambiguous_session"


@pytest.mark.parametrize("value", ["nope", "../etc", "a b"])
def test_an_unknown_or_invalid_value_is_passed_on(state: Path, value: str) -> None:
    assert resolve_session(str(state), value) == value


def test_an_empty_state_passes_the_value_on(tmp_path: Path) -> None:
    assert resolve_session(str(tmp_path / "none"), "s1") == "s1"

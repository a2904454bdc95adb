"""The sessions service: what the CLI and a host do with sessions, over one Storage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lodger.errors import CommitFailedError
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import EventLog, MemoryArtifactStore, Record, SqliteLogStore, Storage
from lodger.testing import FaultyLogStore
from lodger.tools import tool


@tool(recovery="idempotent")
def lookup(key: str) -> str:
    """Look a key up (safe to repeat)."""
    return key.upper()


class CountingStore(FaultyLogStore):
    def __init__(self, inner: Any, **kw: Any) -> None:
        super().__init__(inner, **kw)
        self.records_read = 0

    async def read_records(self, *, session_id: str, start: int, end: int | None) -> list[Record]:
        records = await super().read_records(session_id=session_id, start=start, end=end)
        self.records_read += len(records)
        return records


def crash_on_t2(records: list[Record]) -> bool:
    return any(b'"kind":"tool_responded"' in r.data for r in records)


SCRIPT = [{"calls": [{"name": "lookup", "args": {"key": "k"}}]}, {"text": "done"}]


async def test_resume_after_reading_defaults_reads_the_log_once(tmp_path: Path) -> None:
    crashing = Storage(
        log=EventLog(FaultyLogStore(SqliteLogStore(tmp_path), fail_when=crash_on_t2)),
        artifacts=MemoryArtifactStore(),
    )
    async with Sessions(crashing) as first:
        with pytest.raises(CommitFailedError):
            await first.run(
                "go", binding=Binding(model=ScriptedModel(SCRIPT), tools=[lookup]), session="s1"
            )

    store = CountingStore(SqliteLogStore(tmp_path))
    async with Sessions(Storage(log=EventLog(store), artifacts=MemoryArtifactStore())) as sessions:
        defaults = await sessions.defaults("s1")
        assert defaults.model == "script:inline"
        length = store.records_read
        assert length > 5
        result = await sessions.resume(
            "s1", binding=Binding(model=ScriptedModel(SCRIPT), tools=[lookup])
        )
        assert result.status == "completed" and result.answer == "done"
        # the resume read only the last known event (to check the chain continues)
        assert store.records_read == length + 1


def test_the_fold_cache_keeps_the_most_recently_used_sessions() -> None:
    from lodger.engine.state import SessionState
    from lodger.runtime.sessions import FoldCache

    cache = FoldCache(max_sessions=2)
    a, b, c = SessionState("a"), SessionState("b"), SessionState("c")
    cache["a"], cache["b"] = a, b
    assert cache["a"] is a  # touching a makes b the oldest
    cache["c"] = c
    assert set(cache) == {"a", "c"}
    assert cache.get("b") is None
    with pytest.raises(ValueError, match="at least 1"):
        FoldCache(max_sessions=0)

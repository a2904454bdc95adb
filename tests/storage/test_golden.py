"""Golden logs: logs written by earlier lodger versions must stay readable (DESIGN L3).

Each ``tests/data/golden/v<schema>_<name>.jsonl`` holds one stored record per line:
``{"offset": int, "data": "<canonical event JSON>", "digest": "<hex>"}``. Never edit
one; when the schema changes or a kind is added, add a new file next to the old ones.
"""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest

from lodger.events import SCHEMA_VERSION, Body, Event
from lodger.storage import EventLog, MemoryLogStore, Record

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "data" / "golden"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.jsonl"))
NAME = re.compile(r"^v(\d+)_[a-z0-9_]+\.jsonl$")


def load(path: Path) -> list[Record]:
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        assert set(row) == {"offset", "data", "digest"}, path.name
        records.append(Record(row["offset"], row["data"].encode("utf-8"), row["digest"]))
    return records


async def replay(path: Path) -> tuple[str, list[Record], list[Event], EventLog]:
    records = load(path)
    session_id = json.loads(records[0].data)["session_id"]
    log = EventLog(MemoryLogStore())
    await log.store.append_records(session_id=session_id, records=records, expected_offset=0)
    return session_id, records, await log.read(session_id), log


def body_kinds() -> set[str]:
    (union, _field) = typing.get_args(Body)
    return {cls.model_fields["kind"].default for cls in typing.get_args(union)}


def test_there_are_golden_logs_for_every_schema_version() -> None:
    versions = set()
    for path in GOLDEN_FILES:
        match = NAME.match(path.name)
        assert match, f"{path.name} should be named v<schema>_<name>.jsonl"
        versions.add(int(match.group(1)))
    assert versions == set(range(1, SCHEMA_VERSION + 1))


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[p.name for p in GOLDEN_FILES])
async def test_golden_log_verifies_and_decodes(path: Path) -> None:
    session_id, records, events, log = await replay(path)
    head = await log.verify(session_id)
    assert head.high_water == len(records) == len(events)
    assert head.digest == records[-1].digest
    assert [r.offset for r in records] == list(range(len(records)))
    version = int(NAME.match(path.name).group(1))  # type: ignore[union-attr]
    for event, record in zip(events, records, strict=True):
        assert event.v == version
        assert event.offset == record.offset
        assert event.digest == record.digest
        assert event.kind == json.loads(record.data)["body"]["kind"]


async def test_every_kind_appears_in_a_golden_log() -> None:
    seen: set[str] = set()
    for path in GOLDEN_FILES:
        _, _, events, _ = await replay(path)
        seen |= {event.kind for event in events}
    missing = body_kinds() - seen
    assert not missing, f"add a golden log (tests/data/golden) that contains {sorted(missing)}"

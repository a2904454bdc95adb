"""Golden logs: logs written by earlier lodger versions must stay readable (DESIGN L3).

Each ``tests/data/golden/v<schema>_<name>.jsonl`` holds one stored record per line:
``{"offset": int, "data": "<canonical event JSON>", "digest": "<hex>"}``. Never edit
one; when the schema changes or a kind is added, add a new file next to the old ones.
Keyed goldens (``*_keyed_*``) are chained under ``GOLDEN_KEY``; every golden is read with
that key configured, which a plain log must not mind.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import typing
from pathlib import Path

import pytest

from lodger.errors import LogKeyError
from lodger.events import HMAC_DIGEST_DOMAIN, SCHEMA_VERSION, Body, Event
from lodger.storage import EventLog, LogKey, MemoryLogStore, Record

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "data" / "golden"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.jsonl"))
NAME = re.compile(r"^v(\d+)_[a-z0-9_]+\.jsonl$")
GOLDEN_SECRET = bytes(range(32))
GOLDEN_KEY = LogKey(GOLDEN_SECRET)
KEYED_GOLDEN = GOLDEN_DIR / "v3_keyed_chain.jsonl"


def load(path: Path) -> list[Record]:
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        assert set(row) == {"offset", "data", "digest"}, path.name
        records.append(Record(row["offset"], row["data"].encode("utf-8"), row["digest"]))
    return records


async def replay(
    path: Path, key: LogKey | None = GOLDEN_KEY
) -> tuple[str, list[Record], list[Event], EventLog]:
    records = load(path)
    session_id = json.loads(records[0].data)["session_id"]
    log = EventLog(MemoryLogStore(), key=key)
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


async def test_keyed_golden_is_keyed_and_plain_goldens_are_not() -> None:
    for path in GOLDEN_FILES:
        session_id, _, events, log = await replay(path)
        chain = await log.chain(session_id)
        keyed = "_keyed_" in path.name
        assert chain.keyed is keyed, path.name
        assert chain.kind == ("hmac-sha256" if keyed else "sha256")
        assert chain.key_id == (GOLDEN_KEY.key_id if keyed else None)
        assert events[0].kind == "session_started"


def test_keyed_golden_digests_follow_the_documented_formula() -> None:
    """Computed with hmac and hashlib alone: the keyed chain is what the docs say it is."""
    prev = b""
    records = load(KEYED_GOLDEN)
    key_id = hashlib.sha256(GOLDEN_SECRET).digest()[:8].hex()
    assert json.loads(records[0].data)["body"]["key_id"] == key_id
    for record in records:
        expected = hmac.new(GOLDEN_SECRET, HMAC_DIGEST_DOMAIN + prev + record.data, "sha256")
        assert record.digest == expected.hexdigest(), record.offset
        prev = bytes.fromhex(record.digest)


async def test_keyed_golden_without_its_key_fails_closed() -> None:
    with pytest.raises(LogKeyError) as missing:
        await replay(KEYED_GOLDEN, key=None)
    assert (missing.value.code, missing.value.offset) == ("key_required", 0)
    assert missing.value.expected_key_id == GOLDEN_KEY.key_id

    other = LogKey(b"another key, 32 bytes long......")
    with pytest.raises(LogKeyError) as wrong:
        await replay(KEYED_GOLDEN, key=other)
    assert (wrong.value.code, wrong.value.offset) == ("wrong_key", 0)
    assert GOLDEN_KEY.key_id in wrong.value.message
    assert other.key_id in wrong.value.message


async def test_who_decided_is_absent_from_older_logs_and_kept_in_newer_ones() -> None:
    """Schema 7's ``permission_decided.who``: a v6 log decodes without it (None)."""
    _, _, old, _ = await replay(GOLDEN_DIR / "v6_parked_approval.jsonl")
    _, _, new, _ = await replay(GOLDEN_DIR / "v7_decided_by.jsonl")
    decided = "permission_decided"
    assert {e.body.who for e in old if e.kind == decided} == {None}  # type: ignore[union-attr]
    assert [e.body.who for e in new if e.kind == decided] == [  # type: ignore[union-attr]
        "rule 'echo'",
        "cli:golden",
    ]


async def test_schema_8_facts_decode_and_older_usage_has_no_cache_tokens() -> None:
    """Schema 8: settings, attachments, cache tokens, fallback switches, budgets."""
    _, _, events, log = await replay(GOLDEN_DIR / "v8_request.jsonl")
    await log.verify(events[0].session_id)
    bodies = [e.body for e in events]
    started = next(b for b in bodies if b.kind == "turn_started")
    assert [a.name for a in started.attachments] == ["dot.png"]  # type: ignore[union-attr]
    steps = [b for b in bodies if b.kind == "step_started"]
    assert {json.dumps(b.settings) for b in steps} == {  # type: ignore[union-attr]
        '{"max_tokens": 256, "temperature": 0.5}'
    }
    switched = [b for b in bodies if b.kind == "model_switched"]
    assert {(b.from_model, b.to_model) for b in switched} == {  # type: ignore[union-attr]
        ("function:primary", "function:backup")
    }
    usage = [b.usage for b in bodies if b.kind == "model_output"]  # type: ignore[union-attr]
    assert {(u.cache_read_tokens, u.cache_write_tokens) for u in usage} == {(96, 8)}
    reached = next(b for b in bodies if b.kind == "budget_reached")
    assert (reached.budget, reached.limit, reached.unit) == ("requests", 0, "requests")  # type: ignore[union-attr]
    _, _, old, _ = await replay(GOLDEN_DIR / "v7_decided_by.jsonl")
    old_usage = [e.body.usage for e in old if e.kind == "model_output" and e.body.usage]  # type: ignore[union-attr]
    assert {(u.cache_read_tokens, u.cache_write_tokens) for u in old_usage} <= {(0, 0)}
    assert all(e.body.settings is None for e in old if e.kind == "step_started")  # type: ignore[union-attr]


async def test_schema_9_control_facts_decode_in_order() -> None:
    """Schema 9: compaction, steering, the queue, cancel, modes, checkpoints, rewind."""
    _, _, events, log = await replay(GOLDEN_DIR / "v9_control.jsonl")
    await log.verify(events[0].session_id)
    bodies = {e.kind: e.body for e in events}
    compacted = bodies["compacted"]
    assert compacted.covers.high_water == 1 and compacted.dropped_call_ids == ("c1",)  # type: ignore[union-attr]
    assert compacted.usage.input_tokens == 150  # type: ignore[union-attr]
    assert bodies["compaction_failed"].attempts == 2  # type: ignore[union-attr]
    assert bodies["steer_delivered"].steer_ids == ("st1",)  # type: ignore[union-attr]
    assert bodies["queue_changed"].text == "then run all tests"  # type: ignore[union-attr]
    assert bodies["permission_mode_changed"].mode == "accept_edits"  # type: ignore[union-attr]
    assert bodies["rewound"].left.session_id == "golden-v9-left"  # type: ignore[union-attr]
    kinds = [e.kind for e in events]
    assert kinds.index("steer_received") < kinds.index("steer_delivered")
    assert kinds[-3:] == ["run_ended", "turn_ended", "rewound"]


async def test_schema_10_extension_facts_decode_in_order() -> None:
    """Schema 10: MCP elicitation, sampling and tool-list changes; replay and eval facts."""
    _, _, events, log = await replay(GOLDEN_DIR / "v10_extensions.jsonl")
    await log.verify(events[0].session_id)
    bodies = {e.kind: e.body for e in events}
    asked = bodies["elicitation_requested"]
    assert asked.requested_schema["required"] == ["repo"]  # type: ignore[union-attr]
    answered = bodies["elicitation_answered"]
    assert answered.content == {"repo": "acme/web"} and answered.withheld == ("token",)  # type: ignore[union-attr]
    assert bodies["sampling_requested"].decision == "allow"  # type: ignore[union-attr]
    assert bodies["sampling_answered"].usage.output_tokens == 6  # type: ignore[union-attr]
    assert bodies["tools_changed"].unusable == ("tracker__broken",)  # type: ignore[union-attr]
    assert bodies["replay_started"].source_offset == 12  # type: ignore[union-attr]
    assert bodies["call_replayed"].source == "recorded"  # type: ignore[union-attr]
    assert bodies["eval_scored"].score == 0.75  # type: ignore[union-attr]
    kinds = [e.kind for e in events]
    assert kinds.index("elicitation_requested") < kinds.index("elicitation_answered")
    assert kinds.index("call_replayed") < kinds.index(
        "tool_responded", kinds.index("call_replayed")
    )
